"""Bar: the ceilings' three textbook cases read right, 5 times of 5, quiet and beside a CPU load (issue 39).

    PYTHONPATH=. python -m benchmarks.ceilings_textbook [--repeats 5] [--no-load]

- many tiny operations (48 layers of 8 features at batch 8) -> host;
- a 1024-wide MLP at batch 512 -> compute;
- a loader whose samples sleep 5 ms each (no model to speak of) -> data.
Each reading counts as right (its ceiling named), too noisy (allowed: the machine's load moved the
readings), none (no ceiling explains the step: not wrong, not right) or wrong (another ceiling named:
the bar is 0). Beside the load, a CPU-bound process is started and stopped at random (verdicts.RandomLoad).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from checklist_recipes import compute_bound_recipe, tiny_ops_recipe  # noqa: E402

import nbtrain  # noqa: E402
from nbtrain import Recipe, TrainConfig  # noqa: E402

from .common import machine, measured  # noqa: E402
from .verdicts import RandomLoad  # noqa: E402


class SleepingData(Dataset):
    """Each sample waits `sleep_s` (a file read, a remote store) and costs the CPU nothing."""

    def __init__(self, n=512, features=16, sleep_s=5e-3):
        self.n, self.features, self.sleep_s = n, features, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return torch.full((self.features,), float(i % 7)), i % 4


def sleeping_recipe() -> Recipe:
    torch.manual_seed(0)
    return Recipe(model=nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), train_data=SleepingData(),
                  loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


CASES = {  # name: (recipe, batch, the ceiling it must read)
    "many tiny ops": (tiny_ops_recipe, 8, "host"),
    "wide MLP, batch 512": (lambda: compute_bound_recipe(n=1024, width=1024), 512, "compute"),
    "sleeping loader": (sleeping_recipe, 16, "data"),
}


def reading(name: str) -> tuple[str, str]:
    """(outcome, verdict) of one reading of case `name`: right | too noisy | none | wrong."""
    recipe, batch, wanted = CASES[name]
    c = nbtrain.ceilings(recipe(), config=TrainConfig(batch_size=batch, accelerator="cpu"))
    b = c.bottleneck()
    outcome = ("too noisy" if b.state == "noisy" else "none" if not b.binds
               else "right" if b.binding == wanted else "wrong")
    return outcome, c.verdict


def rounds(repeats: int, label: str) -> dict:
    counts = {}
    for name in CASES:
        seen = collections.Counter()
        for i in range(repeats):
            outcome, verdict = reading(name)
            seen[outcome] += 1
            print(f"  {label}, {name}, {i + 1}: {outcome}: {verdict}", flush=True)
        counts[name] = seen
    return counts


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-load", action="store_true", help="skip the readings beside a random CPU load")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    n, out = args.repeats, {}
    runs = [("as it is", rounds(n, "as it is"))]
    if not args.no_load:
        with RandomLoad():
            runs.append(("beside a random CPU load", rounds(n, "beside a random CPU load")))
    for label, counts in runs:
        for name, seen in counts.items():
            rest = ", ".join(f"{seen[k]} {k}" for k in ("too noisy", "none") if seen[k])
            out[f"{name} ({label}): right"] = (f"{seen['right']} of {n}" + (f" ({rest})" if rest else ""),
                                               f"{n} of {n}, or too noisy")
            out[f"{name} ({label}): wrong ceiling"] = (f"{seen['wrong']} of {n}", f"0 of {n}")
    return measured(out)


if __name__ == "__main__":
    main()
