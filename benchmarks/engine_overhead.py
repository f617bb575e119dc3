"""The engine's own cost per step: nbtrain against a plain loop on a model that costs almost nothing.

Workload: nn.Linear(8, 1), MSE, SGD, batch 2, 40,000 random samples (20,000 steps an
epoch), one CPU thread. The data is held in memory on both sides, so only the loop differs:
nbtrain holds the TensorDataset itself (preload_data=True) and cuts each batch by index in
its sampler's shuffled order; the plain loop cuts the same batches from the same tensors
in the same order (a seeded randperm, as DistributedSampler draws it) and reads its loss
back every `log_every_n_steps` steps, as nbtrain does. Same batches, same order: the
weights after the last block are compared bit for bit.

Each block is one epoch per side, run alternately (A B, B A, ...) in one process so machine
noise hits both alike. Each side timestamps its own steps; seconds per step are taken from
step 1,000 to the epoch's end (nbtrain: its history's "time" column). Printed: each side's
us per step, and nbtrain's minus the plain loop's with a paired 95% t-interval over blocks.
Target: <= 20 us a step.

    python -m benchmarks.engine_overhead [--blocks 9] [--samples 40000]
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from scipy import stats
from torch import nn
from torch.utils.data import TensorDataset

from nbtrain import Engine, Recipe, TrainConfig
from nbtrain.measure import paired

from .common import machine, median

BATCH, LR, SEED, LOG_EVERY, SKIP = 2, 0.01, 0, 10, 1000


def workload(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(samples, 8, generator=g), torch.randn(samples, 1, generator=g))


def fresh_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Linear(8, 1)


class Plain:
    """The hand-written loop, one epoch per call, continuing where it stopped (model, optimizer, epoch)."""

    def __init__(self, data: TensorDataset):
        self.x, self.y = data.tensors
        self.model = fresh_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.loss_fn = nn.MSELoss()
        self.epoch = 0

    def epoch_s_per_step(self) -> float:
        model, optimizer, loss_fn, x, y = self.model, self.optimizer, self.loss_fn, self.x, self.y
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SEED + self.epoch))
        self.epoch += 1
        start = None
        for step, lo in enumerate(range(0, len(order), BATCH), 1):
            index = order[lo:lo + BATCH]
            loss = loss_fn(model(x.index_select(0, index)), y.index_select(0, index))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                loss.item()
            if step == SKIP:
                start = time.perf_counter()
        return (time.perf_counter() - start) / (step - SKIP)


def nbtrain_engine(data: TensorDataset) -> Engine:
    recipe = Recipe(model=fresh_model(), train_data=data, loss_fn=nn.MSELoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=LR))
    return Engine(recipe, TrainConfig(accelerator="cpu", batch_size=BATCH, seed=SEED, max_epochs=1,
                                      log_every_n_steps=LOG_EVERY, preload_data=True))


def nbtrain_s_per_step(engine: Engine) -> float:
    history = engine.run().history  # max_epochs=1: the next epoch of the same model and optimizer
    step, t = history["step"], history["time"]
    first = step[0] + SKIP - 1  # the row of the run's SKIP-th step, as the plain loop counts
    return (t[-1] - t[first - step[0]]) / (step[-1] - first)


def difference(a, b) -> tuple[float, float, float]:
    """mean(b - a) with its 95% t-interval, over paired blocks."""
    d = np.asarray(b) - np.asarray(a)
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--samples", type=int, default=40_000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = workload(args.samples)
    plain, engine = Plain(data), nbtrain_engine(data)
    assert engine.held_data is not None, engine.notes
    times = {"plain": [], "nbtrain": []}
    for block in range(args.blocks + 1):  # block 0 warms both up and is not counted
        sides = (("plain", plain.epoch_s_per_step), ("nbtrain", lambda: nbtrain_s_per_step(engine)))
        for name, run in (sides if block % 2 else sides[::-1]):
            seconds = run()
            if block:
                times[name].append(seconds)
    ours, theirs = times["nbtrain"], times["plain"]
    mean, low, high = (1e6 * v for v in difference(theirs, ours))
    verdict = paired([1 / s for s in theirs], [1 / s for s in ours])  # steps/s: nbtrain's over the plain loop's
    same = all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), engine.model.parameters()))
    steps = len(data) // BATCH
    print(f"engine overhead benchmark on {machine()}; nn.Linear(8, 1), batch {BATCH}, data held in memory on both "
          f"sides, {args.blocks} interleaved blocks of one epoch ({steps:,} steps, timed from step {SKIP:,})")
    print(f"plain loop: {1e6 * median(theirs):.1f} us a step ({', '.join(f'{1e6 * s:.1f}' for s in theirs)})")
    print(f"nbtrain:    {1e6 * median(ours):.1f} us a step ({', '.join(f'{1e6 * s:.1f}' for s in ours)})")
    print(f"nbtrain's own cost: {mean:+.1f} us a step (95% interval {low:+.1f} to {high:+.1f}; target <= 20); "
          f"nbtrain vs plain loop: {verdict.text()}")
    print(f"weights after {(args.blocks + 1) * steps:,} steps each: {'bit-identical' if same else 'DIFFERENT'} "
          f"({engine.held_data.note})")
    return {"nbtrain - plain loop, us/step (95% interval)": (f"{mean:.1f} ({low:.1f} to {high:.1f})", "<= 20"),
            "same batches (weights bit-identical)": ("yes" if same else "NO", "yes")}


if __name__ == "__main__":
    main()
