"""The sbatch script for a run: one torchrun agent per node, c10d rendezvous on the first node.

`sbatch_script(...)` returns the text; nothing here runs SLURM. Every value that comes from
the user or from a path (job name, run directory, python, partition, any sbatch option) is
written with shlex.quote: in `#SBATCH` lines sbatch itself undoes the quoting, in the body
bash does, so a name like `a'b $(rm -rf ~)` stays a plain string. Values with line breaks
are refused, since they could start a new line of the script.

Requeue: the job asks for `--signal=B:USR1@SECONDS`, so only this batch shell gets the
signal before the time limit. Its trap touches `requeue-requested` in the run directory;
the workers notice it together at a log boundary (requeue.py), rank 0 saves a checkpoint
and renames the file to `requeue-ready`; once every rank has exited, the script runs
`scontrol requeue`, and the requeued job's workers resume from the checkpoint.
"""
from __future__ import annotations

import re
import shlex

from ..distributed.plan import LaunchPlan

SIGNAL_DEFAULT = "USR1@90"
# Options nbtrain derives from the config or the run directory; a user value would contradict them.
_OWN_OPTIONS = {"nodes", "ntasks_per_node", "ntasks", "output", "error", "open_mode", "signal", "requeue",
                "no_requeue", "wrap", "parsable", "wait"}
_OPTION_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class SlurmOptionError(ValueError):
    """A bad sbatch option: names the option, the value and what is allowed."""


def sbatch_options(options: dict) -> list[str]:
    """`{"partition": "gpu", "time": "01:00:00", "exclusive": True}` -> `--partition=gpu`, ..., `--exclusive`.

    Values are returned unquoted; the script quotes them where it writes them.
    """
    out = []
    for name, value in options.items():
        if not _OPTION_NAME.match(name):
            raise SlurmOptionError(f"sbatch option {name!r}: allowed: a long option name in lowercase with _ for - "
                                   f"(partition, time, gpus_per_node, ...)")
        if name in _OWN_OPTIONS:
            hint = "set num_nodes / devices in the config" if name in ("nodes", "ntasks", "ntasks_per_node") else \
                "nbtrain sets it (requeue_signal= changes the signal)"
            raise SlurmOptionError(f"sbatch option {name}={value!r}: not allowed here: {hint}")
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SlurmOptionError(f"sbatch option {name}={value!r}: allowed: a string, a number, or True for a "
                                   f"flag without value")
        text = str(value)
        if not text or any(c in text for c in "\n\r\0"):
            raise SlurmOptionError(f"sbatch option {name}={value!r}: allowed: a non-empty value on one line")
        out.append(f"{flag}={text}")
    return out


def check_signal(spec: str | None) -> str | None:
    """`USR1@90` (signal name or number @ seconds before the time limit), or None for no requeue signal."""
    if spec is None:
        return None
    if not isinstance(spec, str) or not re.fullmatch(r"(SIG)?[A-Z0-9]+@\d+", spec):
        raise SlurmOptionError(f"requeue_signal={spec!r}: allowed: SIGNAL@SECONDS such as USR1@90, or None")
    return spec


def sbatch_script(plan: LaunchPlan, run_dir: str, *, python: str, job_name: str = "nbtrain",
                  options: dict | None = None, requeue_signal: str | None = SIGNAL_DEFAULT,
                  socket_ifname: str | None = "auto", target: list[str] | None = None) -> str:
    """The batch script text for a batch job's plan (plan.for_batch_job), whose launch.json in `run_dir`
    tells the workers the rest. `target` is what torchrun runs (default `-m nbtrain.distributed.worker RUN_DIR`)."""
    q = shlex.quote
    if not isinstance(job_name, str) or not job_name or any(c in job_name for c in "\n\r\0"):
        raise SlurmOptionError(f"job_name={job_name!r}: allowed: a non-empty name on one line")
    extra = sbatch_options(options or {})
    requeue_signal = check_signal(requeue_signal)
    gpus = plan.backend == "nccl"  # backend_for chose nccl: the ranks run on CUDA, one GPU each
    nodes, nproc = plan.nodes, plan.procs_per_node
    header = [f"--job-name={job_name}", f"--nodes={nodes}", "--ntasks-per-node=1",
              f"--output={run_dir}/slurm-%j.out", "--open-mode=append"]
    if gpus:
        header.append(f"--gpus-per-node={nproc}")
    if requeue_signal:
        header += [f"--signal=B:{requeue_signal}", "--requeue"]
    header += extra
    command = " ".join(q(part) for part in target) if target else '-m nbtrain.distributed.worker "$run_dir"'
    lines = ["#!/bin/bash"] + [f"#SBATCH {q(h)}" for h in header] + [
        "# Written by nbtrain: one torchrun agent per node; c10d rendezvous on the allocation's first node.",
        "set -u",
        f"run_dir={q(run_dir)}",
        f"python={q(python)}",
        f"nproc={nproc}",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "# The node's address as SLURM knows it (NodeAddr), which is also right where node names do not resolve.",
        'head_addr=$(scontrol show node -o "$head_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'head_addr=${head_addr:-$head_node}',
        "# One port per job id, so two jobs sharing a node do not collide (a requeued job reuses its own).",
        "port=$((20000 + SLURM_JOB_ID % 20000))",
        'cpus=${SLURM_CPUS_ON_NODE:-$nproc}',
        'threads=$((cpus / nproc)); [ "$threads" -ge 1 ] || threads=1',
        "# The plan leaves each rank's threads to this script, which knows the node's allocation.",
        'export OMP_NUM_THREADS="$threads"',
    ]
    if socket_ifname == "auto":
        lines.append('case "$head_addr" in 127.*|localhost) export GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo ;; esac')
    elif socket_ifname:
        lines.append(f"export GLOO_SOCKET_IFNAME={q(socket_ifname)} NCCL_SOCKET_IFNAME={q(socket_ifname)}")
    lines += [
        'rm -f -- "$run_dir/requeue-requested" "$run_dir/requeue-ready"',
        "trap 'touch -- \"$run_dir/requeue-requested\"' USR1",
        'echo "nbtrain: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous $head_addr:$port,'
        ' restart ${SLURM_RESTART_COUNT:-0}"',
        'srun --kill-on-bad-exit=1 --ntasks-per-node=1 "$python" -m torch.distributed.run \\',
        f"    --nnodes={nodes} --nproc-per-node=\"$nproc\" --rdzv-backend=c10d \\",
        '    --rdzv-endpoint="$head_addr:$port" --rdzv-id="$SLURM_JOB_ID" \\',
        f"    {command} &",
        "srun_pid=$!",
        "# `wait` returns early when the trap runs; keep waiting until srun itself has ended.",
        'status=0',
        'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; status=$?; done',
        'if [ -e "$run_dir/requeue-ready" ]; then',
        '  rm -f -- "$run_dir/requeue-ready"',
        '  echo "nbtrain: checkpoint saved; requeueing job $SLURM_JOB_ID"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "  exit 0",
        "fi",
        'rm -f -- "$run_dir/requeue-requested"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
