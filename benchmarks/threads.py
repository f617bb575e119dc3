"""Bar: on a CPU, torch's thread count is a checklist item (issue 50): quiet and beside a CPU-bound process.

    PYTHONPATH=. python -m benchmarks.threads [--pairs 6] [--budget-s 30] [--ab-budget-s 30] [--conditions quiet burner]

For each condition (our own burner off, then one process spinning on one core: a laptop's other work):
- a plain hand-written loop decides whether one thread is faster than torch's default: 6 interleaved pairs of
  timed blocks (a block of each count, the order flipped every pair), the paired ratio with its interval;
- the walk (nbtrain.checklist, its threads item alone) on the same model: the thread change it keeps, and
  `nbtrain.ab` of its choice against the start (B over A; above 1: the choice is faster);
- the live run (nbtrain.fit, 300 steps) against the forecast's 1 x 1 range (nbtrain.forecast, check=True), at
  the default threads and at the walk's choice: whether the range contains the run's steady interval.
Bars (only where the plain loop shows 1 thread >= 1.3x the default): the walk keeps a thread change, ab of its
choice reads faster; and in every condition the forecast's 1 x 1 range contains the live run's rate.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil
import torch
from torch import nn
from torch.utils.data import TensorDataset

from .common import machine, measured

SPIN = "while True:\n    pass\n"


def workload(seed: int = 0):
    """A small MLP on held tensors: the issue's shape (small matmuls, where threads cost more than they split)."""
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, data


def plain_block(model, data, threads: int, steps: int = 40, batch: int = 64) -> float:
    """Samples/s of `steps` hand-written SGD steps at `threads` torch threads (the count put back after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss()
        x, y = data.tensors
        t0 = time.perf_counter()
        for i in range(steps):
            s = (i * batch) % (len(x) - batch)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[s:s + batch]), y[s:s + batch]).backward()
            opt.step()
        return steps * batch / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)


def plain_ratio(pairs: int):
    """One thread over the default in a plain loop: the paired verdict over interleaved blocks."""
    from nbtrain.measure import paired
    model, data = workload()
    default = torch.get_num_threads()
    plain_block(model, data, 1, 5), plain_block(model, data, default, 5)  # warm-up of both pools
    ones, defaults = [], []
    for i in range(pairs):
        for count in ((1, default) if i % 2 == 0 else (default, 1)):
            (ones if count == 1 else defaults).append(plain_block(model, data, count))
    return paired(defaults, ones), default


def condition(name: str, pairs: int, budget_s: float, ab_budget_s: float = 30.0) -> dict:
    import nbtrain
    from nbtrain import TrainConfig
    verdict, default = plain_ratio(pairs)
    print(f"[{name}] plain loop, 1 thread over {default}: {verdict.text()} ({verdict.pairs} pairs)")
    config = TrainConfig(accelerator="cpu", batch_size=64)
    model, data = workload()
    parts = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    walk = nbtrain.checklist(model, data, items=["threads"], budget_s=budget_s, **parts)
    print(walk.table())
    chosen = walk.best_config.num_threads
    kept = chosen is not None
    ab_text = "no thread change kept"
    if kept:
        ab = nbtrain.ab(model, data, a={}, b={"num_threads": chosen}, budget_s=ab_budget_s, **parts)
        print(ab.table())
        ab_text = ab.verdict.short()
    premise = verdict.low >= 1.3
    out = {}
    for label, threads in [("the default", None)] + ([(f"the walk's {chosen}", chosen)] if kept else []):
        out[f"{name}: forecast 1 x 1 holds the live run at {label} threads"] = (
            one_truth(nbtrain, model, data, parts, config.replace(num_threads=threads), name), "yes")
    return {**out, f"{name}: plain loop, 1 thread over {default} (paired, 95% low)": (f"{verdict.ratio:.2f} ({verdict.low:.2f})",
                                                                             ">= 1.3 for the bars below to apply"),
            f"{name}: walk keeps a thread change": (f"num_threads={chosen}" if kept else "no",
                                                    "yes" if premise else "(premise not met)"),
            f"{name}: ab of the walk's choice over the start": (ab_text, "faster" if premise else "-")}


def one_truth(nbtrain, model, data, parts: dict, config, name: str) -> str:
    """The live run (nbtrain.fit, 300 steps) and the forecast's 1 x 1 range (check=True: read before and after its
    2-rank run) at `config`'s threads: whether the range holds the run's steady interval."""
    run = nbtrain.fit(model, data, **{**parts, "config": config.replace(max_steps=300)})
    forecast = nbtrain.forecast(model, data, devices=[1, 2], nodes=[1], seconds=2, check=True,
                                **{**parts, "config": config})
    print(forecast.table())
    steady, point = run.steady(), forecast.point(1, 1)
    inside = point.contains(steady.low, steady.high)
    own = next((c for c in forecast.checks if c.devices == 1), None)  # check=True's own reading of one process
    print(f"[{name}] live run {steady.text()} at {run.summary.threads} threads; forecast 1 x 1 "
          f"{point.throughput[0]:,.0f}-{point.throughput[1]:,.0f}: {'inside' if inside else 'outside'}")
    return (f"{'yes' if inside else 'no'} (run {steady.rate:,.0f}, range {point.throughput[0]:,.0f}-"
            f"{point.throughput[1]:,.0f}; check=True's reading {'inside' if own and own.inside else 'outside'})")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--budget-s", type=float, default=30.0, help="the walk's budget")
    parser.add_argument("--ab-budget-s", type=float, default=30.0, help="ab's budget")
    parser.add_argument("--conditions", nargs="*", default=["quiet", "burner"], choices=["quiet", "burner"])
    args = parser.parse_args(argv)
    print(f"threads benchmark on {machine()}; load average {psutil.getloadavg()[0]:.1f} at the start")
    out = {}
    for name in args.conditions:
        burner = subprocess.Popen([sys.executable, "-c", SPIN]) if name == "burner" else None
        try:
            time.sleep(0.5 if burner else 0.0)
            out.update(condition(name, args.pairs, args.budget_s, args.ab_budget_s))
        finally:
            if burner is not None:
                burner.kill()
                burner.wait(10)
    print(f"load average {psutil.getloadavg()[0]:.1f} at the end")
    return measured(out)


if __name__ == "__main__":
    main(sys.argv[1:])
