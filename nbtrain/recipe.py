"""Recipe: what to train — the user's model, data, loss and optimizer.

A recipe holds no settings (those live in TrainConfig), so the same recipe can be run
with any config, in the kernel or shipped to DDP workers. In a notebook it is read
from the namespace by conventional names (see `NAMES`), so a cell stays plain PyTorch.
"""
from __future__ import annotations

from collections.abc import Mapping  # typing's alias asks through typing's own checks, ~3 us a batch
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from .options import ConfigError, Problem
from .user_loader import FIXED_OPTIONS, adopt_loader, fixed_reason

# Conventional notebook names, first match wins.
NAMES = {
    "model": ("model",),
    "scheduler": ("scheduler", "make_scheduler"),
    "scheduler_interval": ("scheduler_interval",),
    "metrics": ("metrics",),
    "validation_step": ("validation_step",),
    "train_data": ("train_data", "train_dataset", "dataset", "data"),
    "loss_fn": ("loss_fn", "criterion", "loss"),
    "training_step": ("training_step",),
    "optimizer": ("optimizer", "make_optimizer"),
    "val_data": ("val_data", "val_dataset"),
    "collate_fn": ("collate_fn",),
}

# Names that often hold something else (`from torch.utils import data` binds a module): read only where they hold
# what the part is, so such a name is passed over, not taken and refused.
ONLY_WHEN = {"data": lambda value: isinstance(value, (Dataset, DataLoader))}


def reads_as(name: str, value) -> bool:
    """Whether `value`, found under `name`, is read as its part (NAMES): any value but None, and for a name in
    ONLY_WHEN what it asks."""
    return value is not None and ONLY_WHEN.get(name, lambda _: True)(value)


WORKER_OPTIONS = ("persistent_workers", "prefetch_factor")  # settings of a DataLoader's workers, if it has any
BATCH_NOTE = "nbtrain: the failing batch held"  # the note added to an error raised on a batch


class RecipeError(ValueError):
    """A missing or wrong piece of the recipe, named."""


OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


def _default_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)


def as_optimizer_factory(optimizer, model: nn.Module | None = None) -> OptimizerFactory:
    """Accept a factory (params -> Optimizer) or an optimizer instance, and return a factory.

    An instance is bound to one set of parameters; the engine needs to rebuild its
    optimizer (after unpickling in a DDP worker, after FSDP replaces the parameters), so an
    instance is turned into a factory of the same class, defaults *and param groups*: each
    group keeps its own hyper-parameters (per-layer rates, weight-decay groups, lr=0
    freezing) and its parameters, found again by their position in `model.parameters()`.
    Parameters in no group stay out of the optimizer, as the user made them.
    """
    if optimizer is None:
        return _default_optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        return _GroupedFactory(optimizer, model)
    if callable(optimizer):
        return optimizer
    raise RecipeError(f"optimizer: got {type(optimizer).__name__}; allowed: a function params -> "
                      "torch.optim.Optimizer (e.g. lambda p: torch.optim.SGD(p, lr=0.1)) or an optimizer")


class _GroupedFactory:
    """Rebuilds an optimizer instance's class, defaults and param groups over a model's parameters."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module | None):
        self.instance = optimizer  # used as it is while its parameters are the model's (state kept too)
        self.cls, self.defaults = type(optimizer), dict(optimizer.defaults)
        groups = optimizer.param_groups
        if model is None:  # no model to locate parameters in: one group per group, in order
            self.groups = None
            return
        position = {id(p): i for i, p in enumerate(model.parameters())}
        foreign = sum(1 for g in groups for p in g["params"] if id(p) not in position)
        if foreign:
            raise RecipeError(f"optimizer: {foreign} of its parameters are not parameters of the model (was it "
                              "built for another model, e.g. before `model` was redefined?); allowed: an "
                              "optimizer over model.parameters(), or a function params -> Optimizer")
        self.groups = [({k: v for k, v in g.items() if k != "params"}, [position[id(p)] for p in g["params"]])
                       for g in groups]

    def __call__(self, params) -> torch.optim.Optimizer:
        params = list(params)
        if self.groups is None:
            return self.cls(params, **self.defaults)
        if len(params) <= max((i for _, idx in self.groups for i in idx), default=-1):
            raise RecipeError(f"optimizer: the model now has {len(params)} parameters, fewer than when the "
                              "optimizer was built; build the optimizer again after changing the model")
        return self.cls([{**options, "params": [params[i] for i in idx]} for options, idx in self.groups],
                        **self.defaults)

    def adopts(self, params) -> bool:
        """The instance itself can be used: its parameters are exactly `params`."""
        own = [p for g in self.instance.param_groups for p in g["params"]]
        ids = {id(p) for p in params}
        return all(id(p) in ids for p in own)


@dataclass
class Recipe:
    model: nn.Module
    train_data: Dataset
    loss_fn: Callable | None = None
    training_step: Callable | None = None  # (model, batch) -> scalar loss tensor
    optimizer: Any = None  # factory params -> Optimizer, or an Optimizer instance
    val_data: Dataset | None = None
    collate_fn: Callable | None = None
    validation_step: Callable | None = None  # (model, batch) -> held-out loss; default: the training loss
    scheduler: Any = None  # factory optimizer -> LR scheduler (or a scheduler), stepped every scheduler_interval
    # "step" (every optimizer step), "epoch", or None: by what the schedule counts (engine/schedule.py:
    # OneCycleLR and CyclicLR every step, the others every epoch, as Lightning and PyTorch's examples step them)
    scheduler_interval: str | None = None
    scheduler_monitor: str | None = None  # ReduceLROnPlateau's held-out number (Lightning's "monitor" key)
    metrics: Mapping[str, Callable] | None = None  # held-out metrics: name -> fn(output, target) -> number
    logged: Any = None  # a collector of the user's own logged values (LightningModule.log), drained per window
    loader_settings: dict = field(default_factory=dict)  # from a given DataLoader: the starting config
    fixed_loader: Any = None  # a DataLoader read as it is (its own batch_sampler/sampler), toggles off
    order_note: str | None = None  # what a run says of a given DataLoader's order nbtrain stands for (a split's)

    def __post_init__(self):
        # A DataLoader the user tuned gives its dataset, collate_fn and settings; nbtrain cuts the batches.
        if isinstance(self.train_data, DataLoader):
            loader = self.train_data
            self.train_data, collate, self.loader_settings, fixed, self.order_note = adopt_loader(loader)
            self.fixed_loader = loader if fixed else None
            self.collate_fn = self.collate_fn or collate
        if isinstance(self.val_data, DataLoader):
            self.val_data = self.val_data.dataset
        problems = []
        if not isinstance(self.model, nn.Module):
            problems.append(f"model: got {type(self.model).__name__}; allowed: a torch.nn.Module")
        for name in ("train_data", "val_data"):
            data = getattr(self, name)
            if data is None and name == "val_data":
                continue
            if isinstance(data, IterableDataset):
                if name == "val_data":
                    problems.append("val_data: an IterableDataset; allowed: a map-style Dataset (held-out numbers "
                                    "are read over the whole set, which a stream cannot promise)")
                continue  # a stream trains with max_steps (the engine says so without it)
            if not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
                problems.append(f"{name}: got {type(data).__name__}; allowed: a map-style Dataset "
                                "(with __len__ and __getitem__, e.g. TensorDataset) or an IterableDataset")
            elif len(data) == 0:
                problems.append(f"{name}: the dataset is empty")
        if self.scheduler_interval not in ("step", "epoch", None):
            problems.append(f"scheduler_interval: got {self.scheduler_interval!r}; allowed: 'step', 'epoch' or None "
                            "(OneCycleLR and CyclicLR every step, other schedulers every epoch)")
        if self.metrics is not None and not (isinstance(self.metrics, Mapping) and
                                             all(callable(f) for f in self.metrics.values())):
            problems.append("metrics: allowed: a dict of name -> function(output, target) returning a number")
        for name in ("loss_fn", "training_step", "collate_fn", "validation_step", "scheduler"):
            value = getattr(self, name)
            if name == "scheduler" and hasattr(value, "step") and hasattr(value, "optimizer"):
                continue  # a scheduler instance over the given optimizer
            if value is not None and not callable(value):
                problems.append(f"{name}: got {type(value).__name__}; allowed: a function")
        if problems:
            raise RecipeError("invalid recipe: " + "; ".join(problems))
        self.optimizer = as_optimizer_factory(self.optimizer, self.model)

    def adopt_settings(self, config):
        """`config` with the given DataLoader's settings for every option the config was not given.

        An option given on purpose wins, even at its default value (batch_size=32 over the loader's 64);
        against a loader read as it is (its own sampler decides), a given value it cannot follow is refused.
        """
        settings = self.loader_settings
        if self.fixed_loader is not None:
            clashes = [name for name in FIXED_OPTIONS if name in settings and name in config.given
                       and getattr(config, name) != settings[name]]
            if clashes:
                why = fixed_reason(self.fixed_loader)
                raise ConfigError([Problem(name, getattr(config, name), f"{why} (its {name} is {settings[name]!r})")
                                   for name in clashes])
        taken = {name: value for name, value in settings.items()
                 if name not in config.given and value != getattr(config, name)}
        if not taken.get("num_workers", config.num_workers):  # no workers given or taken: none of theirs apply
            taken = {name: value for name, value in taken.items() if name not in WORKER_OPTIONS}
        return config.replace(**taken) if taken else config

    def step_loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The loss of one batch: training_step(model, batch), loss_fn(model(x), y), or the model's own loss
        (`model(**batch)` for a dict batch, Hugging Face style, returning a loss or an output holding one)."""
        part, output = "training_step" if self.training_step is not None else "model", None
        try:
            if self.training_step is not None:
                loss = self.training_step(model, batch)
            elif self.loss_fn is not None:
                inputs, target = split_batch(batch)
                output = model(inputs)
                part = "loss_fn"
                loss = self.loss_fn(output, target)
            else:
                loss = own_loss(call_model(model, batch))
        except Exception as error:
            # torch's shape and dtype errors name no batch; say what the data gave (no cost until it fails).
            if not isinstance(error, RecipeError):
                error.add_note(f"{BATCH_NOTE} {describe_batch(batch)}" + ("" if output is None else
                               f"; loss_fn got the model's output {describe_value(output)} against targets "
                               f"{describe_value(target)}"))
            with_part(error, part)
            raise
        if not (isinstance(loss, torch.Tensor) and loss.ndim == 0):
            what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else \
                f"a {type(loss).__name__}"
            source = "training_step(model, batch)" if self.training_step is not None else \
                "loss_fn(model(x), y)" if self.loss_fn is not None else "the model's own loss"
            raise with_part(RecipeError(f"{source} returned {what}; allowed: one scalar (0-dim) tensor that autograd "
                                        "can differentiate, e.g. loss.mean() or nn.CrossEntropyLoss() with its default "
                                        "reduction"), part)
        return loss

    def build_optimizer(self, params) -> torch.optim.Optimizer:
        """The optimizer factory's optimizer, or a message naming what the factory is allowed to be.

        An optimizer instance given by the user is used itself while its parameters are
        `params`: its groups, its state and the user's references to it (a scheduler) stay true.
        """
        params = list(params)
        if isinstance(self.optimizer, _GroupedFactory) and self.optimizer.adopts(params):
            return self.optimizer.instance
        try:
            optimizer = self.optimizer(params)
        except Exception as error:
            if not isinstance(error, TypeError) or error.__traceback__.tb_next is not None:
                with_part(error, "optimizer")
                raise  # raised inside the user's factory: their own traceback says why
            raise with_part(RecipeError(f"optimizer: calling it with the parameters failed ({error}); allowed: a "
                                        "function params -> torch.optim.Optimizer, e.g. lambda p: torch.optim.SGD(p, "
                                        "lr=0.1)"), "optimizer") from None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise with_part(RecipeError(f"optimizer: the factory returned a {type(optimizer).__name__}; allowed: a "
                                        "function params -> torch.optim.Optimizer, e.g. lambda p: "
                                        "torch.optim.SGD(p, lr=0.1)"), "optimizer")
        return optimizer


NO_LOSS = ("loss: neither loss_fn nor training_step is given and the model returned {what}; define "
           "loss_fn = nn.CrossEntropyLoss() (called as loss_fn(model(x), y)), training_step(model, batch) returning "
           "the loss, or a model that returns its loss (output.loss / ['loss']) from model(**batch)")


def call_model(model: nn.Module, batch):
    """The model on a batch that carries its own targets: model(**dict) (Hugging Face style) or model(tensor)."""
    if type(batch) is dict or isinstance(batch, Mapping):  # the collate's dict first: no ABC check a step
        return model(**batch)
    if isinstance(batch, torch.Tensor):
        return model(batch)
    raise RecipeError(NO_LOSS.format(what="nothing yet: a batch of (inputs, targets) needs loss_fn or training_step"))


def own_loss(output):
    """The loss a model returned: a scalar tensor, output["loss"] or output.loss (Hugging Face style)."""
    if isinstance(output, torch.Tensor) and output.ndim == 0:
        return output
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        what = f"a tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else \
            f"a {type(output).__name__} without a 'loss'"
        raise RecipeError(NO_LOSS.format(what=what))
    return loss


def split_batch(batch):
    """(inputs, target) from a batch of pairs, with a clear message otherwise."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping) and {"x", "y"} <= set(batch):
        return batch["x"], batch["y"]
    raise RecipeError(
        f"train_data items must be (input, target) pairs for loss_fn(model(input), target); got a "
        f"{type(batch).__name__}{' of ' + str(len(batch)) if isinstance(batch, (tuple, list)) else ''}; "
        "define training_step(model, batch) for other shapes")


def describe_value(value) -> str:
    """A value's structure, shapes and dtypes in one line: 'float32 tensor of shape (64, 10)'."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        shown = ", ".join(describe_value(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"{type(value).__name__} of [{shown}]"
    if isinstance(value, Mapping):
        return "dict of {" + ", ".join(f"{k!r}: {describe_value(v)}" for k, v in list(value.items())[:4]) + "}"
    return type(value).__name__


def describe_batch(batch) -> str:
    """A batch's structure, shapes and dtypes in one line: what a shape or dtype error needs."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return f"inputs: {describe_value(batch[0])}; targets: {describe_value(batch[1])}"
    return describe_value(batch)


def with_part(error: BaseException, part: str) -> BaseException:
    """`error`, marked with the recipe part that raised it ('model', 'loss_fn', 'optimizer', ...): a front-end
    that took that part from somewhere the user may not expect (an earlier cell) can say so beside it."""
    try:
        error.nbtrain_part = getattr(error, "nbtrain_part", None) or part
    except AttributeError:  # an exception type without instance attributes
        pass
    return error
