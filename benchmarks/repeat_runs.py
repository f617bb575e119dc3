"""Do two identical %%nbtrain runs show the same headline speed? On a quiet machine, and beside a load.

Workload: the same %%nbtrain cell (the digits MLP, batch 64, 300 optimizer steps, seed 0, the
live views on, as a user runs it) run twice in a row, ten times over, through a real IPython
shell: once on the machine as it is, once with a CPU-bound process started and stopped at
random beside it (benchmarks/verdicts.py's RandomLoad). Printed: each pair's ratio of the
headline samples/s (the summary's steady rate), and how many pairs agree within 10%.
Target: at least 9 pairs of 10, in both settings.

The machine's own floor, measured in the same sitting: a hand-written loop (the same model, data,
batch, optimizer and steps, a DataLoader and no nbtrain), its steady rate taken from its step
times by the same estimator, run in pairs interleaved with nbtrain's (nbtrain, loop, nbtrain,
loop), so both pairs span the same stretch of the machine's time. Where the hand-written loop's
identical runs disagree as often as nbtrain's, the disagreement is the machine's, not nbtrain's.

    python -m benchmarks.repeat_runs [--steps 300] [--pairs 10] [--no-load]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from torch.utils.data import DataLoader

from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.measure import steady_rate

from .common import machine
from .magic_views_overhead import CELL
from .verdicts import RandomLoad

AGREE = 1.10  # two runs agree when the faster is at most 10% faster


def hand_written(steps: int) -> float:
    """The cell's training as a plain loop: its steady samples/s from its own step times."""
    torch.manual_seed(0)
    model = DigitsMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # nbtrain's default for a cell that names none
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(DigitsDataset(), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    durations, t0 = [], time.perf_counter()
    while len(durations) < steps:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()
            t1 = time.perf_counter()
            durations.append(t1 - t0)
            t0 = t1
            if len(durations) == steps:
                break
    return steady_rate(durations, [64] * steps).rate


def pairs_of_runs(run, steps: int, pairs: int) -> tuple[list[float], list[float]]:
    """(nbtrain's ratios, the hand-written loop's ratios), each pair's two runs interleaved with the other's."""
    ours, theirs = [], []
    for i in range(pairs):
        first, plain_first = run(steps), hand_written(steps)
        second, plain_second = run(steps), hand_written(steps)
        ours.append(second / first)
        theirs.append(plain_second / plain_first)
        print(f"  {i + 1:2d}. nbtrain {first:9,.0f} then {second:9,.0f} samples/s: x{second / first:.3f}   "
              f"hand-written loop {plain_first:9,.0f} then {plain_second:9,.0f}: x{plain_second / plain_first:.3f}",
              flush=True)
    return ours, theirs


def agreeing(ratios) -> int:
    return sum(max(r, 1 / r) <= AGREE for r in ratios)


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--no-load", action="store_true", help="skip the pairs with a random CPU load beside them")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ["NBTRAIN_STORE"] = os.path.join(tempfile.mkdtemp(), "runs.sqlite")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtrain")

    def run(steps: int) -> float:
        with capture_output():
            shell.run_cell(CELL.format(steps=steps, extra=""))
        return shell.user_ns["_nbtrain"].summary.samples_per_s

    run(50), hand_written(50)  # warm-up: imports, data, allocator, fonts
    print(f"repeat-runs benchmark on {machine()}; {args.pairs} pairs of identical {args.steps}-step %%nbtrain runs")
    out = {}
    settings = [("the machine as it is", "identical runs within 10%", contextlib.nullcontext())]
    if not args.no_load:
        settings.append(("a CPU-bound process started and stopped at random beside them",
                         "... with a random CPU load", RandomLoad(seed=1)))
    for title, label, beside in settings:
        print(f"{title}:")
        with beside:
            ours, theirs = pairs_of_runs(run, args.steps, args.pairs)
        agree, floor = agreeing(ours), agreeing(theirs)
        print(f"agree within 10%: nbtrain {agree} of {args.pairs} (target >= {args.pairs - 1}); the hand-written "
              f"loop in the same sitting {floor} of {args.pairs} (the machine's floor)")
        out[f"{label}, pairs of {args.pairs}"] = (agree, f">= {args.pairs - 1}")
        out[f"{label}: hand-written loop, same sitting"] = (floor, "reference")
    return out


if __name__ == "__main__":
    main()
