"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint holds the model, optimizer and gradient-scaler states, every RNG state,
and the engine's position (step, epoch, samples already used in the epoch), so a
resumed run sees the same batches and random numbers as one never interrupted. It is
written to a private temporary file beside the target and renamed over it, so a crash
mid-write never leaves a broken checkpoint.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import torch

from .state import StateMismatch

DEFAULT_DIR = Path(".nbtrain") / "checkpoints"
_NAME = re.compile(r"step-(\d+)\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or does not fit the model."""


def folder(config) -> Path:
    return Path(config.checkpoint_dir) if config.checkpoint_dir else DEFAULT_DIR


def save(engine, directory: Path) -> Path:
    """Write the engine's state as step-N.pt in `directory`, atomically; returns the path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = directory / f"step-{engine.step:08d}.pt"
    state = {**engine.state_dict(), "config": engine.config.to_dict()}
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".writing-", suffix=".pt")
    try:
        with os.fdopen(handle, "wb") as out:
            torch.save(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def latest(directory: Path) -> Path | None:
    found = sorted((int(m.group(1)), p) for p in directory.glob("step-*.pt") if (m := _NAME.search(p.name)))
    return found[-1][1] if found else None


def resolve(config) -> Path:
    """The file `config.resume` points at ('last' means the newest in the checkpoint folder)."""
    if config.resume == "last":
        path = latest(folder(config))
        if path is None:
            raise CheckpointError(f"resume='last': no checkpoint in {folder(config)}; "
                                  "allowed: a checkpoint file, or 'last' once a run wrote one there")
        return path
    path = Path(config.resume)
    if not path.is_file():
        raise CheckpointError(f"resume={config.resume!r}: no such checkpoint file; allowed: a file written "
                              f"by checkpoint_every, or 'last'")
    return path


def load(engine, path: Path) -> None:
    """Put the engine back exactly where the checkpoint at `path` was written (all or nothing)."""
    where = f"resume={str(path)!r}"
    try:
        state = torch.load(path, map_location=engine.device, weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"{where}: cannot read the checkpoint ({exc})") from None
    try:
        engine.load_state_dict(state)
    except StateMismatch as exc:
        raise CheckpointError(f"{where}: the checkpoint {exc}; nothing was loaded, the model and optimizer are as "
                              "they were") from None
