"""One rank of a SLURM job: what submitit runs in each task (`srun` starts one task per rank).

submitit pickles a `RankTask` with the job, and every task of the job calls it: the task sets
the torch.distributed environment from SLURM's (RANK from SLURM_PROCID, ...; MASTER_ADDR from
the first node's NodeAddr, which is reachable where node names do not resolve) and runs the
worker (worker.py) on the run directory, as any launcher's ranks do.

Preemption. submitit sends the job USR2 before its time limit (and tests or admins may send
it to preempt); its own handler would checkpoint on rank 0, inside whatever step rank 0 is in,
while the other ranks go on. Here every rank's handler only marks the request in the run
directory; the ranks agree at their next log window to stop after the same step
(requeue.py), rank 0 saves that step-boundary checkpoint, and only then does rank 0 hand the
signal to submitit's handler, which pickles this task again (`checkpoint`) and requeues the
job with `scontrol requeue`. The requeued job's ranks resume from the checkpoint.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import submitit

from . import requeue
from .rundir import RunDir

PORT_BASE, PORT_SPAN = 20000, 20000
_KILLED_BY_REQUEUE_S = 120.0  # how long a rank waits for the requeue to end it before saying so


class RankFailed(RuntimeError):
    """A rank raised; its traceback is in the run directory (error-rank{N}.txt)."""


class RankTask(submitit.helpers.Checkpointable):
    """The callable every task of the job runs; `checkpoint` (submitit's) resubmits it as it is: the
    requeued job finds the step-boundary checkpoint in the run directory."""

    def __init__(self, run_dir):
        self.run_dir = str(run_dir)

    def __call__(self) -> None:
        from .worker import run_job
        env = submitit.JobEnvironment()
        rank = env.global_rank
        _set_distributed_env(env)
        run = RunDir(self.run_dir)
        if rank == 0:  # before the ranks meet, so no rank sees a marker left from before a requeue
            for name in (requeue.REQUESTED, requeue.READY):
                (run.path / name).unlink(missing_ok=True)
            print(f"nbtrain: job {env.job_id} on {os.environ.get('SLURM_JOB_NODELIST', '?')}, rendezvous "
                  f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, restart "
                  f"{os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
        preempt = signal.Signals["SIG" + submitit.JobEnvironment.USR_SIG]  # submitit's --signal, USR2 unless set
        submitits_handler = signal.getsignal(preempt)
        signal.signal(preempt, lambda *_: (run.path / requeue.REQUESTED).touch())
        code = run_job(run)
        # From here a preemption signal has nothing left to stop, and Python's exit would restore USR2's default
        # action (end the process) while it still flushes: a job that has trained must not fail for it.
        signal.signal(preempt, signal.SIG_IGN)
        if code != 0:
            raise RankFailed(f"rank {rank} failed; its traceback: {run.path}/error-rank{rank}.txt")
        if (run.path / requeue.READY).exists():  # every rank stopped at one step; rank 0 saved it
            if rank == 0:
                submitits_handler(preempt, None)  # pickles this task again, requeues, exits
            time.sleep(_KILLED_BY_REQUEUE_S)  # the requeue ends this process
            raise RankFailed(f"rank {rank}: the job was not requeued {_KILLED_BY_REQUEUE_S:g} s after its checkpoint")


def _set_distributed_env(env) -> None:
    """What torch.distributed reads, from SLURM's view of this task."""
    per_node = env.num_tasks // max(env.num_nodes, 1)
    head = env.hostnames[0]
    address = node_address(head)
    os.environ.update(RANK=str(env.global_rank), WORLD_SIZE=str(env.num_tasks), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR=address,
                      # One port per job id: two jobs sharing a node do not collide (a requeued job reuses its own).
                      MASTER_PORT=str(PORT_BASE + int(env.raw_job_id) % PORT_SPAN))
    if address.startswith("127.") or address == "localhost":  # every rank on this machine: loopback sockets
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # The plan leaves each rank's threads to the node's allocation, which only the job knows.
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE", per_node))
    os.environ["OMP_NUM_THREADS"] = str(max(1, cpus // max(per_node, 1)))


def node_address(node: str) -> str:
    """The address SLURM reaches `node` at (its NodeAddr): node names need not resolve (several slurmd
    "nodes" on one host, or names only SLURM knows)."""
    shown = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30)
    for field in shown.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node
