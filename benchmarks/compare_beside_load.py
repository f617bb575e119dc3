"""Bar: `%nbtrain_compare` of two runs taken at different times says what a direct measurement does
(issue 39, item 6).

    PYTHONPATH=. python -m benchmarks.compare_beside_load [--pairs 8] [--steps 300] [--verbose]

- Identical pairs: the same `%%nbtrain --max-steps 300` cell run twice, then `%nbtrain_compare`, beside
  another process that spins and rests in bursts of 0.2-1.5 s (a browser, an indexer): no speed verdict
  in 8 of 8 pairs. "no measurable difference", "too noisy to tell" and "the machine was busier during
  ...: the difference may be the machine's" are all right answers; "1.3x faster" is not.
  Identical settings are an A/A check ("same settings (A/A): ..."), so:
- The same beside the same bursts for a small MLP's runs that differ only in their seed (a change of
  settings that leaves the work alike, so the load's rules decide), of 3000 steps (3 s, a rate steady
  enough for a burst to show) and of 25 steps (30 ms: too short for the load to be read beside them).
- A real difference on the machine as it is: B's step waits 1.3x as long as A's (a sleep, as on a slower
  disk), so the difference is the workload's: found, near 1/1.3, in every pair.
- Equal speed on the machine as it is: the CNN cell with seeds 0 and 1, six pairs. Identical runs of it read
  up to 1.2x apart on a quiet 2-core VM; no verdict beyond how far repeats of one settings read apart (a
  verdict before any repeat is marked †, and counted apart).

Through a real IPython shell with the extension loaded, as a notebook runs it.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

import psutil

from .common import machine

IDENTICAL = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(32, 10))
train_data = torch.utils.data.TensorDataset(torch.randn(4000, 3, 32, 32), torch.randint(0, 10, (4000,)))
loss_fn = nn.CrossEntropyLoss()
"""

MLP = """
from nbtrain.demo import DigitsDataset, DigitsMLP
import torch
torch.manual_seed(0)
model = DigitsMLP()
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""

SLOWER_DISK = """
import time, torch
from nbtrain.demo import DigitsDataset

class Waits(torch.nn.Module):  # a step that waits {wait_s} s, as on a disk: a rate the workload sets
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    def forward(self, x):
        time.sleep({wait_s})
        return self.net(x)

torch.manual_seed(0)
model = Waits()
train_data = DigitsDataset()
loss_fn = torch.nn.CrossEntropyLoss()
"""

BURSTS = """
import random, time
random.seed({seed})
end = time.time() + {seconds}
while time.time() < end:
    burst = time.time() + random.uniform(0.2, 1.5)
    while time.time() < burst:
        pass
    time.sleep(random.uniform(0.2, 1.5))
"""


def bursts(seconds: float, seed: int) -> psutil.Process:
    """Another process (started by a parent that exits at once: the machine's, not this tree's) that spins
    and rests in bursts."""
    launcher = ("import subprocess, sys\n"
                f"print(subprocess.Popen([sys.executable, '-c', {BURSTS.format(seed=seed, seconds=seconds)!r}],"
                " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    return psutil.Process(int(subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True,
                                             check=True).stdout))


def speed_verdict(text: str) -> bool:
    """Whether a 'vs first' cell gives a speed verdict (a ratio), rather than no difference, too noisy or
    the machine's."""
    if "machine" in text or text.startswith("same settings"):  # the machine's, or an A/A check
        return False
    return "faster" in text or "slower" in text or "x (" in text


def shell():
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtrain")
    return ip


def pair(ip, name: str, cells: tuple[str, str], steps: int, verbose: bool, seeds=(None, None)) -> str:
    """Runs the two cells as `{name}_a` and `{name}_b` (with --seed where `seeds` gives one), then
    `%nbtrain_compare`; returns its 'vs first' cell."""
    for side, cell, seed in zip("ab", cells, seeds):
        flags = f" --seed {seed}" if seed is not None else ""
        result = ip.run_cell(f"%%nbtrain --max-steps {steps} --batch-size 32 --accelerator cpu --no-plot --no-progress "
                             f"--name {name}_{side}{flags}\n{cell}")
        result.raise_error()
    ip.run_line_magic("nbtrain_compare", f"{name}_a {name}_b")
    comparison = ip.user_ns["_nbtrain_compare"]
    if verbose:
        print(comparison.table())
        for run in comparison.runs:
            print(f"  {run.name}: {explain(run)}")
    return comparison.rows[1]["vs first"]


def explain(run) -> str:
    """One run's whole load and its steady windows' loads, for reading a verdict that went wrong."""
    from nbtrain.runs.apart import steady_windows
    whole, blocks = run.load(), steady_windows(run)
    return (f"whole: {whole.text() if whole else '-'}; own {whole.own_cores:.2f}; windows other "
            + " ".join(f"{w.other_cores:.2f}" for w in blocks) + "; waited "
            + " ".join(f"{w.waited_cores:.2f}" if math.isfinite(w.waited_cores) else "?" for w in blocks))


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quiet-pairs", type=int, default=6, help="equal-speed pairs on the machine as it is")
    parser.add_argument("--verbose", action="store_true", help="each comparison's table and its runs' loads")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    out, n = {}, args.pairs
    with tempfile.TemporaryDirectory() as folder:
        os.environ["NBTRAIN_STORE"] = os.path.join(folder, "runs.sqlite")
        ip = shell()
        burner = bursts(3600, seed=1)
        try:
            identical = [pair(ip, f"aa{i}", (IDENTICAL, IDENTICAL), args.steps, args.verbose) for i in range(n)]
            # Another seed: a change of settings that leaves the work alike, so the load's rules, not the
            # A/A check of identical settings, decide what is said.
            mlp = [pair(ip, f"mlp{i}", (MLP, MLP), 3000, args.verbose, seeds=(0, 1)) for i in range(n)]
            short = [pair(ip, f"short{i}", (MLP, MLP), 25, args.verbose, seeds=(0, 1)) for i in range(n)]
        finally:
            burner.kill()
            psutil.wait_procs([burner], timeout=10)
        for i, verdict in enumerate(identical):
            print(f"  identical pair {i + 1}: {verdict}")
        for i, verdict in enumerate(mlp):
            print(f"  3000-step MLP runs, seeds 0 and 1, pair {i + 1}: {verdict}")
        for i, verdict in enumerate(short):
            print(f"  25-step MLP runs, seeds 0 and 1, pair {i + 1}: {verdict}")
        for label, verdicts in ((f"identical {args.steps}-step CNN runs beside bursts", identical),
                                ("3000-step MLP runs (3 s), seeds 0 and 1, beside bursts", mlp),
                                ("25-step MLP runs (30 ms), seeds 0 and 1, beside bursts", short)):
            calm = sum(not speed_verdict(v) for v in verdicts)
            out[f"{label}: no speed verdict"] = (f"{calm} of {n}", f"{n} of {n}")

        cells = (SLOWER_DISK.format(wait_s=0.02), SLOWER_DISK.format(wait_s=0.026))
        real = []
        for i in range(2):  # short steps would be mostly sleep: 100 steps of 20-26 ms
            real.append(pair(ip, f"ab{i}", cells, 100, args.verbose))
            print(f"  1.3x pair {i + 1}: {real[-1]}", flush=True)
        found = [v for v in real if speed_verdict(v) and 1 / 1.45 < float(v.split("x")[0]) < 1 / 1.15]
        out["a 1.3x slower step, the machine as it is: found"] = (
            f"{len(found)} of {len(real)} ({'; '.join(real)})", f"{len(real)} of {len(real)}")

        # Equal speed, other settings, the machine as it is: identical CNN runs read up to 1.2x apart on a
        # quiet 2-core VM. The first pair has no repeat to say how far the machine moves a run (a verdict
        # there is marked †); later ones have the earlier pairs' runs of the same settings.
        quiet = [pair(ip, f"quiet{i}", (IDENTICAL, IDENTICAL), args.steps, args.verbose, seeds=(0, 1))
                 for i in range(args.quiet_pairs)]
        for i, verdict in enumerate(quiet):
            print(f"  {args.steps}-step CNN runs, seeds 0 and 1, the machine as it is, pair {i + 1}: {verdict}")
        unmarked = sum(speed_verdict(v) and not v.endswith("†") for v in quiet)
        marked = sum(speed_verdict(v) and v.endswith("†") for v in quiet)
        out["equal-speed CNN runs (seeds 0 and 1), the machine as it is: a verdict beyond the machine's spread"] = (
            f"{unmarked} of {len(quiet)} ({marked} more marked † before any repeat)", f"0 of {len(quiet)}")
    for measure, (value, wanted) in out.items():
        print(f"{measure}: {value} (target {wanted})")
    return out


if __name__ == "__main__":
    main()
