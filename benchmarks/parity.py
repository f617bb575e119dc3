"""Engine parity: nbtrain against a plain hand-written PyTorch loop (and Lightning, if installed).

Workload: an MLP 784-128-10 on 6,400 random samples, batch 32, SGD, one epoch (200 steps),
one CPU thread. The runs are interleaved in one process (A B, B A, ...), so machine noise hits
both sides alike; printed: the paired time ratio (the geometric mean of each repeat's ratio, with
its 95% interval: pairs measured side by side cancel the machine's drift, which a ratio of medians
keeps), the ratio of medians beside it, and both final losses.

Both sides read their batches through a DataLoader: nbtrain would hold a TensorDataset in
memory on its own (preload_data, automatic) and cut batches by index, which is faster than
the plain loop's DataLoader but measures the data path, not the engine. Here it runs with
preload_data=False, so only the training loop differs (benchmarks.in_memory measures the
held path; benchmarks.engine_overhead the loop's own cost with data held on both sides).

    python -m benchmarks.parity [--repeats 25]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Engine, Recipe, TrainConfig

from .common import machine, paired_time_ratio, ratio_line

SAMPLES, BATCH, LR, SEED = 6400, 32, 0.1, 0
LIGHTNING_REPEATS = 7


def workload():
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(SAMPLES, 784, generator=g), torch.randint(0, 10, (SAMPLES,), generator=g))


def fresh_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def plain(data) -> tuple[float, float]:
    model = fresh_model()
    start = time.perf_counter()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in DataLoader(data, batch_size=BATCH, shuffle=False):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    final = loss.item()
    return time.perf_counter() - start, final


def with_nbtrain(data) -> tuple[float, float]:
    model = fresh_model()
    start = time.perf_counter()
    recipe = Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=LR))
    result = Engine(recipe, TrainConfig(accelerator="cpu", batch_size=BATCH, shuffle=False, max_epochs=1,
                                        seed=SEED, log_every_n_steps=50,
                                        preload_data=False)).run()
    return time.perf_counter() - start, result.history["loss"][-1]


def with_lightning(data):
    try:
        import lightning as L
    except ImportError:
        return None
    import logging
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = fresh_model()
            self.loss_fn = nn.CrossEntropyLoss()

        def training_step(self, batch, _):
            x, y = batch
            loss = self.loss_fn(self.net(x), y)
            self.last = loss.detach()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    module = Module()
    start = time.perf_counter()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(data, batch_size=BATCH, shuffle=False))
    return time.perf_counter() - start, module.last.item()


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = workload()
    plain(data), with_nbtrain(data)  # warm both paths (allocator, lazy imports)
    times = {"plain": [], "nbtrain": [], "lightning": []}
    losses = {}
    for i in range(args.repeats):
        # A B, B A, ...: neither side always runs first (the machine's speed drifts over a repeat);
        # Lightning, the reference, after the pair in the first LIGHTNING_REPEATS repeats.
        pair = (("plain", plain), ("nbtrain", with_nbtrain))
        reference = (("lightning", with_lightning),) if i < LIGHTNING_REPEATS else ()
        order = (pair if i % 2 == 0 else pair[::-1]) + reference
        for name, run in order:
            out = run(data)
            if out is not None:
                times[name].append(out[0])
                losses[name] = out[1]
    print(f"parity benchmark on {machine()}; {args.repeats} interleaved repeats of 200 steps")
    print(ratio_line("nbtrain / plain loop", times["nbtrain"], times["plain"], "<= 1.05"))
    same = f"{losses['plain']:.5f}" == f"{losses['nbtrain']:.5f}"
    print(f"final loss: plain {losses['plain']:.5f}, nbtrain {losses['nbtrain']:.5f} "
          f"({'identical' if same else 'DIFFERENT'} to 5 decimals)")
    ours = paired_time_ratio(times["nbtrain"], times["plain"]).ratio
    result = {"time nbtrain / plain loop (paired)": (ours, "<= 1.05"),
              "final loss identical to 5 decimals": ("yes" if same else "NO", "yes")}
    if times["lightning"]:
        print(ratio_line("Lightning / plain loop", times["lightning"], times["plain"][:len(times["lightning"])],
                         "reference"))
        result["time Lightning / plain loop (paired)"] = (
            paired_time_ratio(times["lightning"], times["plain"][:len(times["lightning"])]).ratio, "reference")
    else:
        print("Lightning is not installed: its column is skipped (pip install lightning to include it)")
    return result


if __name__ == "__main__":
    main()
