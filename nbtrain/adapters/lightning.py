"""A LightningModule trained as it is, without a Lightning Trainer.

nbtrain calls the module's own `training_step(batch, batch_idx)`, `configure_optimizers()`,
`validation_step` and, when no data is given, `train_dataloader()` / `val_dataloader()`;
`self.log(...)` calls are collected. The module is wrapped in a small nn.Module whose forward
is the training step, so DDP sees the call and synchronises gradients as it does for any
model. `lightning` itself is never imported here: a LightningModule is recognised by its
class name in the object's MRO, so users without Lightning pay nothing.
"""
from __future__ import annotations

import torch
from torch import nn

from ..recipe import Recipe, RecipeError, own_loss
from ..slots import Slot

_LIGHTNING_MODULES = ("lightning.pytorch.core.module", "pytorch_lightning.core.module")


def is_lightning_module(obj) -> bool:
    return any(cls.__name__ == "LightningModule" and cls.__module__ in _LIGHTNING_MODULES
               for cls in type(obj).__mro__)


class LogCollector:
    """Stands in for LightningModule.log: keeps the last value of each name (detached, no device sync)."""

    def __init__(self):
        self.values: dict = {}

    def __call__(self, name, value, *args, **kwargs):
        self.values[name] = value.detach() if isinstance(value, torch.Tensor) else value

    def log_dict(self, values, *args, **kwargs):
        for name, value in values.items():
            self(name, value)

    def drain(self) -> dict:
        """The values logged since the last drain, as plain floats (read once per log window)."""
        out = {k: float(v) for k, v in self.values.items() if isinstance(v, (int, float, torch.Tensor))}
        self.values.clear()
        return out


class LightningTraining(nn.Module):
    """Its forward is the LightningModule's training_step, counting batch_idx as Lightning does: the
    batch's index in its epoch (the engine sets it at every epoch start and continuation)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.batch_idx = 0
        self.configured = None  # configure_optimizers()'s (optimizer, schedule), made once per live module
        self.loaders: dict = {}  # train_dataloader() / val_dataloader(), called once per live module

    def start_batches_at(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def forward(self, batch):
        output = self.module.training_step(batch, self.batch_idx)
        self.batch_idx += 1
        return output

    def validate(self, batch, batch_idx: int):
        return self.module.validation_step(batch, batch_idx)


def _training_step(model, batch):
    """The recipe's training_step: the wrapped (maybe DDP) module's forward, its loss taken out."""
    output = model(batch)
    if output is None:
        raise RecipeError("training_step returned None (it skips the batch); nbtrain needs a loss each step: "
                          "return the loss, or a dict with 'loss'")
    return own_loss(output)


def _unwrap(model):
    return getattr(model, "module", model) if not isinstance(model, LightningTraining) else model


def _validation_step(model, batch):
    """The recipe's validation step: validation_step's loss, else the training loss (no gradients here)."""
    wrapper = _unwrap(model)
    if not hasattr(type(wrapper.module), "validation_step") or \
            type(wrapper.module).validation_step is _base_validation_step(wrapper.module):
        return own_loss(wrapper.module.training_step(batch, 0))
    output = wrapper.validate(batch, 0)
    collected = getattr(wrapper.module, "log", None)
    if isinstance(collected, LogCollector):
        # A logged held-out loss is the one Lightning users read; taken out of the collector, or the
        # evaluation would add it a second time as one of validation_step's logged values.
        names = [k for k in collected.values if k in ("val_loss", "loss")] or \
                ([k for k in collected.values if "loss" in k] if output is None else [])
        if names:
            return collected.values.pop(names[0])
    return own_loss(output)


def _base_validation_step(module):
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule":
            return cls.__dict__.get("validation_step")
    return None


def _optimizer_and_schedule(module) -> tuple:
    """configure_optimizers()'s optimizer and (scheduler, interval, frequency), in any of Lightning's forms."""
    configured = module.configure_optimizers()
    scheduler = None
    if isinstance(configured, dict):
        optimizer, scheduler = configured["optimizer"], configured.get("lr_scheduler")
    elif isinstance(configured, (tuple, list)) and len(configured) == 2 and isinstance(configured[0], (list, tuple)):
        optimizers, schedulers = configured
        optimizer, scheduler = optimizers[0], (schedulers[0] if schedulers else None)
        if len(optimizers) > 1:
            raise RecipeError("configure_optimizers returned several optimizers; nbtrain trains with one "
                              "(automatic optimization); allowed: one optimizer, with or without a scheduler")
    elif isinstance(configured, (tuple, list)):
        if len(configured) != 1:
            raise RecipeError("configure_optimizers returned several optimizers; allowed: one")
        optimizer = configured[0]
    else:
        optimizer = configured
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RecipeError(f"configure_optimizers returned a {type(optimizer).__name__}; allowed: an optimizer, "
                          "a list of one, ([optimizer], [scheduler]) or {'optimizer': ..., 'lr_scheduler': ...}")
    schedule = None
    if scheduler is not None:
        if isinstance(scheduler, dict):
            schedule = (scheduler["scheduler"], scheduler.get("interval", "epoch"), scheduler.get("frequency", 1),
                        scheduler.get("monitor"))
        else:
            schedule = (scheduler, "epoch", 1, None)
    return optimizer, schedule


# What a LightningModule defines itself (training_step, configure_optimizers, validation_step).
OWN_PARTS = ("loss_fn", "training_step", "optimizer", "scheduler", "scheduler_interval", "validation_step")


def lightning_recipe(module, train_data=None, val_data=None, **parts) -> Recipe:
    """A recipe training `module` (a LightningModule) as Lightning's automatic optimization would."""
    clashing = [name for name in OWN_PARTS if parts.get(name) is not None]
    if clashing:
        raise RecipeError(f"{', '.join(clashing)}: given with a LightningModule, which defines its own (training_step, "
                          "configure_optimizers, validation_step); allowed: leave them out, or change the module")
    if getattr(module, "automatic_optimization", True) is False:  # manual optimization
        raise RecipeError("automatic_optimization=False: the LightningModule steps its optimizers itself "
                          "(self.optimizers(), self.manual_backward), which needs a Lightning Trainer; nbtrain trains "
                          "automatic optimization only: allowed: automatic_optimization=True, or a Lightning Trainer")
    slot = module.__dict__.setdefault("_nbtrain_training", Slot())
    if slot.value is None:  # one wrapper per module, so the live engine (and optimizer state) carries on
        slot.value = LightningTraining(module)
    wrapper = slot.value
    collector = module.__dict__.get("log") if isinstance(module.__dict__.get("log"), LogCollector) else LogCollector()
    module.__dict__["log"] = collector  # self.log(...) inside the steps lands here, not in a missing Trainer
    module.__dict__["log_dict"] = collector.log_dict
    if train_data is None:
        if not _overrides(module, "train_dataloader"):
            raise RecipeError("train_data: none given and the LightningModule defines no train_dataloader(); "
                              "allowed: nbtrain.fit(module, train_data) or a train_dataloader() method")
        # Once per live module too: a later call continues the same data (and its epoch), as one Trainer fit does.
        if "train" not in wrapper.loaders:
            wrapper.loaders["train"] = module.train_dataloader()
        train_data = wrapper.loaders["train"]
    if val_data is None and _overrides(module, "val_dataloader"):
        if "val" not in wrapper.loaders:
            wrapper.loaders["val"] = module.val_dataloader()
        val_data = wrapper.loaders["val"]
    own = {id(p) for p in module.parameters()}
    if wrapper.configured is None or any(id(p) not in own for g in wrapper.configured[0].param_groups
                                         for p in g["params"]):
        # Once per live module, as a Trainer calls it once per fit: every later call, cell, continuation
        # and tool keeps the same optimizer (its momentum) and schedule (its position).
        wrapper.configured = _optimizer_and_schedule(module)
    optimizer, schedule = wrapper.configured
    scheduler, interval = (None, "step") if schedule is None else _stepped(schedule)
    return Recipe(model=wrapper, train_data=train_data, training_step=_training_step, optimizer=optimizer,
                  val_data=val_data, validation_step=_validation_step, scheduler=scheduler,
                  scheduler_interval=interval, scheduler_monitor=schedule[3] if schedule else None,
                  logged=collector, **parts)


def _stepped(schedule) -> tuple:
    scheduler, interval, frequency, _ = schedule
    if interval not in ("step", "epoch"):
        raise RecipeError(f"lr_scheduler interval={interval!r}; allowed: 'step' or 'epoch'")
    if frequency != 1:
        raise RecipeError(f"lr_scheduler frequency={frequency}; nbtrain steps a scheduler every {interval}: allowed: 1")
    return scheduler, interval


def _overrides(module, name: str) -> bool:
    """The user's class defines `name` itself (LightningModule's own hooks raise or return nothing)."""
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule":
            return False
        if name in cls.__dict__:
            return True
    return False
