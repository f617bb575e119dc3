"""The machine's ceilings for one config: what the loader alone and the model alone can do.

    c = nbtrain.ceilings(recipe, config=TrainConfig(batch_size=64))
    print(c.table())   # "the loader can deliver 9,800 samples/s, the model could take 41,000: data-bound"

- the loader alone: the engine's DataLoader with the config's workers and batch, iterated with
  no model, in samples/s (the steady rate of the per-batch times, worker start-up set apart);
- the model alone: training steps on one batch held in memory on the device, no loader;
- FLOPs of one training step (torch.utils.flop_counter: matmuls and convolutions) against the
  device's peak FLOP/s, measured here by a short matmul in the step's dtype (a spec sheet
  knows neither this machine's clocks nor what else runs on it): model FLOPs utilisation.

Training cannot go faster than the lower ceiling; the verdict names it and by how much. The
model and optimizer are put back exactly afterwards (trial.Snapshot), as after every trial.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from ..tools import trial
from ..config import TrainConfig
from ..engine.data import to_device
from ..engine.toggles import to_channels_last
from ..format import ratio as ratio_text
from .steady import SteadyRate, block_rates, steady_rate
from .verdict import Verdict, unpaired

_MATMUL_S = 0.02  # one timed matmul at least this long: shorter ones measure launch overhead, not the device
_MIN_S = 0.5  # each ceiling reads at least this long (and at least `steps` readings)


@dataclass
class Ceilings:
    config: TrainConfig
    device: str
    loader: SteadyRate          # samples/s the DataLoader alone delivers
    model: SteadyRate           # samples/s the model alone trains at, its batch already on the device
    ratio: Verdict              # model ceiling over loader ceiling, with its interval
    step_flops: float           # FLOPs of one optimizer step's forward and backward
    step_samples: int
    peak_flops: float           # FLOP/s of the best timed matmul
    peak_dtype: str
    peak_size: int
    source: str = "the DataLoader"  # what delivers the batches

    @property
    def kind(self) -> str:
        if not self.ratio.measurable:
            return "balanced"
        return "data-bound" if self.ratio.ratio > 1 else "compute-bound"

    def utilisation(self, samples_per_s: float | None = None) -> float:
        """Model FLOPs utilisation at `samples_per_s` (default: the model-alone ceiling), between 0 and 1."""
        rate = self.model.rate if samples_per_s is None else samples_per_s
        return self.step_flops / self.step_samples * rate / self.peak_flops if self.peak_flops > 0 else float("nan")

    def evidence(self) -> str:
        """The two ceilings in words, the binding one first."""
        loader, model = f"{self.loader.rate:,.0f}", f"{self.model.rate:,.0f}"
        if self.kind == "compute-bound":
            return f"the model can take {model} samples/s, the loader could deliver {loader}"
        return f"the loader can deliver {loader} samples/s, the model could take {model}"

    def margin(self) -> str:
        """By how much the binding ceiling binds, with its 95% interval."""
        v = self.ratio
        if self.kind == "data-bound":
            return f"the model could go {ratio_text(v.ratio, 1)} faster; 95% interval {v.interval_text()}"
        if self.kind == "compute-bound":
            return f"the loader has {ratio_text(1 / v.ratio, 1)} to spare; 95% interval {1 / v.high:.2f}-{1 / v.low:.2f}"
        return f"ratio {v.interval_text()}"

    @property
    def verdict(self) -> str:
        if self.kind == "balanced":
            return f"{self.evidence()}: balanced, neither ceiling binds measurably ({self.margin()})"
        return f"{self.evidence()}: {self.kind} ({self.margin()})"

    def lines(self, training_rate: float | None = None) -> list[str]:
        """The table's lines; with `training_rate`, also the utilisation the training itself reached."""
        c = self.config
        per_sample = self.step_flops / self.step_samples
        mfu = f"model FLOPs utilisation {100 * self.utilisation():.1f}% (model alone)"
        if training_rate is not None:
            mfu += f", {100 * self.utilisation(training_rate):.1f}% (training)"
        return [f"  loader alone  {self.loader.text()}  ({self.source}, batch {c.batch_size}, no model)",
                f"  model alone   {self.model.text()}  (one batch held on {self.device}, no loader)",
                f"  one training step: {si(self.step_flops)}FLOP ({si(per_sample)}FLOP per sample; matmuls and "
                f"convolutions counted by torch.utils.flop_counter)",
                f"  device peak: {si(self.peak_flops)}FLOP/s ({self.peak_dtype} {self.peak_size}x{self.peak_size} "
                f"matmul, measured now); {mfu}"]

    def table(self) -> str:
        c = self.config
        return "\n".join([f"nbtrain ceilings on {self.device} (batch {c.batch_size}, {c.num_workers} workers, "
                          f"{c.precision})"] + self.lines() + [f"verdict: {self.verdict}"])

    def __repr__(self) -> str:
        return f"Ceilings({self.verdict!r})"


def si(value: float) -> str:
    """1.2e9 -> '1.2 G' (the unit follows)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


@trial.keeps_live_setup
def ceilings(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None, steps: int = 30,
             seconds: float = 5.0, **parts) -> Ceilings:
    """Measure the loader alone, the model alone and the step's FLOPs for the current config; see the module doc.

    Each ceiling reads at least `steps` batches (or steps) and at least half a second of them, at
    most `seconds`: a tiny model's step lasts less than one time slice of a busy machine, and a
    rate from a few of them would be one preemption's guess.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 10:
        raise ValueError(f"steps={steps!r}: a whole number >= 10 (batches and steps measured per ceiling)")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(f"seconds={seconds!r}: a number > 0 (longest time per ceiling)")
    engine = trial.resolve(model, train_data, recipe=recipe, config=config, **parts)
    return measure_ceilings(engine, steps=steps, seconds=seconds)


def measure_ceilings(engine, *, steps: int = 30, seconds: float = 5.0) -> Ceilings:
    """The ceilings of the engine's current config; its state is restored afterwards."""
    config = trial.plain_config(engine.config)
    snapshot = trial.Snapshot(engine)
    generator = getattr(engine.loader, "generator", None)  # batches cut from held tensors have none
    generator_state = generator.get_state() if generator is not None else None
    try:
        engine.reconfigure(config)
        loader_series, batch = _loader_alone(engine, steps, seconds)
        source = (f"the DataLoader, {config.num_workers} workers" if isinstance(engine.loader, DataLoader)
                  else "batches cut from tensors held in memory (preload_data)")
        batch = to_device(batch, engine.device, False)
        if config.channels_last:
            batch = to_channels_last(batch)
        # Steps on one batch at the real rate would fit that batch until its gradients turn denormal
        # (a CPU computes those many times slower); at rate 0 every step costs what the next real one would.
        for group in engine.optimizer.param_groups:
            group["lr"] = torch.zeros_like(group["lr"]) if torch.is_tensor(group["lr"]) else 0.0
        dtype = engine.precision.dtype or torch.get_default_dtype()
        peak = peak_flops(engine.device, dtype)  # before and after the model: a passing load spike hits one
        flops, samples = step_flops(engine, batch)
        model_series = _model_alone(engine, batch, steps, seconds)
        peak = max(peak, peak_flops(engine.device, dtype), key=lambda p: p[0])
    finally:
        snapshot.restore()
        if generator_state is not None:
            generator.set_state(generator_state)
    ratio = unpaired(block_rates(*loader_series), block_rates(*model_series))
    return Ceilings(config, str(engine.device), steady_rate(*loader_series), steady_rate(*model_series), ratio,
                    flops, samples, peak[0], str(dtype).replace("torch.", ""), peak[1], source)


def _reading(steps: int, seconds: float):
    """A test 'read more?' given the readings so far: until `steps` readings and _MIN_S, at most `seconds`."""
    t0 = time.perf_counter()

    def more(count: int) -> bool:
        took = time.perf_counter() - t0
        return took < seconds and (count < steps or took < min(_MIN_S, seconds))
    return more


def _samples(batch) -> int:
    """The batch's sample count: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((n for n in map(_samples, values) if n), 0)


def _loader_alone(engine, steps: int, seconds: float):
    """(durations, samples) of the batches the engine's DataLoader yields with no model; and one batch."""
    loader = engine.loader
    loader.sampler.set_position(engine.epoch, 0)  # whole epochs; the engine repositions it before training
    durations, samples, first = [], [], None
    more = _reading(steps, seconds)
    while more(len(durations)):
        iterator = iter(loader)
        while more(len(durations)):
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            durations.append(time.perf_counter() - t0)
            samples.append(_samples(batch))
            first = batch if first is None else first
        del iterator  # a loader without persistent workers shuts them down here
    if first is None:
        raise RuntimeError("nbtrain.ceilings: the DataLoader yielded no batch")
    return (durations, samples), first


def _train_step(engine, batch):
    """One optimizer step on `batch` (each of the config's micro-batches is this batch), as the engine's loop does."""
    c, precision, model, optimizer = engine.config, engine.precision, engine.model, engine.optimizer
    k = c.accumulate_grad_batches
    for _ in range(k):
        with precision.autocast():
            loss = engine.recipe.step_loss(model, batch) / k
        precision.scaler.scale(loss).backward()
    if c.gradient_clip_val is not None:
        precision.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.gradient_clip_val)
    precision.scaler.step(optimizer)
    precision.scaler.update()
    optimizer.zero_grad(set_to_none=True)


def step_flops(engine, batch) -> tuple[float, int]:
    """(FLOPs of one training step on `batch`, its samples); the step also warms the model up."""
    counter = FlopCounterMode(display=False)
    with counter:
        _train_step(engine, batch)
    return float(counter.get_total_flops()), _samples(batch) * engine.config.accumulate_grad_batches


def _model_alone(engine, batch, steps: int, seconds: float):
    """(durations, samples) of training steps on one batch held on the device."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    # On CUDA a few steps per reading, so the clock reads the device's pace, not one step's launch gap.
    chunk = 1 if engine.device.type == "cpu" else 4
    per_step = _samples(batch) * engine.config.accumulate_grad_batches
    durations, more = [], _reading(steps, seconds)
    sync()
    while more(len(durations)):
        t0 = time.perf_counter()
        for _ in range(chunk):
            _train_step(engine, batch)
        sync()
        durations.append(time.perf_counter() - t0)
    return durations, [chunk * per_step] * len(durations)


def peak_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.3) -> tuple[float, int]:
    """(FLOP/s of the fastest of a few square matmuls in `dtype` on `device`, the matrix size)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator(device=device).manual_seed(0)  # the user's RNG streams stay untouched
    n, cap = 256, 4096 if device.type == "cpu" else 16384
    while True:
        a = torch.randn(n, n, device=device, dtype=torch.float32, generator=generator).to(dtype)
        b = torch.randn(n, n, device=device, dtype=torch.float32, generator=generator).to(dtype)
        torch.mm(a, b)  # first call: kernel selection, allocation
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        took = time.perf_counter() - t0
        if took >= _MATMUL_S or n >= cap:
            break
        n *= 2
    best, t_end, reps = took, time.perf_counter() + seconds, 1
    while time.perf_counter() < t_end or reps < 3:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2 * n**3 / best if best > 0 else math.nan, n
