"""A simulated machine behind the checklist walk's measurement seam (nbtrain/walk/bench.py), to develop the walk
against without a GPU: seeded, deterministic, seconds to run.

A `Landscape` states a machine and a model as costs; `SimulatedMachine` turns a TrainConfig into a
step time from them, measures blocks of it under noise, reads its four ceilings (a real `Ceilings`,
judged by the real measure/bottleneck.py) and advances its own clock by what each of those would
take on the machine. The cost of one optimizer step of batch b:
- host: a fixed cost per operation (forward and backward, fewer compiled; the optimizer's per
  parameter for-loop, one operation per group for 'foreach', fewer still 'fused' on CUDA; casts
  under autocast), plus the main process's share of loading: the whole per-sample cost without
  workers, only receiving the batch with them (per sample and per batch), slicing with the data held in memory; a pageable
  copy to the GPU blocks the host, a pinned one does not;
- device: compute per sample at the peak of its precision (cuDNN runs float32 convolutions on TF32
  by default: cheap; float32 matmuls run on TF32 only at matmul_precision 'high'; channels_last makes
  tensor-core convolutions faster) or the bytes moved per sample at the bandwidth (half the bytes in
  16 bits, fewer compiled), whichever is longer; plus the input's copy;
- on CUDA the host runs ahead of the device (the step takes the longer of the two), on a CPU the
  two add up; DataLoader workers deliver in parallel (the per-sample cost divided among the workers
  the cores can run, the rest contending with the step), and a worker start-up and compile time
  are paid the first time a config runs;
- a batch whose activations pass the memory limit does not run (out of memory).
Blocks see the true rate times a slowly drifting load, per-block noise and rare bursts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nbtrain.config import TrainConfig
from nbtrain.measure.ceilings import Ceilings
from nbtrain.measure.noise_scale import noise_scale
from nbtrain.measure.device_rates import Busy, HostSplit, Rate, StepCount
from nbtrain.measure.forecast import ring_allreduce_s
from nbtrain.measure.race import Block
from nbtrain.measure.steady import SteadyRate
from nbtrain.measure.verdict import Verdict
from nbtrain.walk.items import Tried
from nbtrain.measure.learned import Learned

_LOW = ("bf16-mixed", "16-mixed", "bf16-true", "16-true")


@dataclass(frozen=True)
class Fabric:
    """A simulated link between ranks: an all-reduce on it takes the ring model's time (measure/forecast.py)
    times noise, as the forecast's probe times real ones. The defaults: NVLink between one server's GPUs."""
    gbps: float = 1000.0             # bus bandwidth, Gb/s
    latency_us: float = 10.0         # per hop
    noise: float = 0.05

    def allreduce_timings(self, sizes, ranks: int = 2, repetitions: int = 10, seed: int = 0) -> dict:
        """{bytes: [seconds, ...]}: `repetitions` timed all-reduces of each size on `ranks` ranks."""
        rng = np.random.default_rng(seed)
        true = {int(s): ring_allreduce_s([s], ranks, self.gbps * 1e9 / 8, self.latency_us * 1e-6) for s in sizes}
        return {s: (t * np.exp(rng.normal(0, self.noise, repetitions))).tolist() for s, t in true.items()}


@dataclass(frozen=True)
class Landscape:
    name: str
    start: TrainConfig
    cuda: bool = True
    cores: int = 16
    samples: int = 16384
    host_op_s: float = 8e-6          # seconds of host work per operation launched
    model_ops: int = 400             # operations of forward and backward
    optimizer_ops: int = 250         # operations of a for-loop optimizer step
    compiled_ops: float = 0.35       # share of the model's operations left after torch.compile
    flops: float = 1.7e9             # FLOPs per sample, forward and backward
    conv_share: float = 0.9          # of them in convolutions
    peak_fp32: float = 60e12         # FLOP/s of a float32 matmul (no TF32)
    peak_tf32: float = 400e12
    peak_bf16: float = 700e12
    channels_last_gain: float = 1.25  # tensor-core convolutions in channels_last
    traffic: float = 2e6             # bytes moved per sample in float32
    bandwidth: float = 4e12
    loader_s: float = 16e-6          # main-process seconds per sample without workers
    receive_s: float = 1.5e-6        # main-process seconds per sample received from workers
    receive_batch_s: float = 0.0     # main-process seconds per batch received from workers (queue, unpickling)
    held_s: float = 5e-9             # seconds per sample cut from held tensors
    holdable: bool = True            # the held-data rule holds this dataset
    input_bytes: float = 12288       # bytes per sample copied to the device
    pageable_bw: float = 6e9
    pinned_bw: float = 25e9
    worker_start_s: float = 1.5
    compile_s: float = 40.0
    activation_bytes: float = 4e6    # per sample in float32
    memory: float = 140e9
    noise: float = 0.04
    drift: float = 0.02
    burst_p: float = 0.03            # chance of a block slowed by a burst of other load
    burst: float = 0.6               # the rate a burst leaves
    has_conv: bool = True
    fabric: Fabric = Fabric()        # between the machine's own devices
    unexplained_s: float = 0.0       # device seconds per sample none of the four ceilings counts (element-wise
    #                                  operations' overheads, allocation): the step falls short of every ceiling
    b_noise: float = math.inf        # the gradient noise scale: a global batch B takes 1 + B/b_noise times the
    #                                  samples of a tiny batch to reach a loss (McCandlish et al. 2018)
    loss_samples: float = 2e5        # samples (at a tiny batch) over which the loss falls by e of its way down
    loss_noise: float = 0.003        # a held-out loss's relative noise from one equal-time training to another
    busy_cores: float = 0.0          # CPU: cores other processes keep busy (a laptop's other work)
    thread_parallel: float = 0.5     # CPU: the share of the device's work torch's threads split
    oversubscribed: float = 4.0      # CPU: the step's slowdown per thread more than the free cores (it waits for a
    #                                  core, and the threads waiting on it stall too)


def _low(c: TrainConfig) -> bool:
    return c.precision in _LOW


def thread_factor(land: Landscape, c: TrainConfig) -> float:
    """A CPU's device time at the config's threads (torch's default: a thread per core) over its time at the
    default on a quiet machine: the threads split `thread_parallel` of the work among the free cores, and each
    thread beyond them stalls the step (1 on a GPU, and at the default on a quiet CPU)."""
    if land.cuda:
        return 1.0

    def time(threads: int, busy: float) -> float:
        free = max(land.cores - busy, 0.5)
        split = (1 - land.thread_parallel) + land.thread_parallel / min(threads, free)
        return split * (1 + land.oversubscribed * max(threads - free, 0.0))
    return time(c.num_threads or land.cores, land.busy_cores) / time(land.cores, 0.0)


def parts(land: Landscape, c: TrainConfig) -> dict:
    """Seconds per step of config `c`: host (the model's and the main process's loading), device, the loader's
    own time per step with workers (0 without), and whether it fits in memory."""
    b, low = c.batch_size, _low(c)
    ops = land.model_ops * (land.compiled_ops if c.compile != "none" else 1) * (1.2 if low else 1)
    opt = {"foreach": 12, "fused": 3 if land.cuda else 12}.get(c.optimizer_impl, land.optimizer_ops)
    host = land.host_op_s * (ops + opt)
    gain = land.channels_last_gain if c.channels_last and (low or land.cuda) else 1.0
    conv_peak = (land.peak_bf16 if low else land.peak_tf32 if land.cuda else land.peak_fp32) * gain
    mm_peak = land.peak_bf16 if low else land.peak_tf32 if c.matmul_precision in ("high", "medium") else land.peak_fp32
    compute = b * land.flops * (land.conv_share / conv_peak + (1 - land.conv_share) / mm_peak)
    memory = b * land.traffic * (0.55 if low else 1) * (0.7 if c.compile != "none" else 1) / land.bandwidth
    device = (max(compute, memory) + b * land.unexplained_s) * thread_factor(land, c)
    held = bool(c.preload_data) and land.holdable
    loader = 0.0
    if held:
        host += b * land.held_s
    else:
        if land.cuda:
            copy = b * land.input_bytes / (land.pinned_bw if c.pin else land.pageable_bw)
            device += copy
            host += 0 if c.pin else copy
        n = c.num_workers
        if n == 0:
            host += b * land.loader_s
        else:
            busy = min(n, max(land.cores - 1, 1))
            host += b * land.receive_s + land.receive_batch_s
            loader = b * land.loader_s / busy
            if n > land.cores - 1:  # more workers than free cores: they take the step's own time
                host *= 1 + 0.15 * (n - land.cores + 1)
    fits = b * land.activation_bytes * (0.6 if low else 1) <= land.memory
    return {"host": host, "device": device, "compute": compute, "memory": memory, "loader": loader,
            "held": held, "fits": fits}


def true_rate(land: Landscape, c: TrainConfig) -> float:
    """Samples/s of config `c` in the steady state (0 where it does not fit in memory)."""
    p = parts(land, c)
    if not p["fits"]:
        return 0.0
    model = max(p["host"], p["device"]) if land.cuda else p["host"] + p["device"]
    return c.batch_size / max(model, p["loader"])


def start_up_s(land: Landscape, c: TrainConfig) -> float:
    """Seconds paid the first time a config runs: its workers' start-up, its compile."""
    return workers_start_s(land, c) + (land.compile_s if c.compile != "none" else 0.0)


def workers_start_s(land: Landscape, c: TrainConfig) -> float:
    """The part of start_up_s paid again when a config's workers were stopped (after a race it did not go on in)."""
    return land.worker_start_s + 0.05 * c.num_workers if c.num_workers and not c.preload_data else 0.0


class Here:
    """What the items ask of the machine (walk.bench.Here, as EngineFacts answers it)."""

    def __init__(self, land: Landscape):
        self.land, self.samples, self.cuda = land, land.samples, land.cuda
        self.cores, self.has_conv2d = land.cores, land.has_conv
        self.threads = land.cores  # torch's default: a thread per core

    def holding(self, current):
        if not self.land.holdable:
            return False, None, "the dataset is not a TensorDataset the held-data rule holds"
        size = f"{self.land.samples * self.land.input_bytes / 2**20:,.0f} MB held on " + \
            ("cuda" if self.land.cuda else "cpu")
        return bool(current.preload_data), size, ""

    def optimizer_refusal(self, impl: str) -> str:
        return "" if impl != "fused" or self.land.cuda else "fused kernels are for CUDA tensors"

    def ddp_refusal(self, config) -> str:
        return "one simulated device"


@dataclass
class SimulatedMachine:
    """The bench of a Landscape (a walk.bench.Bench): blocks, trials and ceilings on a simulated clock (see the
    module doc)."""
    land: Landscape
    seed: int = 0
    block_overhead_s: float = 0.05
    now: float = 0.0
    seen: set = field(default_factory=set)     # configs run once (compiled)
    running: set = field(default_factory=set)  # configs whose workers are up
    blocks: list = field(default_factory=list)
    stepping: tuple = (None, "")  # how often the user's schedule is stepped, and which: ('step', 'LambdaLR ...')

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        self.load, self.read = 1.0, False
        self.here = Here(self.land)
        self.start = self.land.start
        self.device_type = "cuda" if self.land.cuda else "cpu"
        self.device = f"{self.device_type} (simulated: {self.land.name})"

    def clock(self) -> float:
        return self.now

    def _spend(self, config, seconds: float) -> None:
        self.now += seconds + self.block_overhead_s
        if config not in self.seen:
            self.seen.add(config)
            self.running.add(config)
            self.now += start_up_s(self.land, config)
        elif config not in self.running:  # compiled before; its workers were stopped at the end of a race
            self.running.add(config)
            self.now += workers_start_s(self.land, config)

    def _observed(self, rate: float) -> float:
        self.load = min(max(self.load * math.exp(self.rng.normal(0, self.land.drift)), 0.7), 1.3)
        burst = self.land.burst if self.rng.random() < self.land.burst_p else 1.0
        return rate * self.load * burst * math.exp(self.rng.normal(0, self.land.noise))

    def block(self, config, seconds: float, current=None) -> Block:
        self.blocks.append(config)
        self._spend(config, seconds)
        rate = true_rate(self.land, config)
        if rate <= 0:
            return Block(float("nan"), [], "out of memory")
        observed = self._observed(rate)
        return Block(observed, list(observed * np.exp(self.rng.normal(0, self.land.noise, 4))))

    def trial(self, config, seconds: float, current=None) -> Tried:
        blocks = [self.block(config, seconds / 6) for _ in range(6)]
        if blocks[0].note:
            return Tried("", config, None, blocks[0].note)
        rates = [b.rate for b in blocks]
        return Tried("", config, float(np.median(rates)), blocks=rates)

    def noise_scale(self, config, seconds: float):
        """B_simple as measure/noise_scale.py reads it from norms drawn as the landscape's b_noise says (|G|^2 = 1,
        tr(Sigma) = b_noise; each norm within a few percent): the critical batch the walk's batch row shows."""
        self._spend(config, seconds)
        b = config.global_batch_size
        if math.isinf(self.land.b_noise):
            return noise_scale([1.0, 1.0], [1.0, 1.0], b, 8 * b)  # no gradient noise: no B_simple to give
        jitter = lambda: math.exp(self.rng.normal(0, 0.02))  # noqa: E731
        small = [(1 + self.land.b_noise / b) * jitter() for _ in range(20)]
        big = [(1 + self.land.b_noise / (8 * b)) * jitter() for _ in range(20)]
        return noise_scale(small, big, b, 8 * b)

    def quality(self, config, seconds: float, current=None) -> Learned:
        """The held-out loss after `seconds` of `config` from the start's weights: 4 falling to 2 with the samples
        seen, each worth 1 / (1 + B / b_noise) of a tiny batch's (B the global batch)."""
        self._spend(config, seconds)
        rate = true_rate(self.land, config)
        if rate <= 0:
            return Learned(float("nan"), note="out of memory")
        worth = self._observed(rate) * seconds / (1 + config.global_batch_size / self.land.b_noise)
        loss = 2 + 2 * math.exp(-worth / self.land.loss_samples)
        return Learned(loss * math.exp(self.rng.normal(0, self.land.loss_noise)), "held-out (simulated)")

    def race_over(self, keep=()) -> None:
        self.running &= set(keep)  # as walk/bench.py: only the configs the walk goes on with keep their workers

    def bottleneck(self, config, seconds: float):
        """The four ceilings as nbtrain.ceilings would read them here, judged by the real measure/bottleneck.py."""
        return self.ceilings(config, seconds).bottleneck()

    def ceilings(self, config, seconds: float) -> Ceilings:
        """The four ceilings as nbtrain.ceilings would read them here (each within a few percent)."""
        self._spend(config, 4 * seconds + 0.3 + (0.0 if self.read else 2.5))  # the device's peaks: the first time only
        self.read = True
        land, p, b = self.land, parts(self.land, config), config.batch_size
        jitter = lambda v: v * math.exp(self.rng.normal(0, 0.05))  # noqa: E731

        def rate(v):
            v = jitter(v)
            return Rate(v, v * 0.93, v * 1.07)

        def steady(v):
            v = jitter(v)
            return SteadyRate(v, v * 0.95, v * 1.05, 0.04, 3, 0.1, 30, 1.0)

        data_host = b * (land.held_s if p["held"] else land.loader_s if config.num_workers == 0 else land.receive_s) \
            + (land.receive_batch_s if config.num_workers and not p["held"] else 0.0)
        loader_per_step = p["loader"] or data_host
        model_host = max(p["host"] - data_host, 1e-9)
        model_step = max(model_host, p["device"]) if land.cuda else model_host + p["device"]
        loader, model = steady(b / loader_per_step), steady(b / model_step)
        ratio = model.rate / loader.rate
        low = _low(config)
        peak = land.peak_bf16 if low else land.peak_tf32 if config.matmul_precision in ("high", "medium") \
            else land.peak_fp32
        traffic = b * land.traffic * (0.55 if low else 1)
        split = HostSplit(b, max(b // 2, 1), rate(model_host), rate(p["device"]), rate(model_host / p["device"]))
        busy = Busy(rate(min(p["device"] / model_step, 1.0)), land.model_ops, 20.0) if land.cuda else None
        return Ceilings(config, self.device_type, loader, model, Verdict(ratio, ratio * 0.9, ratio * 1.1, 0, paired=False),
                        StepCount(b * land.flops, traffic, land.model_ops, land.optimizer_ops), b, rate(peak),
                        rate(land.bandwidth), split, busy, None if low else rate(land.peak_bf16), land.has_conv,
                        p["held"], cores=land.cores)

    def apart(self, label, config, steps):
        return Tried(label, config, None, "one simulated device")

    def checked_lr(self, config):
        return config, []

    def schedule_note(self) -> str:
        return ""

    def schedule_stepping(self) -> tuple:
        return self.stepping  # the user's schedule, as the landscape's test gives it (none by default)

    def restore(self, config=None) -> None:
        pass
