"""Flat cost as runs grow long: kernel memory after a million steps, and the live plot's redraw time.

Workload: a tiny model (nn.Linear(4, 1), SGD) on 65,536 samples held in memory, batch 64
(1,024 steps an epoch), on the CPU, one thread, losses read every 10 steps (the default).
Printed:
- the history's own size after 1,000,000 steps (the MetricsLog's columns and kept events),
  and the process's resident memory growth from before the engine to after the run with
  the result kept, as a kernel keeps it; the thinning the log states. Target <= ~50 MB.
- the redraw of the live plot (plotting.draw into a figure and a PNG, as the notebook's
  live plot renders it) at 1,000 and at 1,000,000 steps, in alternation: the median of the
  pairs' ratios. Target <= 2x.
  Also shown: today's live plot first replays the log's events into a copy (views.redraw);
  that copy's cost, and MetricsLog.snapshot()'s, which replaces it.
- the run's row in the run store (compressed bytes).

    python -m benchmarks.long_runs [--steps 1000000] [--repeats 11]
"""
from __future__ import annotations

import argparse
import gc
import io
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from nbtrain import Engine, Recipe, TrainConfig
from nbtrain.engine.memory import current_rss
from nbtrain.metrics import MetricsLog
from nbtrain.plotting import draw
from nbtrain.runs.store import RunStore

from .common import machine, median


def train(steps: int):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(65_536, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    recipe = Recipe(model=nn.Linear(4, 1), train_data=data, loss_fn=nn.MSELoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    return Engine(recipe, TrainConfig(accelerator="cpu", batch_size=64, max_steps=steps, seed=0)).run()


def history_bytes(log: MetricsLog) -> int:
    columns = sum(c.buffer_info()[1] * c.itemsize for c in log.columns.values())
    events = sum(_size(event) for _, event in log._marks)
    return columns + events


def _size(value) -> int:
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(_size(k) + _size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sys.getsizeof(value) + sum(_size(v) for v in value)
    return sys.getsizeof(value)


def redraw_s(logs: list, repeats: int) -> list[list[float]]:
    """Seconds per redraw of each log, measured in alternation so a busy machine's drift hits all alike."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def once(log) -> float:
        t0 = time.perf_counter()
        figure = Figure(figsize=(9, 3.2), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        draw(log, *figure.subplots(1, 2), title="run")
        figure.savefig(io.BytesIO(), format="png", dpi=100)
        return time.perf_counter() - t0

    for log in logs:  # fonts and caches
        once(log)
    times = [[] for _ in logs]
    for _ in range(repeats):
        for log, kept in zip(logs, times):
            kept.append(once(log))
    return times


def copy_s(make, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        make()
        times.append(time.perf_counter() - t0)
    return median(times)


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    short = train(1000)
    gc.collect()
    before = current_rss()
    t0 = time.perf_counter()
    long = train(args.steps)
    took = time.perf_counter() - t0
    gc.collect()
    grown = current_rss() - before
    size = history_bytes(long.log)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "runs.sqlite"
        RunStore(path).record(long, name="long")
        import sqlite3
        with sqlite3.connect(path) as db:
            row = db.execute("SELECT length(events) FROM runs").fetchone()[0]
    print(f"long-run benchmark on {machine()}")
    print(f"{args.steps:,} steps of a tiny model in {took:.0f} s ({1e6 * took / args.steps:.0f} us a step); "
          f"summary says {long.summary.steps:,} steps")
    print(f"history kept: {size / 2**20:.1f} MB ({len(long.log):,} step rows, {len(long.log._marks):,} other events); "
          f"resident memory grew {grown / 2**20:.1f} MB over the run, result kept (target <= ~50 MB)")
    print(f"thinning: {long.log.thinning}")
    print(f"run store row: {row / 2**20:.2f} MB compressed")
    shorts, longs = redraw_s([short.log, long.log], args.repeats)
    ratio = median([b / a for a, b in zip(shorts, longs)])
    print(f"redraw (draw + PNG): {1000 * median(shorts):.0f} ms at 1,000 steps, {1000 * median(longs):.0f} ms at "
          f"{args.steps:,} steps: {ratio:.2f}x, median of {args.repeats} alternating pairs (target <= 2)")
    replay = copy_s(lambda: MetricsLog.from_events(long.log.events), 3)
    snap = copy_s(long.log.snapshot, args.repeats)
    print(f"copy before drawing at {args.steps:,} steps: replaying the events (views.redraw today) "
          f"{1000 * replay:.0f} ms; MetricsLog.snapshot() {1000 * snap:.1f} ms")
    return {"history MB after 1M steps": (size / 2**20, "<= 50"), "RSS growth MB": (grown / 2**20, "<= ~50"),
            "redraw 1M / 1k steps": (ratio, "<= 2")}


if __name__ == "__main__":
    main()
