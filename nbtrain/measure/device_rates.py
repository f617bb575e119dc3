"""The device's rates measured on the spot, and what one training step asks of them.

- `peak_flops`: FLOP/s of a square matmul in the step's dtype (a spec sheet knows neither this
  machine's clocks nor what else runs on it);
- `bandwidth`: bytes/s of a large copy (each byte read once and written once);
- `StepCounter`: FLOPs (torch.utils.flop_counter: matmuls and convolutions), bytes and operations of
  one step. Bytes are what each operation reads and writes, summed; a cache can serve some of them
  again, so this is the traffic of an unfused step, an upper bound (views and allocations move none);
- `host_split`: step time at the config's batch and at 2 samples, t(b) = host + device_per_sample * b.
  The intercept is the fixed per-step cost (Python, dispatch, kernel launches, the optimizer, the
  weights' own traffic: all that a larger batch shares out), the slope the device's per-sample work.
  A batch of 2 is nearly all fixed cost, so the intercept barely depends on how the device's
  efficiency changes with the batch;
- `busy_fraction` (CUDA): the union of the kernels' intervals over the steps' wall time, from
  torch.profiler; the rest of the time the GPU waited for the host.

Each rate comes with a 95% interval: from a bootstrap of its repetitions, never one reading.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

_ONE_S = 0.02  # one timed matmul or copy at least this long: shorter ones time the launch, not the device
_RESAMPLES = 400
_QUARTILE = 0.25  # the step times the host split reads: below most preemptions, above the rare lucky reading
_SIDES: dict = {}  # (device, dtype) -> the matmul side peak_flops found for them
_TOP = 0.9  # the peak is the 90th percentile of the repetitions: the fastest alone is one lucky reading


@dataclass(frozen=True)
class Rate:
    """A measured rate (FLOP/s, bytes/s, seconds, a fraction) with its 95% interval."""
    value: float
    low: float
    high: float
    size: int = 0           # the matrix side or the copy's bytes that measured it
    dtype: str = ""

    def scaled(self, factor: float) -> "Rate":
        """The rate times a positive `factor` (samples per FLOP, ...); its interval with it."""
        return Rate(self.value * factor, self.low * factor, self.high * factor, self.size, self.dtype)


def _bootstrap(values, statistic, seed: int = 0) -> tuple[float, float, float]:
    """`statistic` of `values` and its 95% bootstrap interval."""
    v = np.asarray(values, dtype=float)
    point = float(statistic(v))
    if len(v) < 3:
        return point, float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(v), (_RESAMPLES, len(v)))
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.array([statistic(v[p]) for p in picks], dtype=float)
    # Nearest ranks, not interpolated: a draw may be infinite (no device time seen in it).
    low, high = np.quantile(draws, 0.025, method="lower"), np.quantile(draws, 0.975, method="higher")
    return point, min(float(low), point), max(float(high), point)


def _timed(operation, sync) -> float:
    t0 = time.perf_counter()
    operation()
    sync()
    return time.perf_counter() - t0


def _repeat(operation, sync, seconds: float) -> list[float]:
    """Durations of `operation` repeated for `seconds` (at least 8 times)."""
    durations, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(durations) < 8:
        durations.append(_timed(operation, sync))
    return durations


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _top_rate(work: float, durations, size: int, dtype: str) -> Rate:
    rates = work / np.maximum(np.asarray(durations), 1e-12)
    value, low, high = _bootstrap(rates, lambda r: np.quantile(r, _TOP))
    return Rate(value, low, high, size, dtype)


def peak_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.3) -> Rate:
    """FLOP/s of a square matmul in `dtype` on `device`, sized so that one lasts about _ONE_S."""
    sync = _sync(device)
    generator = torch.Generator(device=device).manual_seed(0)  # the user's RNG streams stay untouched
    key = (str(device), dtype)
    n, cap = _SIDES.get(key, 256), 4096 if device.type == "cpu" else 16384
    while True:
        a = torch.randn(n, n, device=device, generator=generator).to(dtype)
        b = torch.randn(n, n, device=device, generator=generator).to(dtype)
        torch.mm(a, b)  # first call: kernel selection, allocation
        sync()
        # Doubling the side makes a matmul 8x longer: one lasting half of _ONE_S is long enough, and the
        # next side would last 4 _ONE_S each, for every repetition (seconds of a walk's budget on a CPU).
        # The fastest of three decides: one matmul preempted on a busy machine read long enough at a side of
        # 256, small enough to run in a core's cache, and that side was kept for every later reading.
        if min(_timed(lambda: torch.mm(a, b), sync) for _ in range(3)) >= _ONE_S / 2 or n >= cap:
            break
        n *= 2
    _SIDES[key] = n  # the machine's, not the config's: a second reading starts at the side found
    return _top_rate(2 * n**3, _repeat(lambda: torch.mm(a, b), sync, seconds), n, str(dtype).replace("torch.", ""))


def bandwidth(device: torch.device, seconds: float = 0.3) -> Rate:
    """Bytes/s of copying a tensor far larger than the caches (read once, written once)."""
    sync = _sync(device)
    # On a CPU, 64 MB (128 MB read and written) is past the last-level cache a core sees, and a copy of it
    # lasts milliseconds; a larger one costs more to allocate (first-touch page faults: 1.6 s for 256 MB in a
    # sandboxed VM) than its timing is worth. A GPU's copies grow until one lasts _ONE_S.
    size, cap = (64 << 20, 64 << 20) if device.type == "cpu" else (16 << 20, 4 << 30)
    while True:
        source = torch.ones(size // 4, device=device)
        target = torch.empty_like(source)
        target.copy_(source)
        sync()
        t0 = time.perf_counter()
        target.copy_(source)
        sync()
        if time.perf_counter() - t0 >= _ONE_S or size >= cap:
            break
        size *= 2
    return _top_rate(2 * size, _repeat(lambda: target.copy_(source), sync, seconds), size, "float32")


class StepCounter(TorchDispatchMode):
    """Counts the bytes each operation reads and writes, and the operations, by phase ("model" or
    "optimizer"); FLOPs come from torch's own counter, run alongside."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.ops = {"model": 0, "optimizer": 0}
        self.phase = "model"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if not func.is_view and not name.startswith(("aten::empty", "aten::_local_scalar")):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            self.ops[self.phase] += 1
        return out


@dataclass(frozen=True)
class StepCount:
    flops: float
    bytes: float
    model_ops: int       # operations of forward and backward
    optimizer_ops: int   # operations of the optimizer's step


def count_step(train_step) -> StepCount:
    """FLOPs, bytes and operations of `train_step(counter)`, which sets counter.phase around its optimizer."""
    counter, flops = StepCounter(), FlopCounterMode(display=False)
    with flops, counter:
        train_step(counter)
    return StepCount(float(flops.get_total_flops()), float(counter.bytes), counter.ops["model"],
                     counter.ops["optimizer"])


@dataclass(frozen=True)
class HostSplit:
    """Step time at two batch sizes, split into the fixed (host) part and the per-sample (device) part."""
    batch: int
    small: int
    host_s: Rate          # seconds per step that do not grow with the batch
    device_s: Rate        # seconds per step that do, at `batch`
    host_share: Rate      # host_s / device_s: above 1 the fixed cost dominates


def host_split(full: list[float], small: list[float], batch: int, small_batch: int) -> HostSplit:
    """The split from paired step times at `batch` and `small_batch` (readings taken in alternation)."""
    pairs = np.column_stack([np.asarray(full, dtype=float), np.asarray(small, dtype=float)])
    span = batch - small_batch

    def parts(p):
        # Lower quartiles, not means: on a shared machine a preemption only ever adds time (whole
        # milliseconds to some readings), time that is neither the host's work nor the device's.
        # (The model-alone rate, a mean, keeps it.)
        tb, ts = np.quantile(p[:, 0], _QUARTILE), np.quantile(p[:, 1], _QUARTILE)
        device = max(tb - ts, 0.0) / span * batch  # a slope the noise made negative: no device time seen
        return max(tb - device, 0.0), device

    def statistic(index):
        return lambda idx: parts(pairs[idx.astype(int)])[index]

    indices = np.arange(len(pairs))
    host, device = (Rate(*_bootstrap(indices, statistic(i))) for i in (0, 1))
    share = Rate(*_bootstrap(indices, lambda idx: _ratio(*parts(pairs[idx.astype(int)]))))
    return HostSplit(batch, small_batch, host, device, share)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


@dataclass(frozen=True)
class Busy:
    """CUDA: the share of the steps' wall time with a kernel running, and the kernels per step."""
    fraction: Rate
    kernels_per_step: float
    median_kernel_us: float


def busy_fraction(train_step, steps: int = 5) -> Busy:
    """Union of the kernels' intervals over each step's wall time, from a torch.profiler trace of
    `steps` steps (each synchronised, so its span holds its kernels)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("nbtrain_step"):
                train_step()
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return busy_from_events(json.load(f)["traceEvents"])


def busy_from_events(events) -> Busy:
    """The busy fraction of each step annotated "nbtrain_step" in a Chrome trace's events (times in us)."""
    # The host's annotation (the GPU timeline has its own copy, "gpu_user_annotation", which is not the wall).
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("name") == "nbtrain_step" and e.get("cat") == "user_annotation" and "dur" in e)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel" and "dur" in e)
    fractions, counts = [], []
    for start, end in spans:
        inside = [(max(a, start), min(b, end)) for a, b in kernels if b > start and a < end]
        fractions.append(union_length(inside) / (end - start) if end > start else math.nan)
        counts.append(len(inside))
    durations = [b - a for a, b in kernels]
    return Busy(Rate(*_bootstrap(fractions, np.mean)), float(np.mean(counts)) if counts else 0.0,
                float(np.median(durations)) if durations else math.nan)


def union_length(intervals) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
