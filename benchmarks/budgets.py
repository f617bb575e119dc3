"""Bar: the tools that promise a time stop within it on this machine's real clock.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m benchmarks.budgets [--budgets 10 30] [--repeats 3]

The tests check that a tool stops by its own clock (a fake one, so a busy CI machine cannot fail
them); this measures what that promise is worth in seconds here: each ratio is the wall time on
time.monotonic over the time promised, as a median with its range over the runs.
  - the checklist walk: the whole call over budget_s (all items, as `python -m nbtrain tour` runs it)
  - find_workers: each setting's trial (start-up included) over its `seconds`
A ratio a little above 1 is the step in flight when time runs out, and the restore after it; a walk
well under 1 ran out of items first (each run's line says which items the budget cut).
"""
from __future__ import annotations

import argparse
import time

import torch

from nbtrain import TrainConfig
from nbtrain.walk.tool import checklist
from nbtrain.demo import digits_recipe
from nbtrain.tools.tune_workers import find_workers

from .common import machine, spread

TARGET = "<= 1.10"


def walk_ratios(budget_s: float, repeats: int) -> list[float]:
    ratios = []
    for i in range(repeats):
        started = time.monotonic()
        walk = checklist(digits_recipe(seed=i), config=TrainConfig(batch_size=32), budget_s=budget_s)
        took = time.monotonic() - started
        ratios.append(took / budget_s)
        cut = [name for name, reason in walk.skipped if "time budget" in reason or "does not fit" in reason]
        print(f"  walk, budget {budget_s:g} s: {took:.2f} s, {walk.blocks} blocks in {walk.rounds} rounds; cut by the budget: "
              f"{', '.join(cut) or 'none'}", flush=True)
    return ratios


def worker_trial_ratios(seconds: float, repeats: int) -> list[float]:
    ratios = []
    for i in range(repeats):
        search = find_workers(digits_recipe(seed=i), config=TrainConfig(batch_size=32), seconds=seconds)
        for m in search.measurements:
            ratios.append(m.seconds / seconds)
            print(f"  find_workers {search.label(m.config)}: {m.seconds:.2f} s of {seconds:g} s", flush=True)
    return ratios


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    # 4 s binds on the digits demo (items are cut); by 30 s the walk runs out of items first.
    parser.add_argument("--budgets", type=float, nargs="+", default=[4.0, 10.0, 30.0], help="walk budgets, seconds")
    parser.add_argument("--seconds", type=float, default=2.0, help="find_workers' time per setting")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    out = {}
    for budget in args.budgets:
        out[f"checklist walk time / budget_s={budget:g}"] = (spread(walk_ratios(budget, args.repeats)), TARGET)
    out[f"find_workers trial time / seconds={args.seconds:g}"] = (
        spread(worker_trial_ratios(args.seconds, args.repeats)), TARGET)
    for measure, (value, target) in out.items():
        print(f"{measure}: {value} (target {target})")
    return out


if __name__ == "__main__":
    main()
