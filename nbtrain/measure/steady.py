"""Steady-state throughput from a run's step series: warm-up found and set apart, spread stated.

A run's first steps pay for lazy initialisation, loader start-up, allocator growth and
compilation; averaging them in understates the speed a config trains at. The warm-up is
found from the step-time series itself (the first steps whose running median sits well
above the settled level), reported apart, and the rate comes from the steps after it,
with a 95% interval from a moving-block bootstrap (blocks keep a passing load spike
together, as it really came) and the spread of block rates, so a figure taken on a busy
machine says so.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..format import duration, number, plural

WIDE_SPREAD = 0.10  # IQR / median of block rates above this: too noisy to trust (torch.utils.benchmark's rule)
_RESAMPLES = 400
_FEWEST = 6  # steps a bootstrap needs: fewer give no interval


@dataclass(frozen=True)
class SteadyRate:
    """Samples per second after the warm-up, with its 95% interval and spread."""
    rate: float
    low: float
    high: float
    spread: float          # IQR / median of block rates (0.05 = 5%)
    warmup_steps: int
    warmup_s: float
    steady_steps: int
    total_s: float

    @property
    def wide(self) -> bool:
        return not math.isfinite(self.spread) or self.spread > WIDE_SPREAD

    def text(self, unit: str = "samples/s") -> str:
        if not math.isfinite(self.rate):
            return "-"
        # significant figures, not whole numbers: 1 sample/s read as "1 (95% interval 1-1)" hid a 70% spread
        out = number(float(self.rate)) + (f" {unit}" if unit else "")
        if math.isfinite(self.low) and math.isfinite(self.high):
            out += f" (95% interval {number(float(self.low))}-{number(float(self.high))})"
        if self.wide and math.isfinite(self.spread):
            out += f"; spread {100 * self.spread:.0f}% between blocks: too noisy to trust"
        return out

    def warmup_text(self) -> str:
        return f"warm-up {plural(self.warmup_steps, 'step')}, {duration(self.warmup_s)}" if self.warmup_steps else "no warm-up"

    def as_dict(self) -> dict:
        return {"rate": self.rate, "low": self.low, "high": self.high, "spread": self.spread,
                "warmup_steps": self.warmup_steps, "warmup_s": self.warmup_s, "steady_steps": self.steady_steps,
                "total_s": self.total_s}




NOTHING = SteadyRate(float("nan"), float("nan"), float("nan"), float("nan"), 0, 0.0, 0, 0.0)


def step_durations(times) -> list[float]:
    """Each step's wall time from the run clock's readings at step ends (the first: the clock's first
    reading, so its start-up counts as the first step's)."""
    times = list(times)
    return [b - a for a, b in zip([0.0] + times, times)]


def warmup_length(durations) -> int:
    """How many leading steps are warm-up: until the running median settles near the later level."""
    d = np.asarray(durations, dtype=float)
    n = len(d)
    if n < 4:
        return 1 if n >= 3 and d[0] > 2 * np.median(d[1:]) else 0
    settled = d[n // 2:]
    level = float(np.median(settled))
    mad = 1.4826 * float(np.median(np.abs(settled - level)))
    limit = level + max(3 * mad, 0.1 * level)
    # Windows of 3, short so the settled steps that follow do not hide the warm-up's tail; their medians
    # in plain Python (a numpy median per window costs more than the whole run's other summary work).
    head = d[:n // 2 + 2].tolist()
    for i in range(0, n // 2):
        window = sorted(head[i:i + 3])
        if window[len(window) // 2] <= limit:
            return i
    return n // 2


def _floats(values) -> np.ndarray:
    """`values` as an array of floats; an array of floats already is taken as it is (not listed and made again)."""
    if isinstance(values, np.ndarray) and values.dtype == float:
        return values
    return np.asarray(list(values), dtype=float)


def steady_steps(durations, samples) -> tuple[int, np.ndarray, np.ndarray]:
    """(warm-up length, durations, samples) of the steps after the warm-up."""
    d, s = _floats(durations), _floats(samples)
    warm = warmup_length(d) if len(d) and np.all(np.isfinite(d)) else 0
    return warm, d[warm:], s[warm:]


def steady_rate(durations, samples, *, seed: int = 0) -> SteadyRate:
    """The steady rate of steps taking `durations` seconds and holding `samples` samples each."""
    d = _floats(durations)
    if len(d) == 0 or not np.all(np.isfinite(d)):
        return NOTHING
    warm, steady_d, steady_s = steady_steps(d, samples)
    total = float(d.sum())
    if steady_d.sum() <= 0:
        return SteadyRate(float("nan"), float("nan"), float("nan"), float("nan"), warm, float(d[:warm].sum()),
                          len(steady_d), total)
    rate = float(steady_s.sum() / steady_d.sum())
    low, high, spread = _interval(steady_d, steady_s, seed)
    # The moving-block bootstrap draws the series' first and last steps less often than the rest, so a
    # slow step at an end can leave the rate outside its percentile interval; the interval shown holds it.
    low, high = min(low, rate), max(high, rate)
    return SteadyRate(rate, low, high, spread, warm, float(d[:warm].sum()), len(steady_d), total)


def resampled_rates(d: np.ndarray, s: np.ndarray, seed: int, resamples: int = _RESAMPLES) -> np.ndarray | None:
    """sum(s)/sum(d) of `resamples` moving-block bootstrap draws of the steps (None: under _FEWEST steps)."""
    if len(d) < _FEWEST:
        return None
    return _Blocks(d, s).resampled(seed, resamples)


class _Blocks:
    """A steady series' running sums, read by the bootstrap and by the spread alike (made once a summary)."""

    def __init__(self, d: np.ndarray, s: np.ndarray):
        self.n = n = len(d)
        self.length = max(2, int(round(math.sqrt(n))))
        self.cd, self.cs = np.concatenate([[0.0], np.cumsum(d)]), np.concatenate([[0.0], np.cumsum(s)])

    def resampled(self, seed: int, resamples: int) -> np.ndarray:
        length, cd, cs = self.length, self.cd, self.cs
        starts = np.arange(0, self.n - length + 1)
        block_d, block_s = cd[starts + length] - cd[starts], cs[starts + length] - cs[starts]
        picks = _picks(seed, len(starts), math.ceil(self.n / length), resamples)
        return block_s[picks].sum(1) / block_d[picks].sum(1)

    def disjoint_rates(self) -> np.ndarray:
        """Rates of non-overlapping blocks (the spread's)."""
        length, cd, cs = self.length, self.cd, self.cs
        disjoint = np.arange(0, self.n - length + 1, length)
        return (cs[disjoint + length] - cs[disjoint]) / (cd[disjoint + length] - cd[disjoint])


@functools.lru_cache(maxsize=8)  # the few lengths a session's runs have (a long run's draws: ~0.3 MB)
def _picks(seed: int, starts: int, blocks: int, resamples: int) -> np.ndarray:
    """The bootstrap's block draws: the same for every series of one length and seed (a run's summary, a
    comparison's blocks), so drawn once; read-only, as every caller shares it."""
    picks = np.random.default_rng(seed).integers(0, starts, size=(resamples, blocks))
    picks.flags.writeable = False
    return picks


def _interval(d: np.ndarray, s: np.ndarray, seed: int) -> tuple[float, float, float]:
    """Moving-block bootstrap 95% interval of sum(s)/sum(d), and the IQR/median of block rates."""
    if len(d) < _FEWEST:
        return float("nan"), float("nan"), float("nan")
    blocks = _Blocks(d, s)
    low, high = _quantiles(blocks.resampled(seed, _RESAMPLES), (0.025, 0.975))
    q1, median, q3 = _quantiles(blocks.disjoint_rates(), (0.25, 0.5, 0.75))
    return low, high, (q3 - q1) / median if median > 0 else float("nan")


def _quantiles(values: np.ndarray, qs) -> list[float]:
    """numpy's default (linear) quantiles, by one sort: np.percentile's own overhead, paid at the end of
    every run, was most of a run's summary."""
    v = np.sort(values).tolist()
    out = []
    for q in qs:
        position = q * (len(v) - 1)
        lo = int(position)
        hi = min(lo + 1, len(v) - 1)
        out.append(v[lo] + (position - lo) * (v[hi] - v[lo]))
    return out


def of_columns(columns: dict, samples_start: int = 0) -> SteadyRate:
    """The steady rate of a MetricsLog's step columns (time, samples, step_s)."""
    # The first step's duration is the run clock's first reading: its start-up counts as warm-up.
    return steady_rate(*columns_series(columns, samples_start))


def block_rates(durations, samples) -> list[float]:
    """Rates of disjoint blocks of the steady steps (what an unpaired comparison resamples)."""
    d, s = _floats(durations), _floats(samples)
    warm = warmup_length(d)
    d, s = d[warm:], s[warm:]
    length = max(2, int(round(math.sqrt(len(d))))) if len(d) >= 6 else max(len(d), 1)
    return [float(s[i:i + length].sum() / d[i:i + length].sum())
            for i in range(0, len(d) - length + 1, length) if d[i:i + length].sum() > 0]


def columns_series(columns: dict, samples_start: int = 0) -> tuple[list[float], list[float]]:
    """(durations, samples) per step from a MetricsLog's columns."""
    totals = list(columns.get("samples", []))
    return step_durations(columns.get("time", [])), [b - a for a, b in zip([samples_start] + totals, totals)]


class WindowRate:
    """Samples/s over each log window while a run goes, measured from the end of the window before
    (so a slow start fades out): what the progress bar and the loggers show, over the spans the
    live plot draws."""

    def __init__(self):
        self.mark: tuple[float, int] | None = None

    def start(self, info: dict) -> None:
        self.mark = (0.0, info.get("samples_start", 0))

    def of(self, rows: dict) -> float | None:
        """The rate of the window whose rows end here; None when no time has passed (a restarted clock)."""
        t1, s1 = rows["time"][-1], rows["samples"][-1]
        t0, s0 = self.mark if self.mark is not None else (t1, s1)
        self.mark = (t1, s1)
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None
