"""The four ceilings as a checklist tool: `nbtrain.ceilings`, the `%%nbtrain --ceilings` flag, the
panel's Ceilings button. What the readings say is measure/ceilings.py's; this module reads them.

Each ceiling is read in a trial (tools/trial.borrow), as every tool reads: the live engine is never reached
and the model is given back bit for bit.
- data: the trial engine's loader alone with the config's workers and batch, no model (worker start-up set
  apart);
- host and device: steps on one batch held on the device, timed at the config's batch and at 2 samples of
  it, in alternation: t(b) = host + device * b; the intercept is the host's (Python, dispatch, launches, the
  optimizer, the weights' own traffic), the slope the device's;
- compute: the step's FLOPs (torch.utils.flop_counter: matmuls and convolutions) and the peak FLOP/s of a
  matmul in the step's dtype, measured now;
- memory: the bytes the step's operations read and write, and the bandwidth of a large copy, measured now;
- on CUDA, the GPU's busy fraction (the union of kernel intervals from torch.profiler over the step's wall
  time).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
from torch.utils.data import DataLoader

from ..config import TrainConfig
from ..engine import threads
from ..engine.data import refusal, to_device
from ..engine.state import Snapshot
from ..engine.toggles import to_channels_last
from ..measure import device_rates
from ..measure.ceilings import Ceilings, ThreadRace
from ..measure.load import Meter
from ..measure.steady import block_rates, steady_rate, warmup_length
from ..measure.verdict import paired, unpaired
from . import trial
from .gradient_noise import read_noise_scale
from .ab import compare_on, diverged_refusal
from .step_timing import batch_samples, loader_alone, model_alone, small_batch, train_step
from .tool_options import declare, option


_NOISE_SCALE_S = 2.0  # at most this long for the critical batch size (at least 5 repeats: gradient_noise.py)
# Remedies that are one cheap setting: raced on the live model (ab's alternating blocks) instead of only said. Others
# (compile: minutes of compiling; a batch or workers: another loader; preload, cache) stay ideas with their reason.
CHEAP = {"precision": {"precision": "bf16-mixed"}, "channels_last": {"channels_last": True},
         "matmul_precision": {"matmul_precision": "high"}}
_RACE_BLOCK_S = 0.1  # each block of a remedy's race: short, as every ceiling's reading is


@declare("ceilings", "nbtrain.ceilings", "the step's four ceilings (data, host, compute, memory), each measured "
         "with its interval, the binding one first, and the remedies in the order the numbers favour", (
             option("steps", "whole", "batches and steps measured per ceiling",
                    note="batches and steps measured per ceiling", low=10),
             option("seconds", "number", "longest time per ceiling", noun="a number of seconds",
                    note="longest time per ceiling", above=0),
             option("race_s", "number", "seconds each cheap remedy (bf16, channels_last, TF32) is raced on the live "
                    "model against the config; 0: none raced, each said as an idea", noun="a number of seconds",
                    note="seconds per raced remedy", low=0)),
         label="Ceilings", figsize=(7, 2.6))
def ceilings(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None, steps: int = 30,
             seconds: float = 5.0, race_s: float = 2.0, **parts) -> Ceilings:
    """Measure the four ceilings of the current config (see the module doc), in a trial: the live engine is
    never reached and the model is given back bit for bit.

    Each ceiling reads at least `steps` batches (or steps) and at least half a second of them, at
    most `seconds`: a tiny model's step lasts less than one time slice of a busy machine, and a
    rate from a few of them would be one preemption's guess.

    A remedy that is one cheap setting (CHEAP) is then raced on the live model against the config for about
    `race_s` seconds (ab's alternating blocks): its line says the measured ratio, never a peak's.
    """
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        reading = measure_ceilings(lent.engine, steps=steps, seconds=seconds)
        if race_s:
            reading.raced = race_remedies(lent, reading.bottleneck().remedies[:4], race_s)
        try:  # the critical batch size beside the ceilings (gradient_noise.py), in the same trial
            reading.noise_scale = read_noise_scale(lent.engine, seconds=min(seconds, _NOISE_SCALE_S))
        finally:
            lent.reset()
        return reading


def measure_ceilings(engine, *, steps: int = 30, seconds: float = 5.0, known: dict | None = None) -> Ceilings:
    """The ceilings of a trial engine's current config; its state is put back afterwards.

    `known`: the device's rates measured before (matmul peaks by dtype, copy bandwidth), read from it and
    added to it: they belong to the machine, not the config, so a caller reading several configs (the
    checklist walk) measures them once. A loss that is not finite ends the reading (a ToolRefusal, as ab's):
    the steps would time NaN arithmetic, not the config."""
    known = {} if known is None else known
    config = trial.plain_config(engine.config)
    snapshot = Snapshot(engine)
    device, busy, low_peak, peak_readings = engine.device, None, None, ()
    stack = contextlib.ExitStack()
    try:
        engine.reconfigure(config)
        # the readings at the config's threads (a run applies them in Engine.run; these steps are timed alone)
        stack.enter_context(threads.held(config.num_threads))
        with Meter() as loader_load:
            loader_series, batch = loader_alone(engine, steps, seconds)
        held = not isinstance(engine.loader, DataLoader)
        recipe = engine.recipe
        hold_refused = None if held else refusal(recipe.train_data, config, recipe.collate_fn, recipe.fixed_loader)
        source = (f"the DataLoader, {config.num_workers} workers" if not held
                  else "batches cut from tensors held in memory (preload_data)")
        batch = to_device(batch, device, False)
        if config.channels_last:
            batch = to_channels_last(batch)
        # Steps on one batch at the real rate would fit that batch until its gradients turn denormal
        # (a CPU computes those many times slower); at rate 0 every step costs what the next real one would.
        for group in engine.optimizer.param_groups:
            group["lr"] = torch.zeros_like(group["lr"]) if torch.is_tensor(group["lr"]) else 0.0
        dtype = engine.precision.dtype or torch.get_default_dtype()
        rates_s = min(0.3, seconds / 2)  # each device rate's repetitions: a short reading (the walk's) is short
        peak = known.get(dtype) or device_rates.peak_flops(device, dtype, rates_s)  # before and after the model:
        memory = known.get("bandwidth") or device_rates.bandwidth(device, rates_s)  # a passing load hits one
        loss = train_step(engine, batch)  # warm-up: lazy state, allocator
        if not torch.isfinite(loss):  # the steps would time NaN arithmetic
            raise diverged_refusal("the current config", f"the loss became {loss.item()}")
        counts = device_rates.count_step(lambda counter: train_step(engine, batch, counter))
        small = small_batch(engine, batch)
        with Meter() as model_load:  # how busy the machine was while the model alone was read
            full_series, small_series = model_alone(engine, batch, small, steps, seconds)
        threads_race = race_fewer_threads(engine, batch, seconds) if device.type == "cpu" \
            and model_load.last.waited else None
        if device.type == "cuda":
            busy = device_rates.busy_fraction(lambda: train_step(engine, batch))
        if dtype not in known:  # read again after the model: apart, the machine's load changed meanwhile
            peak_readings = (peak, device_rates.peak_flops(device, dtype, rates_s))
            peak = max(peak_readings, key=lambda p: p.value)
        if dtype == torch.float32:
            low_peak = known.get(torch.bfloat16) or device_rates.peak_flops(device, torch.bfloat16, rates_s)
            known[torch.bfloat16] = low_peak
        known[dtype], known["bandwidth"] = peak, memory
    finally:
        stack.close()
        snapshot.restore()
    n = batch_samples(batch)
    warm = warmup_length(full_series[0])
    split = (device_rates.host_split(full_series[0][warm:], small_series[warm:], n, batch_samples(small))
             if small is not None and len(small_series) - warm >= 3 else None)
    ratio = unpaired(block_rates(*loader_series), block_rates(*full_series))
    has_convolutions = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in engine.model.modules())
    return Ceilings(config, str(device), steady_rate(*loader_series), steady_rate(*full_series), ratio, counts,
                    n * config.accumulate_grad_batches, peak, memory, split, busy, low_peak, has_convolutions, held,
                    source, hold_refused=hold_refused, peak_readings=peak_readings, model_load=model_load.last,
                    loader_load=loader_load.last, threads_race=threads_race)


THREAD_RACE_PAIRS = 6  # pairs of blocks: enough for an interval (withheld.FEWEST_PAIRS) with two to spare


def race_fewer_threads(engine, batch, seconds: float) -> ThreadRace | None:
    """The model alone at half its torch threads (one on 2 cores) beside it at its own count, in alternating
    blocks (the order flipped every pair), about a second in all and at most a third of `seconds`: where its
    threads waited for a free CPU, the remedy the host reading offers is a measured one. None at one thread."""
    now = torch.get_num_threads()
    if now < 2:
        return None
    fewer, n = max(now // 2, 1), batch_samples(batch)
    block_s = min(1.0, seconds / 3) / (2 * THREAD_RACE_PAIRS)
    rates = {now: [], fewer: []}
    for pair in range(THREAD_RACE_PAIRS):
        for count in ((now, fewer) if pair % 2 == 0 else (fewer, now)):
            with threads.held(count):
                train_step(engine, batch)  # the pool at its new size warms up outside the timed block
                done, t0 = 0, time.perf_counter()
                while done < 2 or time.perf_counter() - t0 < block_s:
                    train_step(engine, batch)
                    done += 1
                rates[count].append(done * n * engine.config.accumulate_grad_batches / (time.perf_counter() - t0))
    return ThreadRace(now, fewer, paired(rates[now], rates[fewer]), float(statistics.median(rates[fewer])))


def race_remedies(lent, remedies, seconds: float) -> dict:
    """{item: ABResult} of each cheap remedy among `remedies` (CHEAP) against the trial's config, each in ab's
    alternating blocks for about `seconds`; one that cannot run here (bf16 on a device without it) is left an idea."""
    base = trial.plain_config(lent.engine.config)
    out = {}
    for item in dict.fromkeys(r.item for r in remedies if r.item in CHEAP):
        changed = base.replace(**CHEAP[item])
        if not changed.changed_from(base):
            continue
        try:
            out[item] = compare_on(lent.engine, lent, base, changed, block_steps=6, block_s=_RACE_BLOCK_S,
                                   min_pairs=4, max_pairs=12, budget_s=seconds)
        except Exception:  # noqa: BLE001 - a remedy that cannot run here stays an idea, said with its reason
            pass
        finally:
            lent.reset()
    return out
