"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint holds the model, optimizer and gradient-scaler states, every RNG state,
and the engine's position (step, epoch, samples already used in the epoch), so a
resumed run sees the same batches and random numbers as one never interrupted. It is
written to a private temporary file beside the target and renamed over it, so a crash
mid-write never leaves a broken checkpoint.
"""
from __future__ import annotations

import copy
import os
import random
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

DEFAULT_DIR = Path(".nbtrain") / "checkpoints"
_NAME = re.compile(r"step-(\d+)\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or does not fit the model."""


def folder(config) -> Path:
    return Path(config.checkpoint_dir) if config.checkpoint_dir else DEFAULT_DIR


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(engine, directory: Path) -> Path:
    """Write the engine's state as step-N.pt in `directory`, atomically; returns the path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = directory / f"step-{engine.step:08d}.pt"
    state = {"model": engine.model.state_dict(), "optimizer": engine.optimizer.state_dict(),
             "optimizer_class": type(engine.optimizer).__name__,
             "scheduler": engine.schedule.state_dict() if engine.schedule is not None else None,
             "scaler": engine.precision.scaler.state_dict(), "rng": _rng_state(),
             "position": engine.position(), "config": engine.config.to_dict()}
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
    """Put the engine back exactly where the checkpoint at `path` was written.

    All or nothing: the checkpoint is checked against the model and optimizer first, and
    if loading still fails part-way, model, optimizer and scaler are put back as they were,
    so a refused resume leaves the user's training untouched.
    """
    where = f"resume={str(path)!r}"
    try:
        state = torch.load(path, map_location=engine.device, weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"{where}: cannot read the checkpoint ({exc})") from None
    problem = _misfit(engine, state)
    if problem:
        raise CheckpointError(f"{where}: the checkpoint does not fit this {problem[0]} ({problem[1]}); nothing "
                              "was loaded, the model and optimizer are as they were") from None
    before = _copy_state(engine)
    try:
        engine.model.load_state_dict(state["model"])
        engine.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:  # a disabled scaler saves nothing
            engine.precision.scaler.load_state_dict(state["scaler"])
        if state.get("scheduler") is not None and engine.schedule is not None:
            engine.schedule.load_state_dict(state["scheduler"])
    except Exception as exc:
        _restore_state(engine, before)
        raise CheckpointError(f"{where}: the checkpoint does not fit this model and optimizer ({exc}); nothing "
                              "was loaded, the model and optimizer are as they were") from None
    _set_rng_state(state["rng"])
    engine.set_position(state["position"])


def _misfit(engine, state: dict) -> tuple[str, str] | None:
    """What the checkpoint does not fit (model or optimizer) and why, or None."""
    own = engine.model.state_dict()
    saved = state.get("model", {})
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    if missing or unexpected:
        return "model", "; ".join(f"{what} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                                  for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys)
    shapes = [f"{k}: {tuple(saved[k].shape)} in the checkpoint, {tuple(v.shape)} here" for k, v in own.items()
              if isinstance(v, torch.Tensor) and tuple(saved[k].shape) != tuple(v.shape)]
    if shapes:
        return "model", "; ".join(shapes[:3])
    kind = state.get("optimizer_class")
    here = type(engine.optimizer).__name__
    if kind is not None and kind != here:
        return "optimizer", f"its optimizer is {kind}, this recipe's is {here}"
    saved_groups = state["optimizer"]["param_groups"]
    groups = engine.optimizer.param_groups
    if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in groups]:
        return "optimizer", "its optimizer's param groups hold other parameters than this recipe's"
    settings = lambda g: set(g) - {"params", "foreach", "fused", "capturable", "differentiable", "initial_lr"}  # noqa: E731
    if any(settings(a) != settings(b) for a, b in zip(saved_groups, groups)):
        return "optimizer", f"its optimizer has other settings than this recipe's {here}"
    return None


def _copy_state(engine) -> dict:
    return {"model": {k: v.detach().clone() for k, v in engine.model.state_dict().items()},
            "optimizer": copy.deepcopy(engine.optimizer.state_dict()),
            "scaler": copy.deepcopy(engine.precision.scaler.state_dict()),
            "scheduler": copy.deepcopy(engine.schedule.state_dict()) if engine.schedule is not None else None}


def _restore_state(engine, before: dict) -> None:
    engine.model.load_state_dict(before["model"])
    engine.optimizer.load_state_dict(before["optimizer"])
    if before["scaler"]:
        engine.precision.scaler.load_state_dict(before["scaler"])
    if before["scheduler"] is not None:
        engine.schedule.load_state_dict(before["scheduler"])
