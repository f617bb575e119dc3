"""What the %%nbtrain live views (progress bar + in-place plot) cost the training loop.

Workload: the digits MLP, batch 64, 3,000 optimizer steps on the CPU, one thread. The same
%%nbtrain cell runs through a real IPython shell, interleaved A/B: with the views, and
with --no-plot --no-progress. Printed: the throughput ratio of medians (steady samples/s),
the paired verdict with its 95% interval, and the time the views themselves measure inside
the loop as a share of training time. Targets: ratio >= 0.98, own time under 2%.

    python -m benchmarks.magic_views_overhead [--steps 3000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from nbtrain.measure import paired

from .common import machine, median

CELL = """%%nbtrain --max-steps {steps} --batch-size 64 --accelerator cpu --seed 0 {extra}
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
torch.manual_seed(0)
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ["NBTRAIN_STORE"] = os.path.join(tempfile.mkdtemp(), "runs.sqlite")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtrain")

    def run(steps: int, extra: str = ""):
        with capture_output():
            shell.run_cell(CELL.format(steps=steps, extra=extra))
        result = shell.user_ns["_nbtrain"]
        return result.summary.samples_per_s, result.extras["views_s"] / result.summary.train_time_s

    run(50)  # warm-up: imports, data, allocator, fonts
    bare, live, own = [], [], []
    for _ in range(args.repeats):
        bare.append(run(args.steps, "--no-plot --no-progress")[0])
        speed, share = run(args.steps)
        live.append(speed)
        own.append(share)
    ratio = median(live) / median(bare)
    verdict = paired(bare, live)
    print(f"views-overhead benchmark on {machine()}; {args.repeats} interleaved repeats of {args.steps} steps")
    print(f"samples/s: without views {median(bare):,.0f}, with views {median(live):,.0f} -> ratio {ratio:.3f} "
          "(target >= 0.98)")
    print("with views against without: " + verdict.text())
    print(f"time the views measure inside the loop: {100 * median(own):.2f}% of training time (target < 2%)")
    return {"throughput with / without views": (ratio, ">= 0.98"),
            "views' own time / training time": (median(own), "< 0.02")}


if __name__ == "__main__":
    main()
