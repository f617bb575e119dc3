"""The engine's cost on a peer's tiny-step workload: Lightning's parity RNN, nbtrain against a plain loop.

Workload (Lightning's own parity benchmark model): LSTM(10, 20) -> Linear(20, 5) on the LSTM's outputs,
MSE, Adam lr 0.02, batch 30, 3,000 random sequences of 10 steps x 10 features (the target: each step's
first five features plus the last five rolled by one, Lightning's AverageDataset), 4 epochs (400 steps
of about a millisecond each), one CPU thread. A step costs so little that the engine's own per-step and
per-run work shows.

The plain loop is what a user writes by hand, holding the tensors in memory: each epoch draws the order
nbtrain's sampler draws (a seeded randperm, as DistributedSampler does), cuts each batch by index, steps
Adam, and reads its loss back every `log_every_n_steps` steps (as nbtrain does). nbtrain holds the same
TensorDataset (preload_data on auto). Each side's time is the whole call: the model's optimizer built,
4 epochs trained, the last loss read (nbtrain: Engine(...).run(), its summary and events included).
Same batches, same order: the weights after each pair are compared bit for bit.

Pairs are interleaved (A B, B A, ...) in one process, so machine noise hits both sides alike; printed:
the paired time ratio (the geometric mean of the pairs' ratios) with its 95% interval, of wall time (what
a user waits; target <= 1.02) and of this process's CPU time (the work each side did: on a machine other
processes load, time spent waiting for a CPU widens the wall-time interval, not this one); beside them
the median of the pairs' ratios with its distribution-free interval (a burst of load on one side of a few
pairs moves it far less), and each side's fastest run (other processes only ever add time).

    python -m benchmarks.peer_rnn [--pairs 15] [--epochs 4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from scipy import stats
from torch import nn
from torch.utils.data import TensorDataset

from nbtrain import Engine, Recipe, TrainConfig

from .common import machine, paired_time_ratio, ratio_line

SEQUENCES, STEPS, FEATURES, HIDDEN, OUT = 3000, 10, 10, 20, 5
BATCH, LR, SEED, LOG_EVERY = 30, 0.02, 0, 10
TARGET = "<= 1.02"


class ParityRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
        self.linear_out = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        sequence, _ = self.rnn(x)
        return self.linear_out(sequence)


def workload() -> TensorDataset:
    x = torch.randn(SEQUENCES, STEPS, FEATURES, generator=torch.Generator().manual_seed(123))
    top, bottom = x.chunk(2, -1)
    return TensorDataset(x, top + bottom.roll(shifts=1, dims=-1))


def fresh_model() -> nn.Module:
    torch.manual_seed(SEED)
    return ParityRNN()


def plain(data: TensorDataset, epochs: int) -> tuple[float, float, nn.Module]:
    x, y = data.tensors
    model = fresh_model()
    start, cpu = time.perf_counter(), time.process_time()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.MSELoss()
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SEED + epoch))
        for lo in range(0, len(order), BATCH):
            index = order[lo:lo + BATCH]
            loss = loss_fn(model(x.index_select(0, index)), y.index_select(0, index))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % LOG_EVERY == 0:
                loss.item()
    loss.item()
    return time.perf_counter() - start, time.process_time() - cpu, model


def with_nbtrain(data: TensorDataset, epochs: int) -> tuple[float, float, nn.Module]:
    model = fresh_model()
    start, cpu = time.perf_counter(), time.process_time()
    recipe = Recipe(model=model, train_data=data, loss_fn=nn.MSELoss(),
                    optimizer=lambda p: torch.optim.Adam(p, lr=LR))
    Engine(recipe, TrainConfig(accelerator="cpu", batch_size=BATCH, seed=SEED, max_epochs=epochs,
                               log_every_n_steps=LOG_EVERY)).run()
    return time.perf_counter() - start, time.process_time() - cpu, model


def interval(verdict) -> str:
    return f"{verdict.ratio:.3f} ({verdict.low:.3f}-{verdict.high:.3f})"


def median_pair(ours: list[float], theirs: list[float]) -> str:
    """The median of the pairs' ratios with its distribution-free 95% interval (order statistics): a burst of
    load that lands on one side of a few pairs moves the mean of the ratios, and widens its t-interval, far
    more than it moves their median."""
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    k = max(int(stats.binom.ppf(0.025, len(ratios), 0.5)) - 1, 0)  # P(fewer than k+1 pairs below the median)
    return f"{statistics.median(ratios):.3f} ({ratios[k]:.3f}-{ratios[-1 - k]:.3f})"


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = workload()
    plain(data, 1), with_nbtrain(data, 1)  # warm both paths (allocator, lazy imports)
    wall, cpu = {"plain": [], "nbtrain": []}, {"plain": [], "nbtrain": []}
    same = True
    for i in range(args.pairs):
        models = {}
        sides = (("plain", plain), ("nbtrain", with_nbtrain))
        for name, run in (sides if i % 2 == 0 else sides[::-1]):
            seconds, cpu_seconds, models[name] = run(data, args.epochs)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
        same = same and all(torch.equal(a, b) for a, b in
                            zip(models["plain"].parameters(), models["nbtrain"].parameters()))
    steps = args.epochs * SEQUENCES // BATCH
    print(f"peer RNN benchmark on {machine()}; LSTM({FEATURES}, {HIDDEN}) -> Linear({HIDDEN}, {OUT}), Adam, batch "
          f"{BATCH}, {args.pairs} interleaved pairs of {args.epochs} epochs ({steps} steps) a side")
    print(ratio_line("wall time, nbtrain / plain loop", wall["nbtrain"], wall["plain"], TARGET))
    print(ratio_line("CPU time, nbtrain / plain loop", cpu["nbtrain"], cpu["plain"], TARGET))
    print(f"median of the pairs' ratios (95% interval): wall {median_pair(wall['nbtrain'], wall['plain'])}, "
          f"CPU {median_pair(cpu['nbtrain'], cpu['plain'])}")
    # Other processes only ever add time: each side's fastest run is its nearest to a quiet machine's.
    print(f"fastest runs, nbtrain / plain loop: wall {min(wall['nbtrain']) / min(wall['plain']):.3f}, "
          f"CPU {min(cpu['nbtrain']) / min(cpu['plain']):.3f}")
    print(f"weights after every pair: {'bit-identical' if same else 'DIFFERENT'}")
    return {"wall time nbtrain / plain loop, paired (95% interval)":
            (interval(paired_time_ratio(wall["nbtrain"], wall["plain"])), TARGET),
            "CPU time nbtrain / plain loop, paired (95% interval)":
            (interval(paired_time_ratio(cpu["nbtrain"], cpu["plain"])), TARGET),
            "wall time nbtrain / plain loop, median pair (95% interval)":
            (median_pair(wall["nbtrain"], wall["plain"]), TARGET),
            "CPU time nbtrain / plain loop, fastest runs": (min(cpu["nbtrain"]) / min(cpu["plain"]), TARGET),
            "weights bit-identical after every pair": ("yes" if same else "NO", "yes")}


if __name__ == "__main__":
    main()
