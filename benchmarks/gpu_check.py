"""A short GPU check: every CUDA path of the engine, each row a head-to-head verdict (needs CUDA).

Every speed row is `nbtrain.ab`: the two configs trained in alternating short blocks on one live
model, the ratio with its 95% interval (single runs of a few seconds each, as this check printed
before, moved by 2x between rows with nothing changed). The conv-net on synthetic images runs
fp32, 16-mixed (GradScaler) and bf16-mixed, with pageable and pinned copies; the digits demo
runs with its training data held on the GPU against the DataLoader path. Then a CPU->CUDA
device move with optimizer state.

Expectations, stated and checked (the exit code is 1 when one fails):
- pinned >= pageable: pinned host memory is never measurably slower to copy from;
- held data >= DataLoader: batches cut on the GPU are never measurably slower than a loader's
  reads, collation and copy (on this project's 2-core CPU the held path is ~1.4x).
The precision rows state no expectation: whether 16/bf16 pays depends on the model's size.

    python -m benchmarks.gpu_check      # about 2 minutes on one GPU; without CUDA it says so and exits 0
"""
from __future__ import annotations

import math
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import Engine, Recipe, TrainConfig
from nbtrain.demo import digits_recipe

from .common import machine

BUDGET_S = 10.0  # per head-to-head row: the whole script stays under 6 minutes on one GPU


def conv_recipe() -> Recipe:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8192, 3, 32, 32, generator=g), torch.randint(0, 10, (8192,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))


def at_least(verdict) -> bool | None:
    """B >= A: not measurably slower (None: the interval could not be measured)."""
    if not (math.isfinite(verdict.low) and math.isfinite(verdict.high)):
        return None
    return not (verdict.measurable and verdict.high < 1.0)


def expectation_line(name: str, verdict) -> tuple[str, bool]:
    held = at_least(verdict)
    word = "holds" if held else "NOT MEASURED" if held is None else "FAILS"
    return f"    expectation {name}: {word}", bool(held)


def rows() -> list[tuple[str, dict, dict, str | None]]:
    """(what, A's changes, B's changes, the expectation B >= A or None) over the conv-net's base config."""
    out = []
    for precision in ("32-true", "16-mixed", "bf16-mixed"):
        out.append((f"{precision}: pinned against pageable", {"precision": precision, "pin_memory": False},
                    {"precision": precision, "pin_memory": True}, "pinned >= pageable"))
    for precision in ("16-mixed", "bf16-mixed"):
        out.append((f"{precision} against 32-true (pinned)", {"pin_memory": True},
                    {"precision": precision, "pin_memory": True}, None))
    return out


def main() -> int:
    if torch.cuda.device_count() == 0:  # NVML's count: nothing initialises CUDA to ask
        print("gpu check: skipped: no CUDA device here; nothing to measure")
        return 0
    print(f"gpu check on {machine()}; each row B against A head to head (nbtrain.ab, {BUDGET_S:.0f} s budget)")
    ok = True
    base = TrainConfig(accelerator="cuda", batch_size=256, num_workers=2)
    for what, a, b, expectation in rows():
        result = nbtrain.ab(recipe=conv_recipe(), config=base, a=a, b=b, budget_s=BUDGET_S)
        print(f"  {what}: {result.text()}")
        if expectation:
            line, held = expectation_line(expectation, result.verdict)
            print(line)
            ok &= held
    held = nbtrain.ab(recipe=digits_recipe(seed=0), config=TrainConfig(accelerator="cuda", batch_size=64),
                      a={"preload_data": False}, b={"preload_data": True}, budget_s=2 * BUDGET_S)
    print(f"  data held on the GPU against the DataLoader path (digits demo, batch 64): {held.text()}")
    line, kept = expectation_line("held data >= DataLoader", held.verdict)
    print(line)
    ok &= kept
    recipe = conv_recipe()
    engine = Engine(recipe, TrainConfig(accelerator="cpu", batch_size=64, max_steps=3))
    engine.run()
    engine.reconfigure(engine.config.replace(accelerator="cuda", precision="bf16-mixed"))
    moved = engine.optimizer.state[next(recipe.model.parameters())]["exp_avg"].is_cuda
    after = engine.run()
    print(f"  device move cpu -> cuda with optimizer state: state on cuda={moved}, trained on "
          f"{after.summary.device}, loss {after.summary.last_loss:.3f}")
    ok &= moved and after.summary.last_loss == after.summary.last_loss
    print(f"gpu check: {'every expectation holds' if ok else 'an expectation FAILS (see above)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
