"""What each of two configs learns in the same wall time: the reading behind a verdict on a change that alters what
is learned (rule 11), the walk's (walk/quality.py) and nbtrain.ab's.

A change of the global batch, a learning-rate rule, accumulation, precision, a warm-up or clipping can be faster per
sample and learn worse per second. Both sides train from the same weights on the same data for the same wall time,
in turn, and are scored on held-out data (tools/equal_time.py); `Quality` holds their losses, its paired verdict and
the horizon it speaks for (a higher rate can lose early and win later).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .verdict import UNMEASURED, Verdict, paired

QUALITY_ROUNDS = 3  # pairs of equal-time trainings behind a verdict: the fewest a paired interval comes from
_OPTIONS = ("batch_size", "accumulate_grad_batches", "lr", "scale_lr", "base_batch_size", "warmup_steps",
            "precision", "gradient_clip_val")  # each changes the updates a step makes, or how many steps


def alters_learning(config, current) -> list:
    """The options of `config` that change what is learned from `current`'s (devices and nodes count where they
    change the global batch: more ranks at the same per-rank batch average more samples per step)."""
    changed = [name for name in config.changed_from(current) if name in _OPTIONS]
    if config.global_batch_size != current.global_batch_size and "batch_size" not in changed:
        changed.append("global batch")
    return changed


@dataclass
class Learned:
    """One side of one equal-time training: its score on held-out data, and what that data was."""
    loss: float
    held_out: str = "held-out"  # e.g. "held-out (val_data)" or what the bench scored on instead
    note: str = ""              # why no loss (it did not run)


@dataclass
class Quality:
    """A candidate's losses against the current config's, each trained `seconds` from the same weights."""
    current: list = field(default_factory=list)
    candidate: list = field(default_factory=list)
    seconds: float = 0.0
    held_out: str = "held-out"
    note: str = ""  # why it was not measured
    longer: str = "a longer budget races a longer horizon"  # how the user lengthens the horizon

    @property
    def verdict(self) -> Verdict:
        """The current config's loss over the candidate's, paired by round (> 1: the candidate learns better)."""
        return paired(self.candidate, self.current) if self.current else UNMEASURED

    @property
    def measured(self) -> bool:
        return math.isfinite(self.verdict.low)

    @property
    def worse(self) -> bool:
        """The candidate learns measurably worse in the same time, or diverged where the current did not."""
        if any(not math.isfinite(x) for x in self.candidate) and all(math.isfinite(x) for x in self.current):
            return True
        v = self.verdict
        return v.measurable and v.ratio < 1

    def horizon(self) -> str:
        n = len(self.current)
        return (f"{self.seconds:.2g} s of training each from the same weights, {n} time{'s' if n != 1 else ''}; "
                f"{self.longer}")

    def losses(self) -> str:
        cand, cur = np.median(self.candidate), np.median(self.current)
        return f"{self.held_out} {cand:.3g} vs {cur:.3g}"

    def text(self) -> str:
        if not self.measured:
            return f"what it learns was not measured: {self.note or 'too few equal-time races'}"
        v = self.verdict
        if self.worse:
            head = "learns worse in the same time"
        elif v.measurable:
            head = "learns better in the same time"
        else:
            head = "learns as well in the same time (no measurable difference in loss)"
        return f"{head} ({self.losses()}; {self.horizon()})"


def equal_time_rounds(quality, config, current, seconds: float, rounds: int = QUALITY_ROUNDS) -> Quality:
    """`config` against `current`, each trained `seconds` by `quality(config, seconds, current)` (a Bench's: from
    the same weights on the same data, scored on held-out data), `rounds` rounds with the order turning, so a load
    that drifts falls on both (the walk's race of what is learned, and nbtrain.ab's)."""
    out = Quality(seconds=seconds)
    for round_ in range(rounds):
        sides = [(current, out.current), (config, out.candidate)]
        for which, losses in sides[::-1] if round_ % 2 else sides:
            learned = quality(which, seconds, current)
            losses.append(learned.loss if not learned.note else float("nan"))
            out.held_out = learned.held_out
            out.note = learned.note or out.note
    return out
