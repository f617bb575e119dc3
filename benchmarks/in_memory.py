"""Batches cut from data held in memory (preload_data) against the DataLoader path.

Workload: the digits demo (nbtrain.demo: MLP 64-128-128-10, AdamW), batch 64, on the CPU,
one thread, no validation. Two engines train side by side in one process, interleaved in
blocks of the same steps — one through the DataLoader (preload_data=False), one cutting
batches from the data held in memory (preload_data=True) — so machine noise hits both
alike. Printed: steps/s of each (median of the blocks' steady rates, as nbtrain measures a
run), the ratio with the paired verdict, and whether the weights are bit-identical after the
same steps.
Target: >= 1.4x, weights identical.

    python -m benchmarks.in_memory [--blocks 11] [--steps 600]
"""
from __future__ import annotations

import argparse

import torch

from nbtrain import Engine, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.measure import paired

from .common import machine, median, spread


def engine(preload: bool) -> Engine:
    recipe = digits_recipe(seed=0)
    recipe.val_data = None  # training steps only: validation is the same on both paths
    return Engine(recipe, TrainConfig(accelerator="cpu", batch_size=64, seed=0, log_every_n_steps=50,
                                      preload_data=preload))


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=11)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loader, held = engine(False), engine(True)
    assert held.held_data is not None and loader.held_data is None, held.notes
    rates = {id(loader): [], id(held): []}
    for block in range(args.blocks + 1):  # block 0 warms both up and is not counted
        for e in ((loader, held) if block % 2 else (held, loader)):
            e.reconfigure(e.config.replace(max_steps=args.steps))
            summary = e.run().summary
            if block:
                rates[id(e)].append(summary["samples_per_s"] / 64)  # the block's steady rate, warm-up set apart
    slow, fast = rates[id(loader)], rates[id(held)]
    ratio = median(fast) / median(slow)
    verdict = paired(slow, fast)
    same = all(torch.equal(a, b) for a, b in zip(loader.model.parameters(), held.model.parameters()))
    steps = (args.blocks + 1) * args.steps
    print(f"preload_data benchmark on {machine()}; {args.blocks} interleaved blocks of {args.steps} steps")
    print(f"DataLoader path: {spread(slow)} steps/s ({1e6 / median(slow):.0f} us a step)")
    print(f"held in memory:  {spread(fast)} steps/s ({1e6 / median(fast):.0f} us a step), "
          f"{held.held_data.note}")
    print(f"held / DataLoader: {ratio:.2f}x (target >= 1.4); {verdict.text()}")
    print(f"weights after {steps} steps each: {'bit-identical' if same else 'DIFFERENT'}")
    return {"steps/s held / DataLoader": (ratio, ">= 1.4"),
            "weights bit-identical": ("yes" if same else "NO", "yes")}


if __name__ == "__main__":
    main()
