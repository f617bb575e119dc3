"""Batches cut from data held in memory (preload_data) against the DataLoader path.

Workload: the digits demo (nbtrain.demo: MLP 64-128-128-10, AdamW), batch 64, on the CPU,
one thread, no validation. Two engines train side by side in one process, interleaved in
blocks of the same steps — one through the DataLoader (preload_data=False), one cutting
batches from the data held in memory (preload_data=True) — so machine noise hits both
alike. Printed: steps/s of each (median of the blocks' steady rates, as nbtrain measures a
run), the ratio with the paired verdict, and whether the weights are bit-identical after the
same steps.
Target: >= 1.4x, weights identical.

The ceiling, measured in the same sitting: a hand-written loop (no nbtrain) cutting its batches
from the same tensors by a shuffled index, interleaved with the two engines. No held path can
beat it, so DataLoader path / hand-written held loop is the most this machine and model allow:
where it sits below the target, so must any held path.

    python -m benchmarks.in_memory [--blocks 11] [--steps 600]
"""
from __future__ import annotations

import argparse
import time

import torch

from nbtrain import Engine, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.measure import paired, steady_rate

from .common import machine, median, spread

BATCH = 64


def engine(preload: bool) -> Engine:
    recipe = digits_recipe(seed=0)
    recipe.val_data = None  # training steps only: validation is the same on both paths
    return Engine(recipe, TrainConfig(accelerator="cpu", batch_size=BATCH, seed=0, log_every_n_steps=50,
                                      preload_data=preload))


class HeldLoop:
    """The hand-written loop on batches cut from the data set's tensors (a shuffled index each epoch)."""

    def __init__(self):
        recipe = digits_recipe(seed=0)
        self.model, data = recipe.model, recipe.train_data
        self.optimizer = recipe.build_optimizer(self.model.parameters())
        self.loss_fn = recipe.loss_fn
        self.x, self.y = data.x, data.y
        self.order = torch.Generator().manual_seed(0)

    def steps_per_s(self, steps: int) -> float:
        """Steady steps/s of `steps` steps, by the estimator nbtrain's summary uses."""
        durations, sizes, t0 = [], [], time.perf_counter()
        while len(durations) < steps:
            index = torch.randperm(len(self.x), generator=self.order)
            xs, ys = self.x[index], self.y[index]
            for lo in range(0, len(index), BATCH):
                x, y = xs[lo:lo + BATCH], ys[lo:lo + BATCH]
                self.optimizer.zero_grad(set_to_none=True)
                self.loss_fn(self.model(x), y).backward()
                self.optimizer.step()
                t1 = time.perf_counter()
                durations.append(t1 - t0)
                sizes.append(len(x))
                t0 = t1
                if len(durations) == steps:
                    break
        return steady_rate(durations, sizes).rate / BATCH


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=11)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loader, held, by_hand = engine(False), engine(True), HeldLoop()
    assert held.held_data is not None and loader.held_data is None, held.notes
    rates = {id(loader): [], id(held): [], id(by_hand): []}
    for block in range(args.blocks + 1):  # block 0 warms all three up and is not counted
        for e in ((loader, held, by_hand) if block % 2 else (by_hand, held, loader)):
            if e is by_hand:
                rate = by_hand.steps_per_s(args.steps)
            else:
                e.reconfigure(e.config.replace(max_steps=args.steps))
                rate = e.run().summary.samples_per_s / BATCH  # the block's steady rate, warm-up set apart
            if block:
                rates[id(e)].append(rate)
    slow, fast, ceiling = rates[id(loader)], rates[id(held)], rates[id(by_hand)]
    ratio = median(fast) / median(slow)
    verdict = paired(slow, fast)
    same = all(torch.equal(a, b) for a, b in zip(loader.model.parameters(), held.model.parameters()))
    steps = (args.blocks + 1) * args.steps
    print(f"preload_data benchmark on {machine()}; {args.blocks} interleaved blocks of {args.steps} steps")
    print(f"DataLoader path: {spread(slow)} steps/s ({1e6 / median(slow):.0f} us a step)")
    print(f"held in memory:  {spread(fast)} steps/s ({1e6 / median(fast):.0f} us a step), "
          f"{held.held_data.note}")
    print(f"hand-written loop on the same tensors: {spread(ceiling)} steps/s ({1e6 / median(ceiling):.0f} us a step)")
    print(f"held / DataLoader: {ratio:.2f}x (target >= 1.4); {verdict.text()}")
    print(f"the ceiling, hand-written held loop / DataLoader path: {median(ceiling) / median(slow):.2f}x "
          f"({paired(slow, ceiling).text()}); nbtrain's held path / the hand-written one: "
          f"{paired(ceiling, fast).text()}")
    print(f"weights after {steps} steps each: {'bit-identical' if same else 'DIFFERENT'}")
    return {"steps/s held / DataLoader": (ratio, ">= 1.4"),
            "    ceiling: hand-written held loop / DataLoader": (median(ceiling) / median(slow), "reference"),
            "weights bit-identical": ("yes" if same else "NO", "yes")}


if __name__ == "__main__":
    main()
