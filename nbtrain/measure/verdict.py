"""A/B verdicts: the ratio of two throughputs with its 95% interval, in words.

Paired blocks (A and B measured in alternation, state restored between them) cancel the
slow drift of a shared machine's load: each pair's log-ratio is one observation, and a
t-interval over the pairs gives the ratio's interval. Two runs measured at different
times can only be compared unpaired (a bootstrap over each run's blocks), which cannot
see load that changed between them; such a verdict says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit  # Student's t quantile: what scipy.stats' t.ppf calls, without its ~0.4 s import

from ..format import ratio as ratio_text
from .steady import resampled_rates, steady_rate, steady_steps
from .withheld import Withheld, of_verdict

# A ratio within 2% of 1 is not called a difference even when its interval excludes 1: below
# that, a shared machine's systematic wobble (cache state, frequency) is as large as the effect.
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Verdict:
    """B's throughput over A's: `ratio` (> 1: B is faster) and its 95% interval."""
    ratio: float
    low: float
    high: float
    pairs: int
    paired: bool = True
    # One config measured against itself (an A/A check): whatever its blocks' ratio, it is this machine's
    # noise between blocks, never a speed difference, so it is not measurable and never faster or slower.
    one_config: bool = False

    @property
    def measurable(self) -> bool:
        return not self.one_config and (math.isfinite(self.low) and math.isfinite(self.high) and not (self.low <= 1.0 <= self.high)
                and abs(math.log(self.ratio)) > math.log1p(MIN_EFFECT))

    @property
    def faster(self) -> bool:
        return self.measurable and self.low > 1.0

    def above(self, threshold: float) -> bool:
        """B is faster than A by more than `threshold` (0.03 = 3%), beyond doubt at 95%."""
        return not self.one_config and math.isfinite(self.low) and self.low > 1.0 + threshold

    @property
    def withheld(self) -> Withheld | None:
        """Why this verdict says neither faster, slower nor "no measurable difference" (withheld.of_verdict
        decides: not measured, an A/A check, too few measurements or pairs, too noisy); None where it says one."""
        return of_verdict(self)

    @property
    def too_noisy(self) -> bool:
        return (held := self.withheld) is not None and held.kind == "noisy"

    @property
    def too_few_pairs(self) -> bool:
        return (held := self.withheld) is not None and held.kind == "few_pairs"

    def interval_text(self) -> str:
        if self.too_few_pairs:
            return f"{self.pairs} pairs, too few for an interval"
        return f"{self.low:.2f}-{self.high:.2f}" if math.isfinite(self.low) else "too few measurements"

    def text(self, name: str = "") -> str:
        head = f"{name}: " if name else ""
        if held := self.withheld:
            return head + held.words
        if not self.measurable:
            return head + f"no measurable difference ({self.interval_text()})"
        word = "faster" if self.ratio > 1 else "slower"
        shown = self.ratio if self.ratio > 1 else 1 / self.ratio
        interval = f"{self.low:.2f}-{self.high:.2f}" if self.ratio > 1 else f"{1 / self.high:.2f}-{1 / self.low:.2f}"
        return head + f"{ratio_text(shown)} {word} (95% interval {interval})"

    def short(self) -> str:
        """For a table cell: '1.31x (1.24-1.38)' or 'no measurable difference'."""
        if held := self.withheld:
            return held.short()
        if not self.measurable:
            return f"no measurable difference ({self.interval_text()})"
        return f"{ratio_text(self.ratio)} ({self.interval_text()})"


UNMEASURED = Verdict(float("nan"), float("nan"), float("nan"), 0)


def paired(rates_a, rates_b) -> Verdict:
    """The verdict from paired block rates (A's i-th block measured beside B's i-th block)."""
    a, b = np.asarray(rates_a, dtype=float), np.asarray(rates_b, dtype=float)
    keep = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
    logs = np.log(b[keep] / a[keep])
    n = len(logs)
    if n == 0:
        return UNMEASURED
    centre = float(logs.mean())
    if n < 2:
        return Verdict(math.exp(centre), float("nan"), float("nan"), n)
    half = float(stdtrit(n - 1, 0.975) * logs.std(ddof=1) / math.sqrt(n))
    return Verdict(math.exp(centre), math.exp(centre - half), math.exp(centre + half), n)


def unpaired(blocks_a, blocks_b, *, seed: int = 0, resamples: int = 2000) -> Verdict:
    """The verdict from two runs' block rates, measured at different times (a bootstrap of each)."""
    a, b = np.asarray(blocks_a, dtype=float), np.asarray(blocks_b, dtype=float)
    a, b = a[np.isfinite(a) & (a > 0)], b[np.isfinite(b) & (b > 0)]
    if len(a) == 0 or len(b) == 0:
        return UNMEASURED
    ratio = float(np.median(b) / np.median(a))
    if len(a) < 3 or len(b) < 3:
        return Verdict(ratio, float("nan"), float("nan"), min(len(a), len(b)), paired=False)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1)
    low, high = np.percentile(mb / ma, [2.5, 97.5])
    return Verdict(ratio, float(low), float(high), min(len(a), len(b)), paired=False)


def steady_ratio(series_a, series_b, *, resamples: int = 2000) -> Verdict:
    """B's steady rate over A's, each the samples/s a run's summary shows (`steady_rate` of its
    (durations, samples) series), so the ratio is the ratio of the two figures on screen; its 95%
    interval comes from independent moving-block bootstraps of each run's steady steps (the ones
    that give each rate its interval) and holds the ratio. Runs measured apart: unpaired."""
    a, b = steady_rate(*series_a), steady_rate(*series_b)
    if not (a.rate > 0 and b.rate > 0):
        return UNMEASURED
    ratio = b.rate / a.rate
    (_, da, sa), (_, db, sb) = steady_steps(*series_a), steady_steps(*series_b)
    pairs = min(a.steady_steps, b.steady_steps)
    ra, rb = resampled_rates(da, sa, 0, resamples), resampled_rates(db, sb, 1, resamples)
    if ra is None or rb is None:
        return Verdict(ratio, float("nan"), float("nan"), pairs, paired=False)
    low, high = np.percentile(rb / ra, [2.5, 97.5])
    return Verdict(ratio, min(float(low), ratio), max(float(high), ratio), pairs, paired=False)
