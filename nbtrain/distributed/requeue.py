"""Checkpoint at a step boundary on a requeue signal, resume after it (the worker side of a SLURM requeue).

Each rank of a SLURM job turns the scheduler's signal into a file, `requeue-requested`, in the
run directory (slurm_task.py). Ranks must stop after the *same* optimizer step or the
survivors hang in an all-reduce, so no rank acts on the file alone: at every log window
(the engine emits a "steps" event at the same step on every rank) each rank looks for
the file and the ranks agree with one all-reduce. Then the engine stops at that step
boundary; rank 0 saves a checkpoint (checkpoint.py) and renames the file to `requeue-ready`,
which tells the job's rank 0 to let submitit requeue the job once every rank has returned.

On start, a worker that finds a checkpoint there resumes from it (config.resume): the
engine restores the position and the budget already spent, so the job trains only what
is left, from the same sample of the same epoch.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as torch_dist

from ..engine import checkpoint, time_limit

REQUESTED, READY, FOLDER = "requeue-requested", "requeue-ready", "requeue-checkpoints"
STOP_REASON = "requeue"
STOP_REQUESTED = "stop-requested"  # written by the kernel: stop (the panel's Stop), every rank at one step


def resume_from(run_dir) -> Path | None:
    """The checkpoint a requeued job continues from (None on a first start)."""
    return checkpoint.latest(Path(run_dir) / FOLDER) if (Path(run_dir) / FOLDER).is_dir() else None


def save(engine, run_dir) -> Path:
    """Rank 0: the checkpoint (checkpoint.py: atomic; model, optimizer, scaler, RNG, position and the
    run's budget so far), then `requeue-ready`, which tells the job's task to requeue it."""
    path = checkpoint.save(engine, Path(run_dir) / FOLDER)
    requested = Path(run_dir) / REQUESTED
    if requested.exists():
        os.replace(requested, Path(run_dir) / READY)
    else:  # a second signal's trap raced us: the checkpoint is still ready
        (Path(run_dir) / READY).touch()
    return path


class RequeueWatch:
    """A MetricsLog view on every rank: all ranks stop together once any of them sees a request to
    requeue (the scheduler's signal) or to stop (the kernel's Stop)."""

    def __init__(self, engine, run_dir):
        self.engine, self.flag, self.requested = engine, Path(run_dir) / REQUESTED, False
        self.stop_flag, self.stopped = Path(run_dir) / STOP_REQUESTED, False

    def __call__(self, event: dict, _log) -> None:
        if event["type"] != "steps" or self.requested:
            return
        if not self.engine.running:
            # The run's last flush, after its loop ended: on a rank that raised, its peers are still
            # inside DDP's gradient all-reduce, and a vote here would meet that one (gloo aborts and the
            # user's traceback is lost). A run that has ended has nothing left to stop anyway.
            return
        seen = [int(self.flag.exists()), int(self.stop_flag.exists()), int(time_limit.time_up())]
        if torch_dist.is_available() and torch_dist.is_initialized():
            vote = torch.tensor(seen, device=self.engine.device)
            torch_dist.all_reduce(vote, op=torch_dist.ReduceOp.MAX)
            seen = vote.tolist()
        if seen[0]:
            self.requested = True
            self.engine.stop(STOP_REASON)
        elif seen[1] and not self.stopped:
            self.stopped = True
            self.engine.stop("stopped")
        elif seen[2] and not self.stopped:  # a rank's max_time passed: every rank ends at this step, completed
            self.stopped = True
            self.engine.stop(time_limit.TIME_UP)
