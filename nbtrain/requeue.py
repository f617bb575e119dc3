"""Checkpoint on a requeue signal, resume after it (the worker side of a SLURM requeue).

The batch script turns the scheduler's signal into a file, `requeue-requested`, in the run
directory (slurm_script.py). Ranks must stop after the *same* optimizer step or the
survivors hang in an all-reduce, so no rank acts on the file alone: at every log window
(the engine emits a "steps" event at the same step on every rank) each rank looks for
the file and the ranks agree with one all-reduce. Then the engine stops at that step
boundary; rank 0 saves model + optimizer (+ grad scaler) + the engine's position
(step, epoch, samples into the epoch, seed), and renames the file to `requeue-ready`,
which tells the batch script to `scontrol requeue` once every rank has exited.

On start, a worker that finds `checkpoint.pt` loads it and trains only what is left of
the budget, from the same sample of the same epoch.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as torch_dist

REQUESTED, READY, CHECKPOINT = "requeue-requested", "requeue-ready", "checkpoint.pt"
STOP_REASON = "requeue"


def remaining_budget(config, run_dir):
    """The config with the budget already spent before the checkpoint taken off, and the checkpoint."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return config, None
    state = torch.load(path, map_location="cpu", weights_only=True)
    changes = {}
    if config.max_steps is not None:
        changes["max_steps"] = max(1, config.max_steps - state["step"])
    if config.max_epochs is not None:
        # A checkpoint inside epoch E: finishing that epoch counts as one of the epochs left.
        changes["max_epochs"] = max(1, config.max_epochs - state["epoch"])
    return config.replace(**changes), state


def restore(engine, state: dict) -> None:
    """Put the checkpoint's weights, optimizer state and position into a freshly built engine."""
    engine.model.load_state_dict(state["model"])
    engine.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler") and engine.precision.scaler.is_enabled():
        engine.precision.scaler.load_state_dict(state["scaler"])
    engine.seed = state["seed"]
    engine.loader = engine._build_loader()  # the epoch order depends on the seed
    engine.step, engine.epoch = state["step"], state["epoch"]
    engine.epoch_offset, engine.samples = state["epoch_offset"], state["samples"]
    engine._set_lr(engine.step)


def save(engine, run_dir) -> None:
    """Rank 0: the checkpoint, written whole (temporary name, then rename)."""
    scaler = engine.precision.scaler
    state = {"model": {k: v.detach().cpu() for k, v in engine.model.state_dict().items()},
             "optimizer": engine.optimizer.state_dict(),
             "scaler": scaler.state_dict() if scaler.is_enabled() else None,
             "seed": engine.seed, "step": engine.step, "epoch": engine.epoch,
             "epoch_offset": engine.epoch_offset, "samples": engine.samples}
    tmp = Path(run_dir) / (CHECKPOINT + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, Path(run_dir) / CHECKPOINT)
    requested = Path(run_dir) / REQUESTED
    if requested.exists():
        os.replace(requested, Path(run_dir) / READY)
    else:  # the request file is gone (a second signal raced us): still say the checkpoint is ready
        (Path(run_dir) / READY).touch()


class RequeueWatch:
    """A MetricsLog view on every rank: all ranks stop together once any of them sees the request."""

    def __init__(self, engine, run_dir):
        self.engine, self.flag, self.requested = engine, Path(run_dir) / REQUESTED, False

    def __call__(self, event: dict, _log) -> None:
        if event["type"] != "steps" or self.requested:
            return
        seen = self.flag.exists()
        if torch_dist.is_available() and torch_dist.is_initialized():
            vote = torch.tensor([int(seen)], device=self.engine.device)
            torch_dist.all_reduce(vote, op=torch_dist.ReduceOp.MAX)
            seen = bool(vote.item())
        if seen:
            self.requested = True
            self.engine.stop(STOP_REASON)
