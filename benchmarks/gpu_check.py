"""A short GPU check: every CUDA path of the engine, measured side by side (needs CUDA).

Runs the same conv-net on synthetic images in fp32, 16-mixed (GradScaler) and bf16-mixed,
with pageable and pinned non_blocking copies, and a CPU->CUDA device move with optimizer
state, printing samples/s and ratios. A few seconds per row on one GPU.

Then the digits demo with its training data held on the GPU (preload_data) against the
DataLoader path, head to head (nbtrain.ab). On this project's 2-core CPU the held path is
~1.4x; on a GPU a larger gain is expected, since the model's step there is a fraction of the
per-sample reads, the collation and the host-to-device copy that holding the data removes.

    python -m benchmarks.gpu_check
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import Engine, Recipe, TrainConfig
from nbtrain.demo import digits_recipe

from .common import machine


def conv_recipe() -> Recipe:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8192, 3, 32, 32, generator=g), torch.randint(0, 10, (8192,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu check: no CUDA device here; nothing to measure")
        return 0
    print(f"gpu check on {machine()}")
    rows = []
    for precision in ("32-true", "16-mixed", "bf16-mixed"):
        for pin in (False, True):
            config = TrainConfig(accelerator="cuda", precision=precision, pin_memory=pin, batch_size=256,
                                 max_epochs=2, num_workers=2, log_every_n_steps=16)
            result = Engine(conv_recipe(), config).run()
            s = result.summary
            rows.append((precision, pin, s["samples_per_s"], s["scaler"], s["last_loss"]))
            print(f"  {precision:<10} pinned={pin!s:<5} scaler={s['scaler']!s:<5} "
                  f"{s['samples_per_s']:>10,.0f} samples/s  loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}")
    base = rows[0][2]
    for precision, pin, rate, _, _ in rows[1:]:
        print(f"  speed-up {precision} pinned={pin}: {rate / base:.2f}x vs 32-true pageable")
    recipe = conv_recipe()
    engine = Engine(recipe, TrainConfig(accelerator="cpu", batch_size=64, max_steps=3))
    engine.run()
    engine.reconfigure(engine.config.replace(accelerator="cuda", precision="bf16-mixed"))
    state = engine.optimizer.state[next(recipe.model.parameters())]
    moved = state["exp_avg"].is_cuda
    after = engine.run()
    print(f"  device move cpu -> cuda with optimizer state: state on cuda={moved}, "
          f"trained on {after.summary['device']}")
    held = nbtrain.ab(recipe=digits_recipe(seed=0), config=TrainConfig(accelerator="cuda", batch_size=64),
                      a={"preload_data": False}, b={"preload_data": True}, budget_s=30)
    print(f"  data held on the GPU against the DataLoader path (digits demo, batch 64): {held.text()} "
          "(expected: faster than the CPU's ~1.4x)")
    return 0 if moved and all(r[4] == r[4] for r in rows) and held.verdict.faster else 1


if __name__ == "__main__":
    sys.exit(main())
