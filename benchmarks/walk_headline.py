"""Bar: the checklist walk's headline is what `ab` measures of the same two configs (issue 39).

    PYTHONPATH=. python -m benchmarks.walk_headline [--repeats 5] [--budget-s 30] [--ab-s 15]

On three small CPU workloads (a CNN over a DataLoader of 2,000 random 3x32x32 images, a 512-wide MLP on
tensors, a loader-bound data set whose samples cost repeated FFTs), the walk runs, then `nbtrain.ab`
measures its choice against the start on its own: the walk's headline interval (its final head-to-head)
and ab's overlap, in every run. The walk's table is printed.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from checklist_recipes import compute_bound_recipe, data_bound_recipe  # noqa: E402

import nbtrain  # noqa: E402
from nbtrain import Recipe, TrainConfig  # noqa: E402

from .common import machine, measured  # noqa: E402


def cnn_recipe() -> Recipe:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(2000, 3, 32, 32, generator=g), torch.randint(0, 10, (2000,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return Recipe(model=model, train_data=DataLoader(data, batch_size=64, shuffle=True), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


WORKLOADS = {  # name: (recipe, starting config)
    "CNN over a DataLoader": (cnn_recipe, TrainConfig(accelerator="cpu")),
    "MLP": (lambda: compute_bound_recipe(n=2048, width=512), TrainConfig(batch_size=32, accelerator="cpu")),
    "loader-bound": (lambda: data_bound_recipe(n=1024), TrainConfig(batch_size=16, accelerator="cpu")),
}


def one_run(name: str, budget_s: float, ab_s: float) -> bool:
    recipe_of, config = WORKLOADS[name]
    recipe = recipe_of()
    walk = nbtrain.checklist(recipe=recipe, config=config, budget_s=budget_s)
    print(walk.table(), flush=True)
    if not walk.moved:
        print(f"  {name}: nothing kept; no head-to-head to check", flush=True)
        return True
    measured = nbtrain.ab(recipe=recipe, config=config, a={}, b=walk.best_config, budget_s=ab_s)
    head = walk.overall()
    overlap = max(head.low, measured.verdict.low) <= min(head.high, measured.verdict.high)
    print(f"  {name}: the walk's headline {head.short()}; ab {measured.verdict.short()}: "
          f"{'overlap' if overlap else 'DO NOT overlap'}", flush=True)
    return overlap


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=30.0, help="each walk's budget")
    parser.add_argument("--ab-s", type=float, default=15.0, help="each ab's budget")
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="run only these workloads")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    out = {}
    for name in args.only or WORKLOADS:
        agree = sum(one_run(name, args.budget_s, args.ab_s) for _ in range(args.repeats))
        out[f"{name}: headline and ab overlap"] = (f"{agree} of {args.repeats}", f"{args.repeats} of {args.repeats}")
    return measured(out)


if __name__ == "__main__":
    main()
