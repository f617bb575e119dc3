"""Do two identical %%nbtrain runs show the same headline speed? On a quiet machine, and beside a load.

Workload: the same %%nbtrain cell (the digits MLP, batch 64, 300 optimizer steps, seed 0, the
live views on, as a user runs it) run twice in a row, ten times over, through a real IPython
shell: once on the machine as it is, once with a CPU-bound process started and stopped at
random beside it (benchmarks/verdicts.py's RandomLoad). Printed: each pair's ratio of the
headline samples/s (the summary's steady rate), and how many pairs agree within 10%.
Target: at least 9 pairs of 10, in both settings.

    python -m benchmarks.repeat_runs [--steps 300] [--pairs 10] [--no-load]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from .common import machine
from .magic_views_overhead import CELL
from .verdicts import RandomLoad

AGREE = 1.10  # two runs agree when the faster is at most 10% faster


def pairs_of_runs(run, steps: int, pairs: int) -> list[float]:
    ratios = []
    for i in range(pairs):
        first, second = run(steps), run(steps)
        ratios.append(second / first)
        print(f"  {i + 1:2d}. {first:9,.0f} then {second:9,.0f} samples/s: x{second / first:.3f}", flush=True)
    return ratios


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
        return shell.user_ns["_nbtrain"].summary["samples_per_s"]

    run(50)  # warm-up: imports, data, allocator, fonts
    print(f"repeat-runs benchmark on {machine()}; {args.pairs} pairs of identical {args.steps}-step %%nbtrain runs")
    print("the machine as it is:")
    quiet = agreeing(pairs_of_runs(run, args.steps, args.pairs))
    out = {f"identical runs within 10%, pairs of {args.pairs}": (quiet, f">= {args.pairs - 1}")}
    print(f"agree within 10%: {quiet} of {args.pairs} (target >= {args.pairs - 1})")
    if not args.no_load:
        print("a CPU-bound process started and stopped at random beside them:")
        with RandomLoad(seed=1):
            loaded = agreeing(pairs_of_runs(run, args.steps, args.pairs))
        print(f"agree within 10% under the load: {loaded} of {args.pairs} (target >= {args.pairs - 1})")
        out[f"... with a random CPU load, pairs of {args.pairs}"] = (loaded, f">= {args.pairs - 1}")
    return out


if __name__ == "__main__":
    main()
