"""A 2-node job on the project's local SLURM cluster: submit to first step, submit to result, cluster start.

    python -m benchmarks.slurm_job [--repeats 3]      (or: python -m benchmarks --only slurm_job)

The cluster is scripts/slurm_cluster.py (munged, MariaDB + slurmdbd, slurmctld, two slurmd
"nodes" on 127.0.0.1), started here and stopped at the end; it needs root and the SLURM
packages (scripts/test.sh installs them), else the benchmark says so and measures nothing.
The job trains the digits demo for one epoch on 2 nodes x 1 CPU rank (gloo), submitted with
nbtrain.slurm.submit; the first step is the first "steps" event rank 0 streams back (one per
step). Wall clock on this machine, at whatever load it has: medians of `--repeats` jobs.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cluster_module():
    spec = importlib.util.spec_from_file_location("nbtrain_slurm_cluster", ROOT / "scripts" / "slurm_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_job() -> tuple[float, float]:
    """(submit -> first step, submit -> result) of one 2-node job, in seconds."""
    from nbtrain import MetricsLog, TrainConfig, slurm
    from nbtrain.demo import digits_recipe
    log, first = MetricsLog(), {}
    log.subscribe(lambda event, _log: first.setdefault(event["type"], time.monotonic()))
    config = TrainConfig(num_nodes=2, devices=1, accelerator="cpu", batch_size=64, seed=0, max_epochs=1,
                         log_every_n_steps=1)
    started = time.monotonic()
    result = slurm.submit(digits_recipe(seed=0), config, log=log, cpus_per_task=1).wait(echo=False, timeout=300)
    assert result.status == "completed", result.status
    return first["steps"] - started, time.monotonic() - started


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cluster_module = _cluster_module()
    missing = cluster_module.missing_binaries()
    if missing or os.getuid() != 0:
        print(f"skipped: the local SLURM cluster needs root and {', '.join(missing) or 'its packages'}")
        return {}
    sys.path.insert(0, str(ROOT))
    started = time.monotonic()
    cluster = cluster_module.Cluster(None, nodes=2).start()
    start_s = time.monotonic() - started
    previous = (os.environ.get("SLURM_CONF"), os.getcwd())
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.chdir(tempfile.mkdtemp(prefix="nbtrain-slurm-bench-"))  # the jobs' run directories go under it
    try:
        jobs = [one_job() for _ in range(args.repeats)]
    finally:
        cluster.stop()
        os.chdir(previous[1])
        if previous[0] is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous[0]
    for first, done in jobs:
        print(f"submit -> first step {first:.2f} s, submit -> result {done:.2f} s")
    return {"cluster start (s)": (round(start_s, 2), "reference"),
            "submit -> first step, 2 nodes (s)": (round(statistics.median(j[0] for j in jobs), 2), "reference"),
            "submit -> result, 2 nodes (s)": (round(statistics.median(j[1] for j in jobs), 2), "reference")}


if __name__ == "__main__":
    print(main())
