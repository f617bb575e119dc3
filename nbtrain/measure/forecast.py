"""The scaling forecast's arithmetic: how fast on N ranks, as a range, and what bounds it (numbers only).

    buckets = gradient_buckets(parameter_bytes)             # DDP's buckets, in the order backward fills them
    link = fit_link({size: [seconds, ...]}, ranks=2)         # bus bandwidth and latency from timed all-reduces
    point = scaling_point(8, 1, compute, buckets, link, None, batch=32)
    point.throughput, point.efficiency, point.binding        # each a (low, high) range; the term that bounds it

The model (the one nccl-tests and every DDP paper use):
- gradient bytes: each parameter's elements x the gradient dtype's size, cut into DDP's buckets: the
  parameters in reverse order (the order backward produces their gradients), a bucket closed once it
  holds its cap, the first cap 1 MiB (torch.distributed's first bucket), the others bucket_cap_mb (25);
- a ring all-reduce of S bytes on N ranks: t(S) = 2(N-1)/N * S / busbw + 2(N-1) * latency, summed over
  the buckets (each is its own all-reduce); one ring through all ranks, as fast as its slowest hop (the
  link between nodes where there are several);
- a step: between max(t_compute, t_ar) (DDP's buckets fully overlapped with backward) and
  t_compute + t_ar (none); with gradient accumulation k, t_compute is k micro-batches and the all-reduce
  runs once, after the last (no_sync before it).
Every input is a `Quantity` that says whether it was measured (and how), given, or assumed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit

from .bottleneck import Remedy
from .steady import SteadyRate, steady_steps

MIB = 1024 * 1024
FIRST_BUCKET_MB = 1    # torch.distributed's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
BUCKET_CAP_MB = 25     # DistributedDataParallel(bucket_cap_mb=25), the default
_RESAMPLES = 400
# One process's rate is judged over windows about this long: on a shared machine the CPU the scheduler leaves it
# moves over seconds (a 2-core box beside other work gave it 0.18-0.51 of a core within two minutes, its samples
# per CPU-second steady within 10%), so a run's rate is one draw of those windows, not a reading's mean.
WINDOW_S = 0.5


@dataclass(frozen=True)
class Quantity:
    """One input of the forecast with its 95% interval, and where it came from."""
    value: float
    low: float
    high: float
    unit: str
    source: str       # measured | given | assumed
    how: str = ""     # how it was measured, or why it is assumed

    @classmethod
    def exact(cls, value: float, unit: str, source: str, how: str = "") -> "Quantity":
        return cls(value, value, value, unit, source, how)

    def text(self, scale: float = 1.0, unit: str | None = None, digits: int = 3) -> str:
        """'12.3 ms (95% interval 11.9-12.8)': the value times `scale`, in `unit` (default its own)."""
        v, lo, hi = (x * scale for x in (self.value, self.low, self.high))
        out = f"{v:.{digits}g} {self.unit if unit is None else unit}"
        if lo == hi or not (math.isfinite(lo) and math.isfinite(hi)):
            return out
        return out + f" (95% interval {lo:.{digits}g}-{hi:.{digits}g})"


@dataclass(frozen=True)
class Link:
    """What one all-reduce hop costs: bus bandwidth (bytes/s) and latency (seconds per hop)."""
    name: str
    busbw: Quantity
    latency: Quantity
    draws: tuple = ()   # (busbw, latency) pairs of the fit's resamples: the two move together (a measured link)

    def pairs(self) -> tuple:
        """(busbw, latency) pairs spanning the link's uncertainty, jointly (a given link: its one pair)."""
        return self.draws or ((self.busbw.value, self.latency.value),)

    def text(self) -> str:
        return (f"link {self.name}: bus bandwidth {self.busbw.text(8e-9, 'Gb/s')}, latency "
                f"{self.latency.text(1e6, 'us')} per hop [{self.busbw.how}]")


def given_link(gbps: float, latency_us: float, name: str = "between nodes") -> Link:
    """A link the user stated (link_gbps=, link_latency_us=)."""
    how = "given: link_gbps, link_latency_us"
    return Link(name, Quantity.exact(gbps * 1e9 / 8, "B/s", "given", how),
                Quantity.exact(latency_us * 1e-6, "s", "given", how))


def gradient_buckets(parameter_bytes, cap_mb: float = BUCKET_CAP_MB, first_mb: float = FIRST_BUCKET_MB) -> tuple:
    """Bytes of each DDP bucket, from each parameter's gradient bytes in registration order."""
    limits, buckets, current = [first_mb * MIB], [], 0
    for size in reversed(list(parameter_bytes)):
        current += size
        if current >= limits[-1]:
            buckets.append(current)
            current = 0
            limits = [cap_mb * MIB]
    if current:
        buckets.append(current)
    return tuple(buckets)


def ring_allreduce_s(buckets, ranks: int, busbw: float, latency: float) -> float:
    """Seconds to all-reduce every bucket on a ring of `ranks` (none on one rank)."""
    if ranks < 2:
        return 0.0
    hops = 2 * (ranks - 1)
    return sum(hops / ranks * size / busbw + hops * latency for size in buckets)


def _fit(sizes: np.ndarray, seconds: np.ndarray, ranks: int) -> tuple[float, float]:
    """(busbw, latency) of t = 2(N-1)*latency + 2(N-1)/N * S / busbw, least squares, latency >= 0."""
    slope, intercept = np.polyfit(sizes, seconds, 1) if len(set(sizes.tolist())) > 1 else (seconds.mean() / sizes.mean(), 0)
    if intercept < 0:  # no measurable latency: the line through the origin
        slope, intercept = float(np.dot(sizes, seconds) / np.dot(sizes, sizes)), 0.0
    hops = 2 * (ranks - 1)
    return (hops / ranks / slope if slope > 0 else math.inf), intercept / hops


def fit_link(timings: dict, ranks: int, name: str, how: str, seed: int = 0) -> Link:
    """Bus bandwidth and latency from all-reduce timings {bytes: [seconds, ...]} on `ranks` ranks.

    The fit is on each size's mean (a step pays the mean, its rare long waits included); the 95% interval
    resamples each size's repetitions."""
    sizes = np.array(sorted(timings), dtype=float)
    means = np.array([np.mean(timings[int(s)]) for s in sizes])
    busbw, latency = _fit(sizes, means, ranks)
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(_RESAMPLES):
        picked = [np.mean(rng.choice(timings[int(s)], len(timings[int(s)]))) for s in sizes]
        fits.append(_fit(sizes, np.array(picked), ranks))
    bws, lats = np.array([f[0] for f in fits]), np.array([f[1] for f in fits])
    detail = f"measured: {how}; {len(sizes)} sizes {_mb(sizes.min())}-{_mb(sizes.max())}, " \
             f"{min(len(v) for v in timings.values())}+ repetitions each"
    # "nearest": no interpolation between resamples, one of which may have found no slope (an infinite bandwidth)
    return Link(name, Quantity(busbw, *np.quantile(bws, [0.025, 0.975], method="nearest").tolist(), "B/s",
                               "measured", detail),
                Quantity(latency, *np.quantile(lats, [0.025, 0.975], method="nearest").tolist(), "s", "measured",
                         detail),
                tuple((float(b), float(lat)) for b, lat in fits))


def rank_wait(first: list, in_step: list, how: str, seed: int = 0) -> Quantity:
    """Seconds a step's first all-reduce waits for the slower rank: the mean of one-element all-reduces
    right after each rank's work, less the median of those with the ranks already in step (the latency)."""
    first, base = np.asarray(first, dtype=float), float(np.median(in_step))
    rng = np.random.default_rng(seed)
    means = [rng.choice(first, len(first)).mean() for _ in range(_RESAMPLES)]
    low, high = (max(q - base, 0.0) for q in np.quantile(means, [0.025, 0.975]))
    return Quantity(max(first.mean() - base, 0.0), low, high, "s", "measured", how)


def mean_quantity(values, scale: float, how: str, seed: int = 0) -> Quantity:
    """The mean of `values` times `scale`, in seconds, with its 95% bootstrap interval (measured)."""
    values = np.asarray(values, dtype=float) * scale
    rng = np.random.default_rng(seed)
    low, high = np.quantile([rng.choice(values, len(values)).mean() for _ in range(_RESAMPLES)], [0.025, 0.975])
    return Quantity(float(values.mean()), float(low), float(high), "s", "measured", how)


def window_rates(durations, samples, seconds: float = WINDOW_S) -> list[float]:
    """Rates of consecutive windows of a reading's steady steps (its warm-up set apart), each at least `seconds`
    long; a last piece shorter than that joins the window before it."""
    _, d, s = steady_steps(durations, samples)
    out, spans, start = [], [], 0
    for i in range(len(d)):
        if d[start:i + 1].sum() >= seconds:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(d):
        spans[-1:] = [(spans[-1][0] if spans else start, len(d))]
    for a, b in spans:
        if d[a:b].sum() > 0:
            out.append(float(s[a:b].sum() / d[a:b].sum()))
    return out


def run_range(readings: list[SteadyRate], windows: list[float]) -> tuple[float, float]:
    """Where another run's steady rate on this machine may lie (95%), from readings taken at other moments.

    A reading's interval is the interval of its own mean: it narrows as the reading grows, while a run at
    another moment meets another share of a shared machine's CPU. So the range is the prediction interval of
    one more window from the readings' windows (on a log scale: shares multiply a rate), and never narrower
    than the readings' own intervals (a quiet machine's windows agree, and then those decide)."""
    lows = [r.low for r in readings if math.isfinite(r.low)] or [r.rate for r in readings]
    highs = [r.high for r in readings if math.isfinite(r.high)] or [r.rate for r in readings]
    low, high = min(lows), max(highs)
    logs = np.log([w for w in windows if w > 0])
    if len(logs) >= 3:
        half = stdtrit(len(logs) - 1, 0.975) * logs.std(ddof=1) * math.sqrt(1 + 1 / len(logs))
        low, high = min(low, math.exp(logs.mean() - half)), max(high, math.exp(logs.mean() + half))
    return low, high


def one_process_step(readings: list[SteadyRate], windows: list[float], batch: int, how: str) -> Quantity:
    """Seconds of one step of `batch` samples of one process alone (the 1 x 1 point): the readings' pooled rate,
    and the range another run of it here may read (run_range), as step seconds."""
    seconds = [max(r.total_s - r.warmup_s, 0.0) for r in readings]
    rate = sum(r.rate * t for r, t in zip(readings, seconds)) / sum(seconds) if sum(seconds) > 0 else \
        float(np.mean([r.rate for r in readings]))
    low, high = run_range(readings, windows)
    return Quantity(batch / rate, batch / high, batch / low, "s", "measured",
                    f"{how}; the range another run may read: from {len(windows)} windows of {len(readings)} "
                    f"reading{'s' * (len(readings) != 1)}, as this machine's load moved")


def less_its_allreduce(compute: Quantity, micro: int, allreduce: tuple) -> Quantity:
    """The compute per micro-batch read from steps of `micro` micro-batches that each ran one all-reduce
    taking `allreduce` = (low, high) seconds: each step held between none of it (hidden under backward)
    and all of it, so the compute lies between the step less the all-reduce and the whole step, per
    micro-batch."""
    low = max(compute.low - allreduce[1] / micro, 0.5 * compute.low)
    value = compute.value - (allreduce[0] + allreduce[1]) / 4 / micro
    how = (f"{compute.how}; between all of it and less its one all-reduce ({1000 * allreduce[0]:.3g}-"
           f"{1000 * allreduce[1]:.3g} ms) per {micro} micro-batches")
    return Quantity(max(value, low), low, compute.high, compute.unit, compute.source, how)


def _mb(size: float) -> str:
    return f"{size / 1e6:.3g} MB"


@dataclass(frozen=True)
class ScalingPoint:
    """The forecast for `devices` ranks on each of `nodes` machines."""
    devices: int
    nodes: int
    throughput: tuple        # (low, high) samples/s: no overlap, full overlap
    efficiency: tuple        # (low, high) per-rank throughput over one rank's
    compute_s: float         # one optimizer step's compute (all its micro-batches), median
    allreduce_s: tuple       # (low, high) seconds of the step's all-reduces
    latency_share: float     # of the all-reduce's time, the part its latency costs
    binding: str             # compute | communication | unknown
    why: str

    @property
    def ranks(self) -> int:
        return self.devices * self.nodes

    def contains(self, low: float, high: float) -> bool:
        """Whether a measured interval overlaps the forecast's range."""
        return low <= self.throughput[1] and high >= self.throughput[0]


def scaling_point(devices: int, nodes: int, compute: Quantity, buckets, local: Link | None, between: Link | None, *,
                  batch: int, accumulate: int = 1, wait: Quantity | None = None,
                  copies: Quantity | None = None) -> ScalingPoint:
    """Throughput and per-rank efficiency on devices x nodes ranks, each a range; see the module doc.
    `wait`: what a step waits for the slower rank before its all-reduce (measured on 2 ranks; None: 0);
    `copies`: DDP's copies of the gradients into their buckets and back, per step (None: 0)."""
    n, samples = devices * nodes, batch * accumulate
    t_c = [accumulate * compute.low, accumulate * compute.value, accumulate * compute.high]
    links = ([local] if devices > 1 else []) + ([between] if nodes > 1 else [])
    if None in links:
        nan = (math.nan, math.nan)
        missing = ("the link between nodes was neither measured nor given (link_gbps=, link_latency_us=)"
                   if nodes > 1 and between is None else "no 2 local devices here to measure their link on")
        return ScalingPoint(devices, nodes, nan, nan, t_c[1], nan, math.nan, "unknown", missing)
    if not links:  # one rank: no all-reduce
        return ScalingPoint(devices, nodes, (samples / t_c[2], samples / t_c[0]), (1.0, 1.0), t_c[1], (0.0, 0.0),
                            0.0, "compute", "one rank: no all-reduce")
    fast, slow = allreduce_interval(buckets, n, links)
    waits = tuple(sum(getattr(q, end) for q in (wait, copies) if q is not None) for end in ("low", "value", "high"))
    fast, slow = fast + waits[0], slow + waits[2]
    middle = ring_allreduce_s(buckets, n, min(lk.busbw.value for lk in links), max(lk.latency.value for lk in links))
    latency_only = ring_allreduce_s(buckets, n, math.inf, max(lk.latency.value for lk in links)) + (
        wait.value if wait is not None else 0.0)
    middle += waits[1]
    throughput = (n * samples / (t_c[2] + slow), n * samples / max(t_c[0], fast))
    efficiency = (t_c[1] / (t_c[1] + slow), t_c[1] / max(t_c[1], fast))
    share = latency_only / middle if middle > 0 else 0.0
    binding, why = _binding(n, t_c[1], middle, share, sum(buckets), len(buckets),
                            min(links, key=lambda lk: lk.busbw.value).name)
    return ScalingPoint(devices, nodes, throughput, efficiency, t_c[1], (fast, slow), share, binding, why)


def allreduce_interval(buckets, ranks: int, links) -> tuple[float, float]:
    """The 95% interval of the all-reduce's seconds over the links' joint (bandwidth, latency) draws: the
    ring as fast as its slowest hop in each draw."""
    pairs = [lk.pairs() for lk in links]
    count = max(len(p) for p in pairs)
    times = [ring_allreduce_s(buckets, ranks, min(p[i % len(p)][0] for p in pairs),
                              max(p[i % len(p)][1] for p in pairs)) for i in range(count)]
    low, high = np.quantile(times, [0.025, 0.975]).tolist()
    return low, high


def _binding(ranks: int, compute: float, allreduce: float, latency_share: float, total: int, count: int,
             link: str) -> tuple[str, str]:
    what = f"the all-reduce of {_mb(total)} of gradients in {count} bucket{'s' * (count != 1)} over the link {link}"
    term = (f"its latency and the ranks' wait for each other ({100 * latency_share:.0f}% of it: {count} bucket"
            f"{'s' * (count != 1)} x {2 * (ranks - 1)} hops)" if latency_share >= 0.5 else
            f"its bandwidth ({100 * (1 - latency_share):.0f}% of it)")
    ms = f"{1000 * allreduce:.3g} ms against {1000 * compute:.3g} ms of compute"
    if allreduce >= compute:
        return "communication", f"{what} ({ms}) outlasts the compute even fully overlapped; {term} dominates"
    return "compute", (f"the compute; {what} adds 0-{100 * allreduce / compute:.0f}% as DDP overlaps it with "
                       f"backward or not ({ms}); {term} dominates it")


def remedies(point: ScalingPoint, compute: Quantity, buckets, local: Link, between: Link | None, *, batch: int,
             accumulate: int = 1, steps: tuple = (2, 4), wait: Quantity | None = None,
             copies: Quantity | None = None) -> list[Remedy]:
    """What lifts a communication-bound point, in the ceilings' words: accumulation (one all-reduce per
    k batches, the efficiency predicted by the same model) and a larger per-rank batch (predicted with
    the step's compute growing in proportion to the batch: its fixed costs make the real gain larger)."""
    if point.binding != "communication" and not point.allreduce_s[1] > 0.1 * point.compute_s:
        return []
    out = []
    for k in steps:
        more = scaling_point(point.devices, point.nodes, compute, buckets, local, between, batch=batch,
                             accumulate=accumulate * k, wait=wait, copies=copies)
        out.append(Remedy("communication", "accumulate_grad_batches",
                          f"accumulate_grad_batches={accumulate * k}: one all-reduce per {accumulate * k} batches "
                          f"(per-rank efficiency {percent_range(more.efficiency)} on {point.ranks} ranks, now "
                          f"{percent_range(point.efficiency)}; the global batch grows with it, so scale the learning rate)"))
    bigger = Quantity(2 * compute.value, 2 * compute.low, 2 * compute.high, compute.unit, "assumed")
    double = scaling_point(point.devices, point.nodes, bigger, buckets, local, between, batch=2 * batch,
                           accumulate=accumulate, wait=wait, copies=copies)
    out.append(Remedy("communication", "batch_size",
                      f"batch_size={2 * batch}: the same all-reduce spread over twice the samples per rank "
                      f"(efficiency {percent_range(double.efficiency)}, predicted with the compute twice as long; "
                      f"check that it fits with find_batch_size)"))
    return out


def percent_range(pair: tuple) -> str:
    """(0.84, 1.0) -> '84-100%'."""
    low, high = (round(100 * x) for x in pair)
    return f"{low}%" if low == high else f"{low}-{high}%"
