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
from scipy import stats

from ..format import ratio as ratio_text
from .steady import resampled_rates, steady_rate, steady_steps

# A ratio within 2% of 1 is not called a difference even when its interval excludes 1: below
# that, a shared machine's systematic wobble (cache state, frequency) is as large as the effect.
MIN_EFFECT = 0.02
TOO_WIDE = 1.5  # an interval wider than this factor (e.g. 0.82-1.25) that holds 1 is "too noisy to tell"
# Fewer paired blocks than this give no interval worth printing: t's 97.5% point is 12.7 at 2 pairs and 4.3 at 3,
# so a busy machine's pairs printed "0.00-46666641476640.16" (ab's own fewest pairs is 4 too).
FEWEST_PAIRS = 4


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
    def too_noisy(self) -> bool:
        """An interval holding 1 but so wide (high/low > TOO_WIDE) that it rules out nothing a user cares
        about: "no measurable difference" would read as "the same", which it cannot show."""
        return (not self.measurable and math.isfinite(self.low) and math.isfinite(self.high)
                and self.high > TOO_WIDE * self.low)  # a low of 0 (no time seen) is as wide as it gets

    @property
    def too_few_pairs(self) -> bool:
        """Paired blocks too few (2 or 3) for an interval a person can read, and no difference shown by them."""
        return (self.paired and not self.one_config and 2 <= self.pairs < FEWEST_PAIRS and not self.measurable
                and math.isfinite(self.low))

    def noise_text(self) -> str:
        """What an A/A check's blocks show: how far apart one config's paired blocks read on this machine."""
        if not math.isfinite(self.low):
            return "too few pairs to show the machine's noise"
        return (f"its paired blocks read {self.low:.2f}-{self.high:.2f} of each other (95% interval), "
                f"this machine's noise between blocks")

    def interval_text(self) -> str:
        if self.too_few_pairs:
            return f"{self.pairs} pairs, too few for an interval"
        return f"{self.low:.2f}-{self.high:.2f}" if math.isfinite(self.low) else "too few measurements"

    def text(self, name: str = "") -> str:
        head = f"{name}: " if name else ""
        if not math.isfinite(self.ratio):
            return head + "not measured"
        if self.one_config:
            return head + f"A/A check, one config against itself: no speed verdict; {self.noise_text()}"
        if not math.isfinite(self.low):
            return head + f"{ratio_text(self.ratio)}, too few measurements to tell"
        if self.too_few_pairs:
            return head + f"too few pairs to tell ({self.pairs} pairs of blocks; an interval needs {FEWEST_PAIRS})"
        if self.too_noisy:
            return head + f"too noisy to tell (95% interval {self.interval_text()})"
        if not self.measurable:
            return head + f"no measurable difference ({self.interval_text()})"
        word = "faster" if self.ratio > 1 else "slower"
        shown = self.ratio if self.ratio > 1 else 1 / self.ratio
        interval = f"{self.low:.2f}-{self.high:.2f}" if self.ratio > 1 else f"{1 / self.high:.2f}-{1 / self.low:.2f}"
        return head + f"{ratio_text(shown)} {word} (95% interval {interval})"

    def short(self) -> str:
        """For a table cell: '1.31x (1.24-1.38)' or 'no measurable difference'."""
        if not math.isfinite(self.ratio):
            return "-"
        if self.one_config:
            return f"A/A check: {self.noise_text()}"
        if not math.isfinite(self.low):
            return f"{ratio_text(self.ratio)}, too few steps to tell"
        if self.too_few_pairs:
            return f"too few pairs to tell ({self.pairs} of {FEWEST_PAIRS})"
        if self.too_noisy:
            return f"too noisy to tell ({self.interval_text()})"
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
    half = float(stats.t.ppf(0.975, n - 1) * logs.std(ddof=1) / math.sqrt(n))
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
