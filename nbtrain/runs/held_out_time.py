"""Which of two runs reaches a held-out loss sooner in wall time: the reading %nbtrain_compare gives beside
samples/s (rule 11). A change that alters what is learned (a batch size, a rate or its rule, accumulation,
precision) can be faster per sample and learn worse per second; samples/s alone would call it a win.

A run validates at steps (val_every_n_steps, or each epoch); each validation is placed at the training time of its
step (the log's step/time columns). Two runs are compared at the worse one's final held-out loss: the time each
first reached it, known only to within the validations around it (the one before it, still above, and the one at
or below). One run each gives no interval over runs: the ratio's range is what those brackets allow, and says so.
Where several compared runs share one settings (repeats.same_settings), the range spans every repeat of each side.
A run already at or below the target at its first validation got there anywhere between 0 s and that validation: a
ratio with its time has no bound on one side, so the reading says what is known in plain words (there by its first
validation, at T s; the other took T2-T3 s), and a direction only where the brackets part, by the bound they give
('at least 6x sooner'), as ab's time to quality does (measure/learned.py: Reaching.text).
"""
from __future__ import annotations

import math

import numpy as np

from ..format import number
from ..measure.learned import open_ratio, reached
from ..measure.verdict import MIN_EFFECT
from ..plotting import held_out_series


def held_out_against_time(run) -> tuple[list, list]:
    """(training seconds, held-out losses) of every validation of `run` (empty where it never validated)."""
    steps, losses = held_out_series(run.log).get("val_loss", ([], []))
    cols = run.history
    if not steps or not cols["step"]:
        return [], []
    return [float(t) for t in np.interp(steps, cols["step"], cols["time"])], [float(v) for v in losses]


def time_to_held_out(run, target: float) -> float | None:
    """Training seconds at the first validation whose held-out loss is at or below `target` (None: never)."""
    return next((t for t, v in zip(*held_out_against_time(run)) if v <= target), None)


def learned_in_time(base, run, base_label: str = "first", base_repeats=(), run_repeats=(), repeat=False) -> str:
    """'held-out 0.412 in 3.1 s vs 7.9 s for first: learns faster in wall time (one run each, ...: 2.3-3.0x sooner)',
    or '-' where either run has no held-out loss. `base_repeats` / `run_repeats`: the compared runs of each one's
    settings (each run itself included); where either holds more than one, the range is over them all. `repeat`:
    `run` has `base`'s settings, an A/A: what sets their times apart is the machine, never faster or slower."""
    sides = [[r for r in (group or [one]) if held_out_against_time(r)[1]] for group, one in
             ((base_repeats, base), (run_repeats, run))]
    if not all(sides) or not held_out_against_time(base)[1] or not held_out_against_time(run)[1]:
        return "-"
    target = max(held_out_against_time(r)[1][-1] for r in sides[0] + sides[1])  # the worse final: every run reached it
    theirs, mine = ([reached(list(zip(*held_out_against_time(r))), target) for r in side] for side in sides)
    low = min(t[0] for t in theirs) / max(m[1] for m in mine)
    high = max(t[1] for t in theirs) / min(m[0] for m in mine) if min(m[0] for m in mine) > 0 else math.inf
    at = [float(np.median([t[1] for t in side])) for side in (mine, theirs)]  # the validation at or below it
    if low <= 0 or not math.isfinite(high):  # a side there by its first validation: the ratio is open
        return _first_validation(target, at, base_label, mine, theirs, low, high, repeat)
    span = f"{low:.2g}-{high:.2g}x"
    if repeat:
        head, span = (f"same settings as {base_label}, so no verdict",
                      f"{base_label}'s time over this one's {span}: the machine's spread, not a difference of settings")
    elif low > 1 + MIN_EFFECT:
        head, span = "learns faster in wall time", f"{span} sooner"
    elif high < 1 / (1 + MIN_EFFECT):
        head, span = "learns slower in wall time", f"{1 / high:.2g}-{1 / low:.2g}x later"
    else:
        head, span = "no measurable difference in wall time", f"{base_label}'s time over this one's {span}"
    if len(sides[0]) == len(sides[1]) == 1:
        brackets = " vs ".join(f"{t[0]:.2g}-{t[1]:.2g} s" for t in (mine[0], theirs[0]))
        how = (f"one run each, so no interval over runs: each time known only to within the validations around it "
               f"({brackets}): {span}")
    else:
        how = (f"{span} over {len(sides[1])} and {len(sides[0])} runs of each settings, each time to within the "
               f"validations around it")
    return _reading(target, at, base_label, len(sides[0]) > 1 or len(sides[1]) > 1, head, how)


def _reading(target: float, at: list, base_label: str, medians: bool, head: str, how: str) -> str:
    return (f"held-out {number(target)} in {number(at[0], ' s')} vs {number(at[1], ' s')} for {base_label}"
            f"{' (medians)' if medians else ''}: {head} ({how})")


def _first_validation(target, at, base_label, mine, theirs, low, high, repeat) -> str:
    """The reading where a side was at the target by its first validation: its time lies anywhere between 0 and
    that validation's, so the ratio (`low`-`high`, base's time over this one's) is open on one side. What is known,
    in words; faster or slower only where the brackets part by more than MIN_EFFECT, by the bound they give."""
    known = f"{_when('this one', mine)}, {_when(base_label, theirs)}"
    way, words = open_ratio(low, high)
    if repeat:
        head, how = f"same settings as {base_label}, so no verdict", \
            f"{known}: the machine's spread, not a difference of settings"
    elif way:
        head, how = f"learns {'faster' if way > 0 else 'slower'} in wall time", f"{known}: {words}"
    else:
        head, how = "no measurable difference in wall time", f"{known}, {words}"
    several = len(mine) > 1 or len(theirs) > 1
    over = f"over {len(mine)} and {len(theirs)} runs of each settings" if several else \
        "one run each, so no interval over runs"
    return _reading(target, at, base_label, several, head, f"{over}: {how}")


def _when(who: str, brackets: list) -> str:
    """When `who` reached the target: 'slow took 3-4 s', 'quick was there by its first validation (at 0.5 s)', or
    over the runs of one settings 'the 2 runs of quick's settings took up to 1 s, 1 of them there by its first
    validation'."""
    low, high = min(b[0] for b in brackets), max(b[1] for b in brackets)
    if len(brackets) == 1:
        return f"{who} took {low:.2g}-{high:.2g} s" if low > 0 else \
            f"{who} was there by its first validation (at {high:.2g} s)"
    runs, first = f"the {len(brackets)} runs of {who}'s settings", sum(b[0] <= 0 for b in brackets)
    if not first:
        return f"{runs} took {low:.2g}-{high:.2g} s"
    if first == len(brackets):
        return f"{runs} were each there by their first validation (by {high:.2g} s)"
    return f"{runs} took up to {high:.2g} s, {first} of them there by its first validation"
