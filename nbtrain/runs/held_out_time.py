"""Which of two runs reaches a held-out loss sooner in wall time: the reading %nbtrain_compare gives beside
samples/s (rule 11). A change that alters what is learned (a batch size, a rate or its rule, accumulation,
precision) can be faster per sample and learn worse per second; samples/s alone would call it a win.

A run validates at steps (val_every_n_steps, or each epoch); each validation is placed at the training time of its
step (the log's step/time columns). Two runs are compared at the worse one's final held-out loss: the time each
first reached it. One run each gives no interval, and a time is known to the nearest validation: both are said.
"""
from __future__ import annotations

import numpy as np

from ..format import number
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


def learned_in_time(base, run, base_label: str = "first") -> str:
    """'held-out 0.412 in 3.1 s vs 7.9 s for first: learns faster in wall time (one run each, to the nearest
    validation; no interval)', or '-' where either run has no held-out loss."""
    (_, base_losses), (_, losses) = held_out_against_time(base), held_out_against_time(run)
    if not base_losses or not losses:
        return "-"
    target = max(base_losses[-1], losses[-1])  # the worse side's final loss: both reached it
    mine, theirs = time_to_held_out(run, target), time_to_held_out(base, target)
    if mine == theirs:
        head = "as soon in wall time (at the same validation)"
    else:
        head = "learns faster in wall time" if mine < theirs else "learns slower in wall time"
    return (f"held-out {number(target)} in {number(mine, ' s')} vs {number(theirs, ' s')} for {base_label}: {head} "
            f"(one run each, to the nearest validation; no interval)")
