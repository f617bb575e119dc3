"""How fast on N GPUs or nodes: `nbtrain.forecast`, `%%nbtrain --forecast`, the panel's Forecast button.

    f = nbtrain.forecast(model, data, devices=[1, 2, 4, 8], nodes=[1, 2], link_gbps=25, link_latency_us=10)
    print(f)                         # a range per count, what bounds it, every input labelled
    f = nbtrain.forecast(model, data, check=True)   # and the 2 ranks this machine runs, against their range

What it measures here, through trials that give the model back (the arithmetic is measure/forecast.py):
- the compute: the steady rate at the per-rank batch (the config's) of one rank on a GPU; on a CPU, of
  2 ranks at once all-reducing once per 4 micro-batches, since CPU ranks share this machine's cores and
  memory bandwidth (one rank alone would compute faster than either of 2 does);
- on a CPU, one process alone at the live run's threads (the 1 x 1 point), read at the forecast's start and again
  at its end: its range is where another run may read on this machine as its load moved (the spread of the
  readings' windows, measure/forecast.run_range), not the interval of one reading's mean;
- the gradients: the model's own trainable parameters, cut into DDP's buckets;
- the link between local ranks: 2 ranks started the way every DDP run starts (nbtrain.launch: the
  zygote's ranks; NCCL on GPUs where there are 2, gloo on the CPU), in rounds of: the step's compute
  worth of work, a one-element all-reduce (what a step waits for the slower rank), all-reduces of the
  real bucket sizes and of one element with the ranks in step (the ring model is fitted to them), and
  DDP's copies of a bucket in and out;
- the link between nodes is given (link_gbps=, link_latency_us=) or "unknown": counts over several
  nodes then show no range;
- check=True: the 2-rank run itself (nbtrain.fit, devices=2, the same config), its steady rate shown
  against the forecast for 2 ranks.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..config import TrainConfig
from ..measure.ab import nonfinite_loss, steps_lasting
from ..measure.forecast import (Quantity, fit_link, given_link, gradient_buckets, less_its_allreduce, mean_quantity,
                                one_process_step, rank_wait, scaling_point, window_rates,
                                WINDOW_S)
from ..measure.forecast_result import Check, Forecast
from ..measure.steady import SteadyRate, columns_series, steady_rate
from ..metrics import MetricsLog
from ..records import samples_start
from . import trial
from .tool_options import JointProblem, ToolRefusal, declare, option

DEFAULT_DEVICES, DEFAULT_NODES = (1, 2, 4, 8), (1, 2)
COMPUTE_ACCUMULATE = 4  # CPU: micro-batches per all-reduce while 2 ranks measure their compute
MIN_CHECK_STEPS = 20
PROBE_S = 2.0          # about this long timing all-reduces, in 10 to 30 rounds over the sizes
MAX_WORK_S = 0.05      # the work before each timed all-reduce: the step's compute, at most this


def time_allreduces(sizes: list, repetitions: int, device: str, work_s: float) -> dict:
    """On every rank of a launched group, `repetitions` rounds of: about `work_s` of fixed work (matmuls), as a
    step's backward; a one-element all-reduce, which waits for the slower rank as a step's first bucket does
    ("wait"); then an all-reduce of each size in bytes (float32 elements), the ranks now in step. Rank 0's
    seconds are the answer: {"wait": [...], "sizes": {bytes: [...]}}."""
    import os
    import torch.distributed as dist
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    square = torch.randn(96, 96, device=device)
    count = torch.tensor([_matmuls_lasting(square, work_s, device)], device=device)
    dist.broadcast(count, 0)  # the same work on every rank: rank 0's count
    one = torch.ones(1, device=device)
    tensors = [torch.ones(max(size // 4, 1), device=device) for size in sizes]
    out = {"wait": [], "sizes": {4 * t.numel(): [] for t in tensors}, "copy": [], "copy_bytes": 4 * tensors[-1].numel()}
    bucket = torch.empty_like(tensors[-1])
    dist.barrier()
    for i in range(repetitions + 2):  # the first two rounds: the connection's and the allocator's warm-up
        for _ in range(int(count.item())):
            square @ square
        for tensor in [one] + tensors:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                timed = out["wait"] if tensor is one else out["sizes"][4 * tensor.numel()]
                timed.append(time.perf_counter() - start)
        start = time.perf_counter()  # what DDP does around each bucket's all-reduce: copy in, average, copy out
        bucket.copy_(tensors[-1])
        bucket.div_(2)
        tensors[-1].copy_(bucket)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            out["copy"].append(time.perf_counter() - start)
    return out


def _matmuls_lasting(square, seconds: float, device: str) -> int:
    start, n = time.perf_counter(), 20
    for _ in range(n):
        square @ square
    if device == "cuda":
        torch.cuda.synchronize()
    return max(1, round(seconds / max((time.perf_counter() - start) / n, 1e-9)))


def probe_sizes(buckets) -> list:
    """The bucket sizes timed: the smallest, the median and the largest distinct ones, and one element."""
    distinct = sorted(set(buckets))
    picked = {distinct[0], distinct[len(distinct) // 2], distinct[-1]} if distinct else set()
    return sorted(picked | {4})


def local_link(buckets, device: str, compute_s: float):
    """(the link between 2 local ranks, how long a step's first all-reduce waits for the other rank after
    `compute_s` of work, DDP's copies around the all-reduce of the model's gradients), measured; Nones
    without 2 such devices."""
    from ..distributed.launch import launch
    if device == "cuda" and torch.cuda.device_count() < 2:
        return None, None, None
    backend, sizes, work = "nccl" if device == "cuda" else "gloo", probe_sizes(buckets), min(compute_s, MAX_WORK_S)
    rounds = int(min(max(PROBE_S / (len(sizes) * (work + 0.002)), 10), 30))
    timings = launch(time_allreduces, nprocs=2, args=(sizes, rounds, device, work), backend=backend, echo=False)
    how = f"{backend} all-reduces timed on 2 ranks started by nbtrain.launch"
    link = fit_link(timings["sizes"], 2, f"between 2 local ranks ({backend}, {device})", how)
    wait = rank_wait(timings["wait"], timings["sizes"][4], f"{how}: a one-element all-reduce after {1000 * work:.3g} "
                     f"ms of work on both, less one with the ranks in step")
    per_byte = [t / timings["copy_bytes"] for t in timings["copy"]]
    copies = mean_quantity(per_byte, sum(buckets), f"{how}: each gradient copied into its bucket, averaged and copied "
                           f"back (DDP's gradient_as_bucket_view=False), {timings['copy_bytes'] / 1e6:.3g} MB timed")
    return link, wait, copies


def rank_threads() -> int:
    """Torch threads each of 2 local ranks gets (plan.py shares the cores out)."""
    from ..distributed import plan
    return plan.for_function(2).threads_per_rank


def _joint(read: dict) -> list:
    gbps, latency = read["link_gbps"], read["link_latency_us"]
    if (gbps is None) != (latency is None):
        return [JointProblem("link_gbps", gbps, "both link_gbps and link_latency_us (the link between nodes: "
                             "its bandwidth in Gb/s and latency per hop in us), or neither (nodes then unknown)",
                             (("link_latency_us", latency),))]
    return []


@declare("forecast", "nbtrain.forecast", "scaling forecast: throughput on N devices or nodes as a range (no to "
         "full overlap of the all-reduce), what bounds it, from the compute and the link measured here", (
             option("devices", "whole_list", "devices (ranks) per node to forecast", low=1, nullable=True,
                    allowed="a list of whole numbers >= 1 (devices per node), or None (1,2,4,8)",
                    flag="forecast_devices"),
             option("nodes", "whole_list", "nodes to forecast", low=1, nullable=True,
                    allowed="a list of whole numbers >= 1 (nodes), or None (1,2)", flag="forecast_nodes"),
             option("link_gbps", "number", "the link between nodes, Gb/s", noun="a number of Gb/s", above=0,
                    nullable=True, none="unknown: counts over several nodes show no range", flag="link_gbps"),
             option("link_latency_us", "number", "the link's latency per hop, us", noun="a number of us", low=0,
                    nullable=True, none="with link_gbps=None", flag="link_latency_us"),
             option("check", "switch", "also run 2 ranks here and show them against the forecast", flag="check"),
             option("seconds", "number", "seconds of each measurement", noun="a number of seconds", above=0,
                    flag="seconds", metavar="S")),
         label="Forecast", figsize=(9, 3.2), joint=_joint)
def forecast(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
             devices: list | None = None, nodes: list | None = None, link_gbps: float | None = None,
             link_latency_us: float | None = None, check: bool = False, seconds: float = 4.0, **parts) -> Forecast:
    """The scaling forecast of the current config; see the module doc. The model and optimizer are put back."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        return _forecast(lent, devices, nodes, link_gbps, link_latency_us, check, seconds)


def _forecast(lent, devices, nodes, link_gbps, link_latency_us, check: bool, seconds: float) -> Forecast:
    engine, snapshot = lent.engine, lent  # the trial's own engine; snapshot.reset() puts it back
    config = trial.plain_config(engine.config)
    if config.world_size > 1:
        raise ToolRefusal(lambda spell: f"the config runs {config.world_size} ranks; the forecast starts from one "
                                        "(devices=1, num_nodes=1) and says what more would do")
    device = engine.device.type
    trainable = [p for p in engine.model.parameters() if p.requires_grad]
    buckets = gradient_buckets([p.numel() * p.element_size() for p in trainable])
    ranked = one_rank_rate(engine, snapshot, config, seconds)
    one_rank = ranked.steady
    read = measure_compute(engine, snapshot, config, one_rank, seconds)
    # CPU: one process, one truth: the 1 x 1 point at the threads the live run trains at, not the ranks' share
    live_threads = (config.num_threads or torch.get_num_threads()) if device == "cpu" else None
    # read at the forecast's start and again at its end, every window kept: the range another run may read spans
    # this machine's load as it moved (a live run is read at another moment, beside another share of the CPU)
    first = one_process_reading(engine, snapshot, config, ranked, live_threads, seconds) if live_threads else None
    local, wait, copies = local_link(buckets, device, read.value)
    between = given_link(link_gbps, link_latency_us) if link_gbps is not None else None
    dtype = str(trainable[0].dtype).replace("torch.", "") if trainable else "float32"
    counts = [(d, n) for n in sorted(set(nodes or DEFAULT_NODES)) for d in sorted(set(devices or DEFAULT_DEVICES))]

    def forecast_from(reading: Quantity, process: Quantity | None) -> Forecast:
        compute, b, k = reading, config.batch_size, config.accumulate_grad_batches
        if device == "cpu" and local is not None:  # read from 2 ranks that all-reduced once per step
            step = scaling_point(2, 1, reading, buckets, local, None, batch=b, wait=wait, copies=copies)
            compute = less_its_allreduce(reading, k * COMPUTE_ACCUMULATE, step.allreduce_s)
        points = [scaling_point(d, n, process if d * n == 1 and process is not None else compute, buckets, local,
                                between, batch=b, accumulate=k, wait=wait, copies=copies) for d, n in counts]
        return Forecast(str(engine.device), sum(p.numel() for p in trainable), dtype, buckets, compute, one_rank, b,
                        k, local, between, points, assumptions(device), wait=wait, copies=copies, one_process=process,
                        threads=live_threads, rank_threads=rank_threads() if live_threads else None)

    def at_the_end() -> Quantity | None:
        if not live_threads:
            return None
        again = one_process_reading(engine, snapshot, config, None, live_threads, seconds)
        return one_process(config, [first, again], live_threads)

    if not check:
        return forecast_from(read, at_the_end())
    steady = two_ranks(engine, snapshot, config, one_rank.rate, seconds)
    if device == "cpu":  # the load of a shared machine moves: the compute read again after the check, both kept
        read = spanning(read, measure_compute(engine, snapshot, config, one_rank, seconds))
    process = at_the_end()
    result = forecast_from(read, process)
    result.checks.append(Check(2, 1, steady, result.forecast_for(2, 1),
                               f"nbtrain.fit with devices=2, {steady.steady_steps} steady steps"))
    if live_threads:  # and the live run's own rate, a reading of its own, against its 1 x 1 point
        steps = steps_lasting(config.batch_size / process.value, config, seconds, low=MIN_CHECK_STEPS)
        alone = rate_at(engine, snapshot, config, live_threads, seconds, steps=steps)
        result.checks.append(Check(1, 1, alone, result.forecast_for(1, 1),
                                   f"one process at {live_threads} thread{'s' * (live_threads != 1)} as the live "
                                   f"run trains, {alone.steady_steps} steady steps"))
    return result


@dataclass(frozen=True)
class Reading:
    """One process's steady rate over a reading, and the rates of its windows (measure/forecast.window_rates)."""
    steady: SteadyRate
    windows: tuple


def read_at(engine, snapshot, config: TrainConfig, threads: int | None, seconds: float, who: str = "one process",
            steps: int | None = None) -> Reading:
    """One process's steady rate in the kernel at `threads` torch threads (a trial's run applies them; None: the
    process's own count), about `seconds` long or `steps` steps, and its windows' rates; the model is put back."""
    log = MetricsLog()
    try:
        measured = trial.measure(engine, config.replace(num_threads=threads), seconds=None if steps else seconds,
                                 steps=steps, log=log)
    finally:
        snapshot.reset()
    error = measured.error or nonfinite_loss(log)  # a diverged step's time is NaN arithmetic's, not the config's
    durations, samples = columns_series(log.columns, samples_start(log))
    steady = steady_rate(durations, samples)
    if error or not steady.rate > 0:
        raise ToolRefusal(lambda spell: f"{who}'s step could not be measured: {error or 'no rate'}")
    window = WINDOW_S if steps else min(WINDOW_S, seconds / 4)  # a short reading: enough windows to see the load move
    return Reading(steady, tuple(window_rates(durations, samples, window)))


def rate_at(engine, snapshot, config: TrainConfig, threads: int | None, seconds: float, who: str = "one process",
            steps: int | None = None) -> SteadyRate:
    """read_at's steady rate alone."""
    return read_at(engine, snapshot, config, threads, seconds, who, steps).steady


def one_process_reading(engine, snapshot, config: TrainConfig, one_rank: Reading | None, threads: int,
                        seconds: float) -> Reading:
    """A reading of one process alone at the live run's `threads` (the 1 x 1 point): the one rank's reading where
    a rank runs at that count, else one read at it."""
    alone = one_rank if one_rank is not None and threads == rank_threads() else \
        read_at(engine, snapshot, config, threads, seconds)
    if not math.isfinite(alone.steady.low):  # too few steps in `seconds` for an interval (threads stalled): steps
        alone = read_at(engine, snapshot, config, threads, seconds, steps=MIN_CHECK_STEPS)
    return alone


def one_process(config: TrainConfig, readings: list, threads: int) -> Quantity:
    """Seconds of one micro-batch step of one process alone at `threads` (the 1 x 1 point), from `readings`."""
    texts = "; then ".join(r.steady.text() for r in readings)
    return one_process_step([r.steady for r in readings], [w for r in readings for w in r.windows],
                            config.batch_size, f"one process alone at {threads} thread{'s' * (threads != 1)}: {texts}")


def one_rank_rate(engine, snapshot, config: TrainConfig, seconds: float) -> Reading:
    """One rank's reading in the kernel (on a CPU one process alone with the threads each of 2 ranks gets:
    what a DDP speed-up there is read against)."""
    threads = rank_threads() if engine.device.type == "cpu" else config.num_threads
    return read_at(engine, snapshot, config, threads, seconds, who="one rank")


def spanning(before: Quantity, after: Quantity) -> Quantity:
    """Two readings of the compute, before and after the check, as one that spans both."""
    return Quantity((before.value + after.value) / 2, min(before.low, after.low), max(before.high, after.high),
                    before.unit, before.source, f"read before and after the check: {before.how}; then {after.how}")


def measure_compute(engine, snapshot, config: TrainConfig, one_rank, seconds: float) -> Quantity:
    """Seconds of one micro-batch step per rank. On a GPU, one rank alone is one device's compute. CPU ranks
    share this machine's cores and memory bandwidth, so there the compute is read from 2 ranks training at
    once, all-reducing once per COMPUTE_ACCUMULATE micro-batches (the forecast takes that one all-reduce
    out once it is measured: measure/forecast.less_its_allreduce)."""
    b = config.batch_size
    if engine.device.type != "cpu":
        return Quantity(b / one_rank.rate, b / one_rank.high, b / one_rank.low, "s", "measured",
                        f"one rank's steady rate at batch {b}, {one_rank.text()}, on {engine.device}")
    k, threads = config.accumulate_grad_batches * COMPUTE_ACCUMULATE, rank_threads()
    both = two_ranks(engine, snapshot, config.replace(accumulate_grad_batches=k), one_rank.rate, seconds, low=8)
    how = (f"2 ranks training at once ({threads} thread{'s' * (threads != 1)} each, as the plan shares this "
           f"machine's cores), accumulate_grad_batches={k}: {both.text()}")
    return Quantity(2 * b / both.rate, 2 * b / both.high, 2 * b / both.low, "s", "measured", how)


def two_ranks(engine, snapshot, config: TrainConfig, rate: float, seconds: float, low: int = MIN_CHECK_STEPS):
    """The steady rate of `config` on 2 local ranks (trial.run_apart), about `seconds` long at `rate` samples/s
    of one rank; the model is put back."""
    checked = config.replace(devices=2, num_threads=None)  # each rank at the plan's share of the cores
    steps = steps_lasting(rate, checked, seconds, low=low)
    try:
        run = trial.run_apart(snapshot, checked, steps)
    finally:
        snapshot.reset()
    if run.status != "completed":
        raise ToolRefusal(lambda spell: f"the 2-rank run ended {run.status}")
    return run.steady()


def assumptions(device: str) -> list:
    out = ["DDP overlaps its buckets' all-reduce with backward somewhere between not at all (the low end) "
           "and fully (the high end)",
           "the bus bandwidth and latency measured between 2 local ranks hold for more local ranks (a ring's "
           "traffic per rank is the same; a machine's links may not be)",
           "one ring through every rank, as fast as its slowest hop (the link between nodes where there are several)",
           "the wait for the slower rank measured on 2 ranks holds for more (more ranks wait for the slowest of "
           "more, so there it is a lower bound)"]
    if device == "cpu":
        out.append("every rank computes as one of 2 ranks on this machine does: more CPU ranks than cores would "
                   "share them")
    return out
