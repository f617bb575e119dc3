"""The gradient noise scale from gradient norms at two batch sizes (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", appendix A): the batch above which a larger batch buys fewer steps and costs more
samples for the same loss (the critical batch size, B_crit ~ B_simple).

A batch of B samples gives a gradient G_B whose expected squared norm is |G|^2 + tr(Sigma)/B (G the true
gradient, Sigma the per-sample gradients' covariance). Two batch sizes, B_small < B_big, give two equations and
their unbiased estimates:
    |G|^2     ~ (B_big |G_Bbig|^2 - B_small |G_Bsmall|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_Bsmall|^2 - |G_Bbig|^2) / (1/B_small - 1/B_big)
and B_simple = tr(Sigma) / |G|^2. Each estimate is noisy, so, as the paper does, each is averaged over repeats
before the ratio is taken; the interval is a bootstrap of that ratio of means over the repeats. Numbers only:
the norms are read on a live model by tools/gradient_noise.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


_FEWEST_FOR_INTERVAL = 5  # repeats from which the bootstrap gives an interval


@dataclass(frozen=True)
class NoiseScale:
    """B_simple with its 95% interval over `repeats` pairs of norms, and what it was read from."""
    b_simple: float
    low: float
    high: float
    grad_sq: float        # |G|^2, averaged over the repeats
    trace: float          # tr(Sigma), averaged over the repeats
    small: int            # B_small
    big: int              # B_big
    repeats: int
    note: str = ""        # why there is no estimate, where there is none

    @property
    def measured(self) -> bool:
        return math.isfinite(self.b_simple)

    def text(self) -> str:
        if not self.measured:
            return f"critical batch size not measured: {self.note}"
        interval = f"{self.low:,.0f}-{self.high:,.0f}" if math.isfinite(self.high) else \
            f"{self.low:,.0f} or more" if math.isfinite(self.low) else \
            f"too few repeats for an interval, {_FEWEST_FOR_INTERVAL} needed" if self.repeats < _FEWEST_FOR_INTERVAL \
            else "interval too wide to give"
        return (f"critical batch size ~{self.b_simple:,.0f} samples (gradient noise scale B_simple, 95% interval "
                f"{interval}; gradients at batch {self.small} and {self.big}, {self.repeats} repeats)")


def estimates(small_sq, big_sq, small: int, big: int) -> tuple[np.ndarray, np.ndarray]:
    """(|G|^2, tr(Sigma)) per repeat, from each repeat's |G_Bsmall|^2 and |G_Bbig|^2."""
    if not 0 < small < big:
        raise ValueError(f"the batch sizes must be 0 < small < big, not {small} and {big}")
    s, b = np.asarray(small_sq, dtype=float), np.asarray(big_sq, dtype=float)
    grad_sq = (big * b - small * s) / (big - small)
    trace = (s - b) / (1 / small - 1 / big)
    return grad_sq, trace


def noise_scale(small_sq, big_sq, small: int, big: int, *, resamples: int = 2000, seed: int = 0) -> NoiseScale:
    """B_simple from paired squared norms (one |G_Bsmall|^2 and one |G_Bbig|^2 per repeat); see the module doc."""
    grad_sq, trace = estimates(small_sq, big_sq, small, big)
    n = len(grad_sq)
    g, t = float(grad_sq.mean()) if n else float("nan"), float(trace.mean()) if n else float("nan")
    if n < 2 or not (g > 0 and t > 0):
        why = "fewer than 2 repeats" if n < 2 else \
            "|G|^2 was not resolved above the gradients' noise (more repeats, or a larger B_big)" if not g > 0 \
            else "the larger batch's gradients were no less noisy (tr(Sigma) not positive)"
        return NoiseScale(float("nan"), float("nan"), float("nan"), g, t, small, big, n, note=why)
    if n < _FEWEST_FOR_INTERVAL:  # a bootstrap of 2 or 3 repeats is no interval: the estimate is said without one
        return NoiseScale(t / g, float("nan"), float("nan"), g, t, small, big, n)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, (resamples, n))
    gs, ts = grad_sq[picks].mean(axis=1), trace[picks].mean(axis=1)
    # A resample whose |G|^2 is not positive reads "noise without signal": the batch could be any size, so it
    # counts as an unbounded B_simple, never dropped (dropping it would narrow the interval on its easy side).
    ratios = np.where(gs > 0, ts / np.where(gs > 0, gs, 1.0), np.inf)
    low, high = np.percentile(ratios, [2.5, 97.5], method="inverted_cdf")  # no interpolation: inf stays inf
    return NoiseScale(t / g, float(low), float(high), g, t, small, big, n)
