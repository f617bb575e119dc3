"""Launch-to-first-step of 2 CPU DDP ranks, side by side: nbtrain vs bare torchrun vs Accelerate.

    python benchmarks/launch_latency.py [--repeats 3]      (or: python -m benchmarks --only launch_latency)

Every variant trains the same thing (the digits demo through nbtrain's Engine, 2 gloo
ranks, batch 32) and is timed from the call in a "kernel" (a fresh interpreter that has
already imported torch and nbtrain, as a notebook has) to the end of the first optimizer
step on rank 0:

  nbtrain first    fit_distributed from a fresh kernel (workers start cold)
  nbtrain repeat   fit_distributed again, once the warm pool is ready
  torchrun         `python -m torch.distributed.run --standalone --nproc-per-node 2 this_file`
  accelerate       accelerate.notebook_launcher (forks the kernel), when installed; its
                   kernel has taken an optimizer step first, so forks inherit torch._dynamo

Each variant runs in its own fresh kernel, `--repeats` times, alternating; medians are
printed with the ratios the targets speak of (first <= 0.5x torchrun, repeat <= 1.0x
Accelerate). Timings are wall clock on this machine, at whatever load it has.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's nbtrain, in every process


if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _env() -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def _rank_config():
    from nbtrain import TrainConfig
    return TrainConfig(accelerator="cpu", max_steps=STEPS, batch_size=32, log_every_n_steps=1, shuffle=False)


def train_one_rank(marker: str) -> None:
    """What every non-nbtrain variant runs on each rank: join gloo, train, rank 0 notes the first step."""
    import torch
    import torch.distributed as dist
    from nbtrain import Engine, MetricsLog
    from nbtrain.demo import digits_recipe
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    log = MetricsLog()
    if dist.get_rank() == 0:
        def note(event, _log, marker=marker):
            if event["type"] == "steps" and not os.path.exists(marker):
                with open(marker, "w") as out:
                    out.write(repr(time.time()))
        log.subscribe(note)
    Engine(digits_recipe(), _rank_config()).run(log=log)
    dist.destroy_process_group()


def _first_step(marker: str) -> float:
    with open(marker) as stream:
        return float(stream.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- variants, each in a fresh kernel --------------------------------------------------------

def kernel_nbtrain() -> dict:
    import nbtrain  # noqa: F401  (a kernel that has imported nbtrain, as a notebook has)
    from nbtrain import MetricsLog, TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.distributed.launch import fit_distributed
    from nbtrain.distributed.pool import ZYGOTE
    config = TrainConfig(devices=2, accelerator="cpu", max_steps=STEPS, batch_size=32, log_every_n_steps=1,
                         shuffle=False)

    def timed() -> float:
        seen = {}
        log = MetricsLog()
        log.subscribe(lambda event, _log: seen.setdefault(event["type"], time.time()))
        recipe = digits_recipe()
        start = time.time()
        fit_distributed(recipe, config, log=log, echo=False)
        return seen["steps"] - start

    first = timed()
    ZYGOTE.wait_ready()
    repeat = timed()
    ZYGOTE.close()
    return {"nbtrain first": first, "nbtrain repeat": repeat}


def kernel_torchrun() -> dict:
    import nbtrain  # noqa: F401
    marker = os.path.join(tempfile.mkdtemp(), "first-step")
    env = _env()
    start = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                    os.path.abspath(__file__), "--rank", marker], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"torchrun": _first_step(marker) - start}


def kernel_accelerate() -> dict:
    import torch
    import nbtrain  # noqa: F401
    from accelerate import notebook_launcher
    # Accelerate's best case: forked children inherit what the kernel imported, so let the kernel
    # have taken an optimizer step already (it imports torch._dynamo), as after a local run.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).step()
    out = {}
    for name in ("accelerate first", "accelerate"):
        marker = os.path.join(tempfile.mkdtemp(), "first-step")
        start = time.time()
        notebook_launcher(train_one_rank, args=(marker,), num_processes=2, use_port=str(_free_port()))
        out[name] = _first_step(marker) - start
    return out


KERNELS = {"nbtrain": kernel_nbtrain, "torchrun": kernel_torchrun, "accelerate": kernel_accelerate}


def _in_fresh_kernel(name: str) -> dict:
    env = _env()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--kernel", name], capture_output=True,
                          text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    """Prints the table; returns {measure: (value, target)} for `python -m benchmarks`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel", choices=sorted(KERNELS))
    parser.add_argument("--rank", metavar="MARKER")
    args = parser.parse_args(argv)
    if args.rank:
        train_one_rank(args.rank)
        return {}
    if args.kernel:
        print(json.dumps(KERNELS[args.kernel]()))
        return {}
    try:
        import accelerate  # noqa: F401
        names = ["nbtrain", "torchrun", "accelerate"]
    except ImportError:
        names = ["nbtrain", "torchrun"]
        print("accelerate is not installed (pip install accelerate): its column is left out")
    samples: dict[str, list[float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name in names:
            for key, value in _in_fresh_kernel(name).items():
                samples.setdefault(key, []).append(value)
    med = {k: statistics.median(v) for k, v in samples.items()}
    load = os.getloadavg()[0]
    print(f"launch to first optimizer step, 2 CPU ranks (gloo), median of {args.repeats}, {os.cpu_count()} cores, "
          f"load average {load_before:.1f} before / {load:.1f} after")
    for key, values in samples.items():
        print(f"  {key:<17} {med[key]:6.2f} s   ({', '.join(f'{v:.2f}' for v in values)})")
    result = {"first launch / bare torchrun": (med["nbtrain first"] / med["torchrun"], "<= 0.5")}
    print(f"  nbtrain first  / torchrun   = {result['first launch / bare torchrun'][0]:.2f}x   (target <= 0.5x)")
    if "accelerate" in med:
        result["repeat launch / Accelerate fork"] = (med["nbtrain repeat"] / med["accelerate"], "<= 1.0")
        print(f"  nbtrain repeat / accelerate = {result['repeat launch / Accelerate fork'][0]:.2f}x   "
              f"(target <= 1.0x; Accelerate forks the kernel)")
    result["repeat launch / bare torchrun"] = (med["nbtrain repeat"] / med["torchrun"], "reference")
    print(f"  nbtrain repeat / torchrun   = {result['repeat launch / bare torchrun'][0]:.2f}x")
    return result


if __name__ == "__main__":
    main()
