"""A tool's trial: an engine of its own that borrows the live model and gives it back.

A trial shares one thing with the live engine: the model. It borrows it (`Loan`: its weights, buffers
and gradients, with their devices and layouts, its modules' modes, plain numbers and activation checkpointing,
every RNG stream (the global ones and the generators its data sets and modules keep: random_streams.py) and the
process-wide matmul settings are saved when the trial starts and put back, bit for bit, when it ends), and trains it with parts of its own (Engine.fork): a copy of the live optimizer
and its state, a copy of the schedule and its notes, its own loader over the same data (a fresh
iteration, never the live loader's open pass or its generator), its own scaler, position and config.
The live engine's objects are never reached, so there is no list of things to put back that could
forget one: only the model goes back.

    with engine.trial(config=engine.config.replace(batch_size=64)) as t:
        t.engine.run()       # trains the trial's engine on the borrowed model
        t.reset()            # the trial's engine back where it started (each block of a tool starts here)
    # the model is as it was; the live engine was never touched
"""
from __future__ import annotations

import dataclasses

import torch

from .data import stop_workers
from .random_streams import Saved
from .state import Snapshot, copy_loader, copy_optimizer, copy_schedule, rng_state, same_state, set_rng_state

_NO_FORWARD = object()  # a module without a forward of its own (the class's forward runs)


class Loan:
    """The model lent to a trial, as it was when lent; `give_back` puts it back exactly."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        modules = list(model.modules())
        # Each tensor slot: (module, kind, name, the tensor object, its values) — a device move or a memory
        # format change replaces a parameter's data (or a buffer) with another tensor; training changes values.
        self.tensors, seen = [], {}
        for module in modules:
            for kind in ("_parameters", "_buffers"):
                for name, tensor in getattr(module, kind).items():
                    if tensor is None:
                        continue
                    if id(tensor) not in seen:  # a shared (tied) tensor is saved once
                        seen[id(tensor)] = (tensor.data, tensor.detach().clone())
                    self.tensors.append((module, kind, name, tensor) + seen[id(tensor)])
        self.grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
        self.modes = [(m, m.training) for m in modules]
        self.forwards = [(m, m.__dict__.get("forward", _NO_FORWARD), m.__dict__.get("_nbtrain_checkpointed"))
                         for m in modules]
        self.rng = rng_state()
        self.matmul = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)

    def saved(self) -> dict:
        """{id(tensor): the copy of its values made when lent}: read, never written, until given back."""
        return {id(tensor): values for _, _, _, tensor, _, values in self.tensors}

    def give_back(self) -> None:
        with torch.no_grad():
            for module, kind, name, tensor, data, values in self.tensors:
                getattr(module, kind)[name] = tensor
                now = tensor.data
                if (now.device, now.dtype, now.stride(), now.data_ptr()) == \
                        (data.device, data.dtype, data.stride(), data.data_ptr()):
                    now.copy_(values)  # the same memory: its values back in place
                else:  # moved or converted in the trial: the tensor as it was lent
                    tensor.data = values
        for p, grad in self.grads:
            p.grad = grad
        for module, training in self.modes:
            module.training = training
        for module, forward, checkpointed in self.forwards:
            if forward is _NO_FORWARD:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
            if checkpointed is None:
                module.__dict__.pop("_nbtrain_checkpointed", None)
            else:
                module._nbtrain_checkpointed = checkpointed
        set_rng_state(self.rng)
        torch.set_float32_matmul_precision(self.matmul[0])
        torch.backends.cudnn.benchmark = self.matmul[1]


def own_parts(recipe, instances: bool = True):
    """The recipe a trial's engine trains with: a user's DataLoader read as it is replaced by a copy (its sampler
    and generators), and (`instances`) an optimizer or scheduler instance the user gave by copies of them, so
    the trial reads and steps only its own."""
    changes = {}
    if recipe.fixed_loader is not None:
        changes["fixed_loader"] = copy_loader(recipe.fixed_loader)
    instance = getattr(recipe.optimizer, "instance", None)  # an optimizer given as an instance (recipe.py)
    if instances and instance is not None and recipe.optimizer.adopts(list(recipe.model.parameters())):
        copied = copy_optimizer(instance)
        changes["optimizer"] = lambda params: copied
        if getattr(recipe.scheduler, "optimizer", None) is instance:  # a scheduler instance driving it
            changes["scheduler"] = copy_schedule(recipe.scheduler, instance, copied)
    return dataclasses.replace(recipe, **changes) if changes else recipe


class Trial:
    """An engine of a trial's own (`engine`, made by `make` once the model is lent), then configured with
    `config`; `reset()` puts that engine back where the trial started it, `close()` (or leaving the
    `with` block) stops its loader's workers and gives the model back. `recipe`: the recipe the trial was
    asked for, as given (a kept config goes to the live engine with it)."""

    def __init__(self, model: torch.nn.Module, make, config=None, recipe=None, original=None):
        """`original`: the optimizer the trial's engine copied (the live one), which nothing steps meanwhile."""
        self.recipe = recipe
        self.loan = Loan(model)
        self.saved = None
        try:
            self.engine = make()
            r = self.engine.recipe  # the data sets' own generators, the modules' plain numbers: put back at close
            self.saved = Saved(model, r.train_data, r.val_data, r.fixed_loader, r.collate_fn, r.loss_fn)
            if config is not None:
                self.engine.reconfigure(config)
            # Where each of the trial's blocks starts: its weights are the loan's copy, its optimizer state the
            # original's where the copy's still equals it (one copy of each, not two).
            saved = self.loan.saved()
            if original is not None:
                saved.update(same_state(self.engine.optimizer, original))
            self.start = Snapshot(self.engine, saved=saved)
        except BaseException:
            self.loan.give_back()
            if self.saved is not None:
                self.saved.put_back()
            raise

    def reset(self) -> None:
        self.start.restore()

    def close(self) -> None:
        try:
            stop_workers(self.engine.loader)
        finally:
            self.loan.give_back()
            self.saved.put_back()

    def __enter__(self) -> "Trial":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
