"""The engine's state as data: everything needed to continue training exactly.

`capture(engine)` gives the model, optimizer (and its class), LR schedule and gradient-scaler
states, every RNG (torch, CUDA, numpy, Python) and the position (step, epoch, samples used);
`restore(engine, state)` puts it back all or nothing: checked against the model and optimizer
first, and on a failure part-way everything is put back as it was. Checkpoints write this to
disk; trials keep a copy in memory and put it back after measuring.
"""
from __future__ import annotations

import copy
import random

import numpy as np
import torch


class StateMismatch(ValueError):
    """A state that does not fit this engine's model or optimizer; `what` is 'model' or 'optimizer'."""

    def __init__(self, what: str, why: str):
        self.what, self.why = what, why
        super().__init__(f"does not fit this {what} ({why})")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture(engine, detached: bool = False) -> dict:
    """The engine's state; `detached=True` copies every tensor (a snapshot training cannot change)."""
    state = {"model": engine.model.state_dict(), "optimizer": engine.optimizer.state_dict(),
             "optimizer_class": type(engine.optimizer).__name__,
             "scheduler": engine.schedule.state_dict() if engine.schedule is not None else None,
             "scaler": engine.precision.scaler.state_dict(), "rng": rng_state(), "position": engine.position()}
    if detached:
        state = {**copy.deepcopy({k: v for k, v in state.items() if k != "model"}),
                 "model": {k: v.detach().clone() for k, v in state["model"].items()}}
    return state


def restore(engine, state: dict) -> None:
    """Put `state` back into the engine, all or nothing (StateMismatch when it does not fit)."""
    problem = misfit(engine, state)
    if problem:
        raise StateMismatch(*problem)
    before = capture(engine, detached=True)
    try:
        _load(engine, state)
    except Exception as exc:
        _load(engine, before)
        raise StateMismatch("model and optimizer", str(exc)) from None
    set_rng_state(state["rng"])
    engine.set_position(state["position"])


def _load(engine, state: dict) -> None:
    engine.model.load_state_dict(state["model"])
    engine.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # it keeps the tensors it is given
    if state["scaler"]:  # a disabled scaler saves nothing
        engine.precision.scaler.load_state_dict(state["scaler"])
    if state.get("scheduler") is not None and engine.schedule is not None:
        engine.schedule.load_state_dict(copy.deepcopy(state["scheduler"]))


def misfit(engine, state: dict) -> tuple[str, str] | None:
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


class Snapshot:
    """Everything a trial can change on an engine (its state, gradients and config), copied so it
    can be put back exactly, as often as a tool measures."""

    def __init__(self, engine):
        self.engine = engine
        self.config = engine.config
        self.state = capture(engine, detached=True)
        self.grads = [None if p.grad is None else p.grad.detach().clone() for p in engine.model.parameters()]
        self.spare_held = None  # held training data a restore dropped, reused while this snapshot lives
        engine.snapshots.add(self)

    def restore(self, config=None) -> None:
        """Put the state back; the engine ends configured with `config` (default: the one taken)."""
        engine = self.engine
        held = engine.held_data
        engine.reconfigure(self.config)  # the config the state was taken under, then the state itself
        if held is not None and engine.held_data is None:
            self.spare_held = held  # the next trial that holds this data set again takes this copy
        engine.load_state_dict(self.state)
        for p, g in zip(engine.model.parameters(), self.grads):
            p.grad = None if g is None else g.clone().to(p.device)
        if config is not None:  # a kept config is a change from the snapshot's: the LR rule rescales the schedule
            engine.reconfigure(config)
        engine.set_lr(engine.step)


class Setup:
    """What an engine trains with, as objects (not what it learned): the recipe, config, optimizer and
    schedule objects with their rates, the loader and the position. A tool that finds the engine with
    parts or a config of its own puts this back afterwards (see tools/trial.py: keeps_live_setup)."""

    def __init__(self, engine):
        self.recipe, self.config, self.optimizer, self.schedule = (engine.recipe, engine.config, engine.optimizer,
                                                                   engine.schedule)
        self.base_lrs, self.loader, self.held = engine.base_lrs, engine.loader, engine.held_data
        self.built = engine.built  # what the optimizer and schedule were built as (adoption.Built)
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
        self.schedule_state = copy.deepcopy(engine.schedule.state_dict()) if engine.schedule is not None else None
        self.schedule_notes = list(engine.schedule.notes) if engine.schedule is not None else []
        self.position = engine.position()

    def put_back(self, engine) -> None:
        engine.recipe, engine.optimizer, engine.schedule = self.recipe, self.optimizer, self.schedule
        engine.base_lrs, engine.built = self.base_lrs, self.built
        engine.reconfigure(self.config)  # toggles, precision and device as they were
        engine.loader, engine.held_data = self.loader, self.held
        for group, saved in zip(self.optimizer.param_groups, self.groups):
            group.update(saved)  # the rates exactly, not rescaled there and back
        if self.schedule is not None:
            self.schedule.load_state_dict(copy.deepcopy(self.schedule_state))
            self.schedule.notes[:] = self.schedule_notes
        engine.set_position(self.position)

