"""Bars: verdicts a user can trust, on this machine (issue 15's A/A, power and ceilings bars).

    PYTHONPATH=. python -m benchmarks.verdicts [--repeats 20] [--no-load]

- A/A: one config compared with itself by `nbtrain.ab` on the live model, `--repeats` times:
  "no measurable difference" at least 19 times in 20. Run twice: as the machine is, and with a
  CPU-bound process started and stopped at random beside it (a laptop is rarely quiet).
- Power: config B's step costs 30% more than A's, by construction: the training step does 10 fixed
  matmuls, 13 when autocast is on, so B = A + precision='bf16-mixed' (all in float32 either way:
  real work, which a busy machine slows as it slows training). Found, and found slower, at least
  19 times in 20.
- Ceilings: `nbtrain.ceilings` says data-bound on the data-bound recipe, compute-bound on the
  compute-bound one, host-bound on 48 tiny layers at batch 8, and the utilisation of a matmul-heavy
  MLP lies between 0 and 1.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading

import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from checklist_recipes import compute_bound_recipe, data_bound_recipe, tiny_ops_recipe  # noqa: E402

import nbtrain  # noqa: E402
from nbtrain import Recipe, TrainConfig  # noqa: E402

from .common import machine  # noqa: E402

MATMULS = 10  # the step's fixed work (about 2 ms here): long against the loop's own overhead


def costed_recipe(seed: int = 0) -> Recipe:
    """A tiny model whose training step does MATMULS fixed matmuls, 1.3x as many under autocast."""
    torch.manual_seed(seed)
    model, loss_fn = nn.Linear(8, 1), nn.MSELoss()
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(4096, 8, generator=g), torch.randn(4096, 1, generator=g))
    work = torch.randn(192, 192, generator=g)

    def training_step(model, batch):
        x, y = batch
        count = round(MATMULS * 1.3) if torch.is_autocast_enabled("cpu") else MATMULS
        with torch.autocast("cpu", enabled=False):  # float32 in A and B: only the count of matmuls differs
            for _ in range(count):
                torch.mm(work, work)
            return loss_fn(model(x), y)
    return Recipe(model=model, train_data=data, training_step=training_step,
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


class RandomLoad:
    """A CPU-bound process beside the benchmark, started and stopped at random (0.2-2 s each way)."""

    def __init__(self, seed: int = 0):
        self.rng, self.done, self.process = random.Random(seed), threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.wait(self.rng.uniform(0.2, 2.0)):
            if self.process is None:
                self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            else:
                self._stop()

    def _stop(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self._stop()


def comparisons(recipe_of, b: dict, repeats: int, budget_s: float) -> list:
    out = []
    for i in range(repeats):
        result = nbtrain.ab(recipe=recipe_of(i), config=TrainConfig(batch_size=64, accelerator="cpu"), a={}, b=b,
                            budget_s=budget_s)
        print(f"  {i + 1:2d}. {result.text()}", flush=True)
        out.append(result.verdict)
    return out


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=20.0, help="each comparison's time budget")
    parser.add_argument("--no-load", action="store_true", help="skip the A/A run with a random CPU load beside it")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    out, n = {}, args.repeats
    target = f">= {n - max(1, n // 20)} of {n}"

    def a_a(label: str) -> None:
        verdicts = comparisons(costed_recipe, {}, n, args.budget_s)
        # "too noisy to tell" is no false alarm, but it is not "no measurable difference" either: counted apart
        calm = sum(not v.measurable and not v.too_noisy for v in verdicts)
        noisy = sum(v.too_noisy for v in verdicts)
        out[label] = (f"{calm} of {n}" + (f" ({noisy} more too noisy to tell)" if noisy else ""), target)

    print("A/A, the machine as it is:")
    a_a("A/A: no measurable difference")
    if not args.no_load:
        print("A/A, a CPU-bound process started and stopped at random beside it:")
        with RandomLoad():
            a_a("A/A with a random CPU load: no measurable difference")

    print(f"power: B's step costs 30% more ({round(MATMULS * 1.3)} matmuls instead of {MATMULS}):")
    verdicts = comparisons(costed_recipe, {"precision": "bf16-mixed"}, n, args.budget_s)
    found = sum(v.measurable and v.ratio < 1 for v in verdicts)
    out["30% slower step: found slower"] = (f"{found} of {n}", target)
    ratios = sorted(v.ratio for v in verdicts)
    out["30% slower step: median ratio B/A (expected about 1/1.3 = 0.77)"] = (ratios[len(ratios) // 2], "< 1")

    print("ceilings:")
    data = nbtrain.ceilings(data_bound_recipe(), config=TrainConfig(batch_size=32))
    compute = nbtrain.ceilings(compute_bound_recipe(), config=TrainConfig(batch_size=128))
    host = nbtrain.ceilings(tiny_ops_recipe(), config=TrainConfig(batch_size=8))
    for c in (data, compute, host):
        print(c.table())
    out["ceilings on the data-bound recipe"] = (data.kind, "data-bound")
    out["ceilings on the compute-bound recipe"] = (compute.kind, "compute-bound")
    out["ceilings on 48 tiny layers, batch 8"] = (host.kind, "host-bound")
    out["model FLOPs utilisation, matmul-heavy MLP (fp32)"] = (compute.utilisation(), "between 0 and 1")
    for measure, (value, wanted) in out.items():
        print(f"{measure}: {value} (target {wanted})")
    return out


if __name__ == "__main__":
    main()
