"""The engine's state as data: everything needed to continue training exactly.

`capture(engine)` gives the model, optimizer (and its class), LR schedule and gradient-scaler
states, every RNG (torch, CUDA, numpy, Python) and the position (step, epoch, samples used);
`restore(engine, state)` puts it back all or nothing: checked against the model and optimizer
first, and on a failure part-way everything is put back as it was. Checkpoints write this to
disk; a trial's own engine keeps a copy in memory (Snapshot) that each of its blocks starts from, and
starts from copies of a live engine's optimizer, schedule and loader (copy_optimizer, copy_schedule,
copy_loader), so the live ones are never trained.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import random

import numpy as np
import torch

from .support import constructor_parameters


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


@contextlib.contextmanager
def rng_kept():
    """Every RNG stream as it was before the block, after it (reading a data set must not move them)."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def capture(engine, detached: bool = False, saved: dict | None = None) -> dict:
    """The engine's state; `detached=True` copies every tensor (a snapshot training cannot change). `saved`:
    {id(tensor): a copy of its values already made} (a trial's loan), used instead of a second copy."""
    state = {"model": engine.model.state_dict(keep_vars=detached), "optimizer": engine.optimizer.state_dict(),
             "optimizer_class": type(engine.optimizer).__name__,
             "scheduler": engine.schedule.state_dict() if engine.schedule is not None else None,
             "scaler": engine.precision.scaler.state_dict(), "rng": rng_state(), "position": engine.position()}
    if detached:
        saved = saved or {}
        state = {**copy.deepcopy({k: v for k, v in state.items() if k != "model"}, dict(saved)),
                 "model": {k: _copy_of(v, saved.get(id(v))) for k, v in state["model"].items()}}
    return state


def _copy_of(tensor, saved):
    return saved if saved is not None and saved.shape == tensor.shape else tensor.detach().clone()


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
    """Everything training can change on an engine (its state, gradients and config), copied so it can be put
    back exactly, as often as a tool measures. Only a trial's own engine (borrow.Trial) is snapshotted: each
    of its blocks starts from its snapshot; a live engine is never trained and put back."""

    def __init__(self, engine, saved: dict | None = None):
        """`saved`: {id(tensor): a copy of its values} the caller keeps unchanged (see capture)."""
        self.engine = engine
        self.config = engine.config
        self.state = capture(engine, detached=True, saved=saved)
        self.grads = [None if p.grad is None else p.grad.detach().clone() for p in engine.model.parameters()]
        self.spare_held = None  # held training data a restore dropped, reused while this snapshot lives
        engine.snapshots.add(self)

    def restore(self) -> None:
        """Put the state back, and the config it was taken under."""
        engine = self.engine
        held = engine.held_data
        # The config the state was taken under, then the state itself. This machine was checked to run the config
        # when it became the engine's, and that answer cannot have changed: a config is immutable and the machine's
        # inventory is probed once a process (hardware._probe). What can change is checked again: the data set is
        # the user's object (a shorter one may hold no full batch: refused, nothing changes), and loading the state
        # checks it against the model (state.misfit), which user code can change meanwhile (a buffer registered in
        # forward, a layer replaced from the kernel while a panel's tool trains in its thread).
        engine.reconfigure(self.config, machine_checked=True)
        if held is not None and engine.held_data is None:
            self.spare_held = held  # the next trial that holds this data set again takes this copy
        engine.load_state_dict(self.state)
        for p, g in zip(engine.model.parameters(), self.grads):
            p.grad = None if g is None else g.clone().to(p.device)
        engine.set_lr(engine.step)


# --- copies a trial's engine starts from (Engine.fork): nothing in them is shared with the originals ---------

def copy_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A new optimizer of the same class over the same parameters, with copies of `optimizer`'s groups and
    state: stepping it leaves `optimizer` exactly as it was."""
    accepted = constructor_parameters(type(optimizer))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    # Some defaults are derived, not constructor arguments (AdamW's decoupled_weight_decay).
    defaults = {k: v for k, v in optimizer.defaults.items() if takes_any or k in accepted}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": g["params"]}
              for g in optimizer.param_groups]
    copied = type(optimizer)(groups, **defaults)
    copied.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # it keeps the tensors it is given
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        _count_steps(copied)
    return copied


def _count_steps(optimizer) -> None:
    """Mark `optimizer`'s steps as torch's LR schedulers do on the optimizer they drive (their first step
    checks the mark), for a copied schedule that drives this copy."""
    step = type(optimizer).step

    @functools.wraps(step)
    def counted(*args, **kwargs):
        optimizer._opt_called = True
        return step(optimizer, *args, **kwargs)
    counted._wrapped_by_lr_sched = True
    optimizer.step = counted


def same_state(optimizer: torch.optim.Optimizer, original: torch.optim.Optimizer) -> dict:
    """{id(tensor): the original's tensor} for each state tensor of `optimizer` (a copy) whose values, dtype and
    device are `original`'s: a snapshot of the copy can read the original's, which nothing steps meanwhile."""
    same = {}
    for param, values in optimizer.state.items():
        theirs = original.state.get(param, {})
        for key, value in values.items():
            other = theirs.get(key)
            if torch.is_tensor(value) and torch.is_tensor(other) and value is not other and \
                    (value.shape, value.dtype, value.device) == (other.shape, other.dtype, other.device) and \
                    torch.equal(value, other):
                same[id(value)] = other
    return same


def copy_schedule(schedule, optimizer, copied_optimizer):
    """A copy of `schedule` (a Schedule with its state and notes, or a scheduler) driving `copied_optimizer`
    instead of `optimizer`."""
    if schedule is None:
        return None
    return copy.deepcopy(schedule, memo={id(optimizer): copied_optimizer})


def copy_loader(loader):
    """A DataLoader like the user's `loader` (the same data set, batching and collate), with copies of its
    sampler and generators and no pass open: iterating it never moves `loader`'s pass or random streams."""
    memo = {id(loader.dataset): loader.dataset}
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        memo[id(iterator)] = None
    return copy.deepcopy(loader, memo)
