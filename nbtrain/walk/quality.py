"""Faster means the same model sooner (rule 11): a candidate that alters what is learned is raced for quality.

A candidate that changes the math (the global batch, a learning-rate rule, accumulation, precision, a warm-up,
clipping) can be faster per sample and learn worse per second: a batch 16x larger takes 16x fewer steps for the
same samples. So once a race has shown such a candidate faster, it races the current config again, for what
each learns: both train from the same weights (the bench's reset point) on the same data (the same seed and
order) for the same wall time, `QUALITY_ROUNDS` times, in turn, and each is scored by its loss on held-out data
(the user's val_data; where none was given, the bench says what it scored on). The candidate is kept unless its
losses are measurably worse (a paired verdict over the rounds, as a race's rates are judged). A race this short
speaks for its horizon only (a higher rate can lose early and win later): every verdict says the seconds it
covers, and a longer walk budget lengthens them (`horizon_s`). A race in which neither side's held-out loss left the
starting weights' cannot tell a config that learns nothing from one that has not learned yet: it is raced again at
twice the horizon while the budget allows, and where neither learns even then, it says so and nothing that changes
the math is kept on it.
"""
from __future__ import annotations

from ..measure.learned import QUALITY_ROUNDS, Quality, alters_learning, equal_time_rounds

_HORIZON_BLOCKS = 1  # each side trains for at least one race block's time, a sixth of a trial (0.5 s at most) ...
_HORIZON_SHARE = 120  # ... or this share of the walk's budget, if longer (1 s at 120 s, 5 s at 600 s): the race
# blocks stop growing at 3 s trials, and a longer budget must still race a longer horizon
_LENGTHENINGS = 3  # times a race in which neither side learned is raced again at twice the horizon (8x at most)
_ALTERNATES = 2  # other candidates faster than the current config raced for quality once the leader learned worse


def horizon_s(walk) -> float:
    """Seconds each side of a race of what is learned trains: longer with the walk's budget."""
    return max(_HORIZON_BLOCKS * walk.block_s, walk.budget_s / _HORIZON_SHARE)


def quality_cost(walk, seconds: float | None = None) -> float:
    """Seconds one race of what is learned takes (at `seconds` a side, default horizon_s), at the block and start-up
    costs the walk has seen."""
    seconds = horizon_s(walk) if seconds is None else seconds
    return QUALITY_ROUNDS * 2 * (seconds + walk.block_overhead_s) + walk.start_up_s


def race_quality(walk, config, current, reserved: bool = False) -> Quality:
    """`config` against `current`, each trained horizon_s from the same weights for QUALITY_ROUNDS rounds (order
    turning), scored on held-out data; an empty Quality with its note where the budget has no room (`reserved`: the
    walk's closing race, whose time was kept back: one that an item overran still runs, and the walk ends later).
    A first round in which neither side learned is raced again at twice the horizon while the budget has room."""
    seconds, cost = horizon_s(walk), quality_cost(walk)
    if walk.left() < cost and not reserved:
        return Quality(seconds=seconds, note=f"no time left for {QUALITY_ROUNDS} equal-time races "
                                             f"(about {cost:.0f} s, {max(walk.left(), 0):.0f} s left)")
    quality = equal_time_rounds(walk.bench.quality, config, current, seconds)
    for _ in range(_LENGTHENINGS):
        if not quality.unlearned or walk.left() < quality_cost(walk, 2 * quality.seconds):
            break
        quality = equal_time_rounds(walk.bench.quality, config, current, 2 * quality.seconds)
    if quality.seconds > seconds:
        quality.longer = f"raced from {seconds:.2g} s, doubled while neither side learned; {quality.longer}"
    return quality


def judged_by_learning(walk, tried: list, result, chosen, current, checked):
    """(result, chosen): the item's kept candidate once it has raced the current config for what it learns (a
    candidate that changes no math is the same model sooner, and keeps its speed verdict). Where the leader learns
    worse, up to _ALTERNATES other candidates the race showed faster are raced so, fastest first (a smaller batch
    that still gains: goodput, not throughput); `checked(config)` hands back a config as the walk would keep it
    (its learning rate checked). Not kept where none learns as well, or what they learn could not be measured."""
    if not alters_learning(chosen, current):
        return result, chosen
    leader = next(t for t in tried if t.label == result.chosen)
    others = sorted((t for t in tried if t is not leader and t.samples_per_s and t.verdict.ratio > 1 + walk.min_gain),
                    key=lambda t: -t.verdict.ratio)
    notes = []
    for t, config in [(leader, chosen)] + [(t, None) for t in others[:_ALTERNATES]]:
        config = config if config is not None else checked(t.config)
        quality = race_quality(walk, config, current)
        # A candidate the race left early (its speed screened, not shown) is kept only where it learns measurably
        # better in the same time: that race then shows what the speed race did not.
        shown = t.verdict.above(walk.min_gain) and t.verdict.paired and t.verdict.pairs >= QUALITY_ROUNDS
        if quality.measured and not quality.worse and (shown or quality.verdict.faster):
            note = "; ".join(notes + [f"{t.label} {quality.text()}"])
            result.chosen, result.compared, result.verdict, result.note = t.label, t.label, t.verdict, note
            result.after = t.samples_per_s
            return result, config
        notes.append(f"not kept: {t.label} {quality.text()}")
        if not quality.measured:
            break  # no time for another
    result.kept, result.chosen, result.after, result.note = False, "", result.before, "; ".join(notes)
    return result, None
