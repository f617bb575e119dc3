"""DDP steady-state parity: nbtrain's 2 CPU ranks against a hand-written DDP script under torchrun.

Workload: an MLP 256-256-10 on 28,800 random samples, batch 32 per rank, SGD, shuffled by
DistributedSampler (seed 0), 420 steps; 2 ranks on the CPU, gloo, OMP_NUM_THREADS=1 per rank
on both sides. Both sides read through a DataLoader: nbtrain runs with preload_data=False
(it would otherwise hold the TensorDataset in memory itself; benchmarks.in_memory measures
that), so only the training loop and what runs beside it differ.

  nbtrain  `nbtrain.fit(model, data, devices=2, accelerator="cpu", ...)` from this process,
           as from a kernel: ranks forked by its warm zygote, metrics streamed back live
  script   a plain DDP training script (init_process_group, DDP, DistributedSampler,
           DataLoader, the usual loop) written to a private temp folder and run with
           `torchrun --standalone --nproc_per_node 2 script.py`

Each side timestamps its own steps on rank 0 (nbtrain: its history's "time" column; the
script: time.perf_counter() after each optimizer step), and seconds per step are taken
between steps 100 and 400, past start-up and warm-up. Runs are interleaved in pairs, the
order alternating (A B, B A, ...), so a shared machine's load hits both alike; the ratio of
seconds per step is printed with a paired 95% interval (nbtrain.measure.paired), and the
loss at step 400 on rank 0 of each side (the same numbers: the same work was done).
Target: nbtrain's s/step over the script's <= 1.05.

    python -m benchmarks.ddp_parity [--pairs 10]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain.measure import paired
from nbtrain.distributed.pool import ZYGOTE

from .common import machine, median

SAMPLES, FEATURES, HIDDEN, CLASSES = 28_800, 256, 256, 10
BATCH, LR, SEED, RANKS, THREADS = 32, 0.05, 0, 2, 1
FIRST, LAST = 100, 400
STEPS = LAST + 20  # a few past the window, so the last timed step is not the run's wind-down
LOG_EVERY = 10     # nbtrain reads its losses back every 10 steps (its default); the script does the same

# The hand-written side: what a person writes for DDP by hand, nothing of nbtrain in it. Its work is
# in main(), so DDP's gloo state is freed before the interpreter shuts down: with everything at module
# level, rank 0 aborted at exit about one run in three here ("terminate called without an active
# exception", torch 2.14, after destroy_process_group), once the timings were written.
SCRIPT = """
import json, sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main(out, p):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(123)
    data = TensorDataset(torch.randn(p["samples"], p["features"], generator=g),
                         torch.randint(0, p["classes"], (p["samples"],), generator=g))
    torch.manual_seed(p["seed"])
    model = DistributedDataParallel(nn.Sequential(nn.Linear(p["features"], p["hidden"]), nn.ReLU(),
                                                  nn.Linear(p["hidden"], p["classes"])))
    optimizer = torch.optim.SGD(model.parameters(), lr=p["lr"])
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(data, shuffle=True, seed=p["seed"])
    loader = DataLoader(data, batch_size=p["batch"], sampler=sampler)
    stamps, losses, step, epoch = [], {}, 0, 0
    while step < p["steps"]:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            stamps.append(time.perf_counter())
            if step % p["log_every"] == 0:
                losses[step] = loss.item()
            if step == p["steps"]:
                break
        epoch += 1
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"stamps": stamps, "losses": losses}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
"""


def workload() -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g),
                         torch.randint(0, CLASSES, (SAMPLES,), generator=g))


def fresh_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def with_nbtrain(data) -> tuple[float, float]:
    """nbtrain's seconds per step between steps FIRST and LAST on rank 0, and its loss at LAST."""
    result = nbtrain.fit(fresh_model(), data, loss_fn=nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.SGD(p, lr=LR), devices=RANKS, accelerator="cpu",
                         batch_size=BATCH, max_steps=STEPS, seed=SEED, shuffle=True, preload_data=False,
                         log_every_n_steps=LOG_EVERY)
    step, t, loss = list(result.history["step"]), result.history["time"], result.history["loss"]
    first, last = step.index(FIRST), step.index(LAST)
    return (t[last] - t[first]) / (LAST - FIRST), loss[last]


def torchrun() -> list[str]:
    here = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [here] if os.path.exists(here) else [sys.executable, "-m", "torch.distributed.run"]


def with_script(folder: str, threads: int) -> tuple[float, float]:
    """The hand-written script's seconds per step between steps FIRST and LAST on rank 0, and its loss at LAST."""
    script, out = os.path.join(folder, "ddp_by_hand.py"), os.path.join(folder, "stamps.json")
    if not os.path.exists(script):
        with open(script, "w") as f:
            f.write(SCRIPT)
    params = {"samples": SAMPLES, "features": FEATURES, "hidden": HIDDEN, "classes": CLASSES, "batch": BATCH,
              "lr": LR, "seed": SEED, "steps": STEPS, "log_every": LOG_EVERY}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([*torchrun(), "--standalone", "--nproc_per_node", str(RANKS), script, out,
                           json.dumps(params)], env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the torchrun script failed ({done.returncode}):\n{done.stderr[-3000:]}")
    with open(out) as f:
        found = json.load(f)
    stamps = found["stamps"]  # stamps[i]: the end of step i + 1
    return (stamps[LAST - 1] - stamps[FIRST - 1]) / (LAST - FIRST), found["losses"][str(LAST)]


def main(argv=None) -> dict:
    """Returns {measure: (value, target)}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args(argv)
    # nbtrain gives each local rank cpu_count // ranks threads (1 on a 2-core machine); the script gets the same.
    threads = max(1, (os.cpu_count() or 1) // RANKS)
    if threads != THREADS:
        print(f"note: nbtrain gives each rank {threads} threads on this machine, not {THREADS}; the script gets "
              f"the same {threads}")
    data = workload()
    folder = tempfile.mkdtemp(prefix="nbtrain-ddp-parity-")  # private (mode 0700), removed at the end
    try:
        sides = (("nbtrain", lambda: with_nbtrain(data)), ("script", lambda: with_script(folder, threads)))
        with_nbtrain(data)  # warm-up, not counted: starts nbtrain's zygote, as a kernel's first run does
        times = {"nbtrain": [], "script": []}
        losses = {}
        for pair in range(args.pairs):
            for name, run in (sides if pair % 2 == 0 else sides[::-1]):
                seconds, losses[name] = run()
                times[name].append(seconds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        ZYGOTE.close()  # the warm zygote this benchmark started: no process outlives it
    ours, theirs = times["nbtrain"], times["script"]
    # paired() takes rates: the script's steps/s over nbtrain's is nbtrain's s/step over the script's.
    by_rate = paired([1 / s for s in theirs], [1 / s for s in ours])  # nbtrain's steps/s over the script's
    ratio, low, high = 1 / by_rate.ratio, 1 / by_rate.high, 1 / by_rate.low
    print(f"DDP parity benchmark on {machine()}; {RANKS} CPU ranks (gloo), OMP_NUM_THREADS={threads} per rank on "
          f"both sides, MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH} per rank, DataLoader on both sides; "
          f"{args.pairs} interleaved pairs, s/step between steps {FIRST} and {LAST} on rank 0")
    print(f"hand-written script (torchrun): {1e3 * median(theirs):.3f} ms a step "
          f"({', '.join(f'{1e3 * s:.3f}' for s in theirs)})")
    print(f"nbtrain.fit(devices=2):         {1e3 * median(ours):.3f} ms a step "
          f"({', '.join(f'{1e3 * s:.3f}' for s in ours)})")
    print(f"nbtrain / script, s/step: {ratio:.3f} (95% interval {low:.3f}-{high:.3f}; target <= 1.05); "
          f"nbtrain vs script: {by_rate.text()}")
    same = f"{losses['nbtrain']:.5f}" == f"{losses['script']:.5f}"
    print(f"loss at step {LAST} on rank 0: nbtrain {losses['nbtrain']:.5f}, script {losses['script']:.5f} "
          f"({'identical' if same else 'DIFFERENT'} to 5 decimals)")
    return {"s/step nbtrain / torchrun script (95% interval)": (f"{ratio:.3f} ({low:.3f}-{high:.3f})", "<= 1.05"),
            f"loss at step {LAST} identical to 5 decimals": ("yes" if same else "NO", "yes")}


if __name__ == "__main__":
    main()
