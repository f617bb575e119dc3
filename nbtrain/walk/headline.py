"""The checklist walk's headline: its choice measured against the start, head to head, at the end.

A walk keeps items one after another, each raced from the config kept before it, under the load of its
own moment; their ratios multiplied are no measurement of the whole (a walk's product read 7.17x where
`ab` of the same two configs measured 1.59x). So the walk ends with one more race, by the machinery its
items use (measure/race.py), of its choice against the start: that verdict, with its interval, is the
walk's headline (ChecklistResult.headline, the table's last row, the waterfall's last bar).
"""
from __future__ import annotations

from ..measure.learned import alters_learning
from .quality import quality_cost, race_quality

FINAL_ROUNDS = 3  # rounds the budget keeps for the final head-to-head: the fewest a race keeps a config on


def overrun_s(walk) -> float:
    """How far the items overran into the closing race's reserve, in seconds (negative; 0.0 where they left it
    whole), read with the walk back at its start. An item that overran (a block or a reading longer than its
    estimate) does not cost the headline its measurement: held back as this negative, the walk's time left is
    the race's reserve still, and the walk ends that much later."""
    return min(walk.left() - head_to_head_reserve(walk), 0.0)


def head_to_head(walk, start, chosen) -> tuple:
    """(the chosen config as raced against the start: a Tried with its verdict, the start's samples/s beside it,
    why it was not measured): a race on the walk's bench and clock from its current config, which its caller
    has set back to the start (with overrun_s held back)."""
    if chosen == start:
        return None, float("nan"), ""
    tried = walk.race([("the walk's choice", chosen)], judged=False)  # what it learns: run_walk, after this race
    if not tried or tried[0].samples_per_s is None:
        why = tried[0].note if tried else f"no time left ({max(walk.left(), 0):.1f} s)"
        return None, float("nan"), f"the walk's choice was not measured against the start head to head: {why}"
    return tried[0], walk.race_base, ""


def head_to_head_reserve(walk) -> float:
    """Seconds kept back from the items for the final head-to-head: FINAL_ROUNDS rounds of two blocks and the
    start-up of both configs (their workers, stopped when a race left them); and, where the config kept so far
    changes what is learned, the race of what it learns against the start's (quality.py)."""
    learning = quality_cost(walk) if alters_learning(walk.current, walk.start) else 0.0
    return FINAL_ROUNDS * 2 * walk.block_cost_s() + 2 * walk.start_up_s + learning


def unbacked(start, chosen, final, note: str) -> str:
    """Why the walk's choice is withdrawn ("" where its closing race backs it): the closing head-to-head backs
    everything kept (rule 11), so a choice that race did not show faster than the start, beyond its interval, is
    not kept at all, whatever the items' own races read (each was measured from another config, under another
    load); a choice the race could not measure is not backed either."""
    if chosen == start:
        return ""
    if final is None:
        return note or "the walk's choice was not measured against the start head to head"
    v = final.verdict
    if v.faster:
        return ""
    return f"the closing race of the walk's choice against the start read {v.text()}"


def backing(walk, start, chosen, final, note: str) -> tuple:
    """(why the walk's choice is withdrawn, '' where its closing race backs it; the race of what it learns against the
    start, None where not run): faster head to head (unbacked), and, where it changes what is learned, learning as
    well in the same time (quality.py), in the time the headline's reserve kept. What the user asked for
    (accumulation to their target) is no claim of the walk's: run_walk calls this only for a choice holding one of
    the walk's own keeps."""
    withdrawn = unbacked(start, chosen, final, note)
    if withdrawn or not alters_learning(chosen, start):
        return withdrawn, None
    learned = race_quality(walk, chosen, start, reserved=True)
    if learned.measured and not learned.worse:
        return "", learned
    return f"the walk's choice against the start: {learned.text()}", learned
