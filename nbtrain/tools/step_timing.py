"""Timing one training step on a trial's engine: the loader alone, and steps on a batch held on the device.

What the ceilings (ceilings.py) read: the loader's per-batch times with no model, and optimizer
steps on one batch at the config's batch and at 2 samples of it, taken in alternation.
"""
from __future__ import annotations

import time

import torch

_MIN_S = 0.5  # each series reads at least this long (and at least `steps` readings)


def reading(steps: int, seconds: float):
    """A test 'read more?' given the readings so far: until `steps` readings and _MIN_S, at most `seconds`."""
    t0 = time.perf_counter()

    def more(count: int) -> bool:
        took = time.perf_counter() - t0
        return took < seconds and (count < steps or took < min(_MIN_S, seconds))
    return more


def batch_samples(batch) -> int:
    """The batch's sample count: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((n for n in map(batch_samples, values) if n), 0)


def loader_alone(engine, steps: int, seconds: float):
    """(durations, samples) of the batches the engine's DataLoader yields with no model; and one batch."""
    loader = engine.loader
    loader.sampler.set_position(engine.epoch, 0)  # whole epochs; the engine repositions it before training
    durations, samples, first = [], [], None
    more = reading(steps, seconds)
    while True:
        iterator, read = iter(loader), len(durations)
        while first is None or more(len(durations)):  # a first batch however long it takes (worker start-up)
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            durations.append(time.perf_counter() - t0)
            samples.append(batch_samples(batch))
            first = batch if first is None else first
        del iterator  # a loader without persistent workers shuts them down here
        if len(durations) == read or not more(len(durations)):  # an empty pass, or read enough
            break
    if first is None:
        raise RuntimeError("nbtrain.ceilings: the DataLoader yielded no batch")
    return (durations, samples), first


def train_step(engine, batch, counter=None):
    """One optimizer step on `batch` (each of the config's micro-batches is this batch), as the engine's loop
    does; a device_rates.StepCounter, when given, is told when the optimizer's part begins. Returns the last
    micro-batch's loss (on the device: reading it is the caller's choice)."""
    c, precision, model, optimizer = engine.config, engine.precision, engine.model, engine.optimizer
    k = c.accumulate_grad_batches
    for _ in range(k):
        with precision.autocast():
            loss = engine.recipe.step_loss(model, batch) / k
        precision.scaler.scale(loss).backward()
    if counter is not None:
        counter.phase = "optimizer"
    if c.gradient_clip_val is not None:
        precision.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.gradient_clip_val)
    precision.scaler.step(optimizer)
    precision.scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _head(batch, count: int, samples: int):
    """The first `count` samples of a (nested) batch: every tensor whose first dimension is the batch's."""
    if isinstance(batch, torch.Tensor):
        return batch[:count] if batch.dim() and len(batch) == samples else batch
    if isinstance(batch, dict):
        return {k: _head(v, count, samples) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_head(b, count, samples) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_head(b, count, samples) for b in batch)
    return batch


def small_batch(engine, batch):
    """2 samples of `batch` (1 of a batch of 2 or 3), warmed up; None where the step cannot run on it."""
    n = batch_samples(batch)
    if n < 2:
        return None
    small = _head(batch, 2 if n >= 4 else 1, n)
    try:
        train_step(engine, small)
    except Exception:  # a model that needs its batch size (a fixed reshape): the host ceiling goes unmeasured
        engine.optimizer.zero_grad(set_to_none=True)
        return None
    return small


def model_alone(engine, batch, small, steps: int, seconds: float):
    """((durations, samples) of training steps on one batch held on the device, durations at the small
    batch): readings in alternation, so a change of the machine's load hits both sides alike."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    # On CUDA a few steps per reading, so the clock reads the device's pace, not one step's launch gap.
    chunk = 1 if engine.device.type == "cpu" else 4
    per_step = batch_samples(batch) * engine.config.accumulate_grad_batches
    full, little, more = [], [], reading(steps, seconds)
    sync()
    while more(len(full)):
        for data, series in ((batch, full), (small, little)):
            if data is None:
                continue
            t0 = time.perf_counter()
            for _ in range(chunk):
                train_step(engine, data)
            sync()
            series.append((time.perf_counter() - t0) / chunk)
    return (full, [per_step] * len(full)), little
