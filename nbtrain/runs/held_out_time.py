"""Which of two runs reaches a held-out loss sooner in wall time: the reading %nbtrain_compare gives beside
samples/s (rule 11). A change that alters what is learned (a batch size, a rate or its rule, accumulation,
precision) can be faster per sample and learn worse per second; samples/s alone would call it a win.

A run validates at steps (val_every_n_steps, or each epoch); each validation is placed at the training time of its
step (the log's step/time columns). Two runs are compared at the worse one's final held-out loss: the time each
first reached it, known only to within the validations around it (the one before it, still above, and the one at
or below). One run each gives no interval over runs: the ratio's range is what those brackets allow, and says so.
Where several compared runs share one settings (repeats.same_settings), the range spans every repeat of each side.
"""
from __future__ import annotations

import math

import numpy as np

from ..format import number
from ..measure.learned import reached
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
    span = f"{low:.2g}-{high:.2g}x" if math.isfinite(high) else f"{low:.2g}x or more"
    if repeat:
        head, span = (f"same settings as {base_label}, so no verdict",
                      f"{base_label}'s time over this one's {span}: the machine's spread, not a difference of settings")
    elif low > 1 + MIN_EFFECT:
        head, span = "learns faster in wall time", f"{span} sooner"
    elif high < 1 / (1 + MIN_EFFECT):
        head, span = "learns slower in wall time", (f"{1 / high:.2g}-{1 / low:.2g}x later" if low > 0
                                                    else f"{1 / high:.2g}x or more later")
    else:
        head, span = "no measurable difference in wall time", f"{base_label}'s time over this one's {span}"
    if len(sides[0]) == len(sides[1]) == 1:
        brackets = " vs ".join(f"{t[0]:.2g}-{t[1]:.2g} s" for t in (mine[0], theirs[0]))
        how = (f"one run each, so no interval over runs: each time known only to within the validations around it "
               f"({brackets}): {span}")
    else:
        how = (f"{span} over {len(sides[1])} and {len(sides[0])} runs of each settings, each time to within the "
               f"validations around it")
    medians = " (medians)" if len(sides[0]) > 1 or len(sides[1]) > 1 else ""
    return (f"held-out {number(target)} in {number(at[0], ' s')} vs {number(at[1], ' s')} for {base_label}{medians}: "
            f"{head} ({how})")
