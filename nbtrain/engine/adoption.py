"""Whether a recipe given again carries on the live optimizer and schedule: decided by what they are.

A notebook passes the same factory again (`optimizer=lambda p: SGD(p, lr=LR)`) after changing what it
reads (`LR = 0.01`), or a new factory that makes the same optimizer. Neither the factory's identity nor its
code says what it makes; the values it makes do. So the factory is called (over the model's parameters: a
throwaway optimizer), and its class, every hyperparameter of every param group, each group's parameters and
what an optimizer class of the user's own keeps as its own attributes (`self.clip`, a wrapped optimizer) are
compared with those the live optimizer was built with (`Built`, recorded when it was built: the live
groups' rates are the warm-up's, the schedule's and the LR rule's by now). Equal values carry on with their
state; other values are a new optimizer, and the run's summary says which values changed. A schedule is
compared the same way: a throwaway one from the factory, over a throwaway optimizer, against the one
recorded when the live schedule was built (its class, its settings without its progress, the functions and
bound methods it calls with what they read, and what it wrote into the optimizer's groups). An optimizer or scheduler object given is the
user's own: the same object carries on, another is used as given. Where a value cannot be compared
(observed.py), nbtrain asks instead of choosing.
"""
from __future__ import annotations

import collections
import copy
import functools
import types
import warnings
from dataclasses import dataclass

import torch

from ..recipe import RecipeError
from . import walks
from .observed import Value, differences
from .support import constructor_parameters

IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")  # how a step computes (optimizer_impl), not what
DERIVED = ("base_lrs", "lr", "initial_lr", "min_lr")  # a schedule's rates derived from its settings and the optimizer's
PROGRESS = ("last_epoch", "_step_count", "_last_lr", "_is_initial", "_get_lr_called_within_step", "best",
            "num_bad_epochs", "cooldown_counter")  # where a schedule stands, not what it is


@dataclass
class Built:
    """What the live optimizer and schedule were built as."""
    source: object          # what the recipe's factory gave (a user's own optimizer object: itself)
    optimizer: dict         # its class and groups as built (optimizer_record)
    blank: object = None    # a copy of it as built, without state: what throwaway schedules are built over
    schedule: dict | None = None  # the schedule's record (schedule_record), None for none or a user's object

    @classmethod
    def of(cls, optimizer, model) -> "Built":
        return cls(optimizer, optimizer_record(optimizer, model), _copy(optimizer))


def is_scheduler_object(made) -> bool:
    return hasattr(made, "step") and hasattr(made, "optimizer")


def optimizer_record(optimizer, model, position: dict | None = None, within: tuple = ()) -> dict:
    position = position if position is not None else {id(p): i for i, p in enumerate(walks.parameters(model))}
    within = (*within, id(optimizer))  # the optimizers around this one: a wrapper its inner one points back to
    groups = optimizer.param_groups
    record = {"class": Value(type(optimizer)), "groups": Value(len(groups))}
    for i, group in enumerate(groups):
        at = sorted(position.get(id(p), -1) for p in group["params"])
        record[f"group {i}"] = {**{name: Value(value, name) for name, value in group.items()
                                   if name not in ("params", "initial_lr", *IMPLEMENTATION)},
                                "parameters": _positions(at)}
    # What a class of the user's own keeps beside its groups (`self.clip`, a wrapped optimizer): compared too.
    for name, value in vars(optimizer).items():
        if name not in _torch_attributes():
            record[f"self.{name}"] = _attribute(value, f"self.{name}", model, position, within)
    return record


def _attribute(value, name: str, model, position: dict, within: tuple):
    """An optimizer's own attribute as a record: a wrapped optimizer as its own record, the model's parameters
    by their places (their values change as it trains: not what the optimizer is), anything else as a Value."""
    if isinstance(value, torch.optim.Optimizer):
        if id(value) in within:
            out = len(within) - within.index(id(value)) - 1
            return Value("itself" if not out else f"the optimizer {out} wrapper(s) out")
        return optimizer_record(value, model, position, within)
    items = value if isinstance(value, (list, tuple)) else [value]
    if items and all(isinstance(v, torch.Tensor) and id(v) in position for v in items):
        return _positions([position[id(v)] for v in items])
    return Value(value, name)


@functools.cache
def _torch_attributes() -> frozenset:
    """The attributes torch's Optimizer gives every optimizer (its groups, state, hooks, defaults)."""
    made = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    return frozenset(vars(made)) | {"_opt_called", "_warned_capturable_if_run_uncaptured", "_accelerator_warned"}


def _positions(at: list[int]) -> Value:
    value = Value(tuple(at))
    value.text = f"{len(at)} tensors" if len(at) > 6 else f"tensors {list(at)}"
    return value


def optimizer_change(built: Built, recipe, model) -> tuple[object | None, str]:
    """(the new optimizer, or None: the live one carries on; what the summary says about it)."""
    made = recipe.build_optimizer(model.parameters())
    name = type(made).__name__
    if made is built.source:
        return None, f"optimizer carried on (the same {name} object)"
    if made is getattr(recipe.optimizer, "instance", None):
        return made, f"new optimizer: another {name} object given (used as it is, with its own state)"
    found, unsure = differences(built.optimizer, optimizer_record(made, model))
    if found:
        return made, "new optimizer: " + _listed(found, built.optimizer)
    if unsure:
        raise RecipeError(f"optimizer: nbtrain cannot tell whether it makes the optimizer trained so far "
                          f"({unsure[0]}); allowed: the optimizer object itself (it carries on while it is the same object), or a "
                          "function whose values nbtrain can compare (numbers, strings, tuples, small tensors)")
    return None, f"optimizer carried on (same {describe(made)})"


def describe(optimizer) -> str:
    """'SGD, lr 0.1, momentum 0.9': the class, the rate and the first group's values other than the defaults."""
    group = optimizer.param_groups[0]
    try:
        defaults = {k: p.default for k, p in constructor_parameters(type(optimizer)).items()}
    except (TypeError, ValueError):
        defaults = {}
    own = {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr", *IMPLEMENTATION)}
    shown = [f"lr {Value(group.get('lr')).text}"] + [f"{k} {Value(v).text}" for k, v in own.items()
                                                     if k in defaults and Value(defaults[k]) != Value(v)]
    groups = len(optimizer.param_groups)
    return ", ".join([type(optimizer).__name__] + shown + ([f"{groups} groups"] if groups > 1 else []))


def _setting(difference: str) -> str:
    """The setting a difference names ('max_lr' of 'scheduler 0 group 1 max_lr 0.5 -> 0.4')."""
    words = difference.split(" ")
    while words[0] in ("scheduler", "group") and len(words) > 2:
        words = words[2:]
    return words[0]


def _listed(found: list[str], record: dict, most: int = 3) -> str:
    """The first differences, in words; one group's without its name ('lr 0.1 -> 0.01', not 'group 0 lr ...')."""
    if "group 1" not in record:
        found = [f[len("group 0 "):] if f.startswith("group 0 ") else f for f in found]
    if "groups" not in record:  # a schedule: the rates it derives from its settings come after them
        found.sort(key=lambda f: _setting(f) in DERIVED)
    return "; ".join(found[:most]) + (f" (and {len(found) - most} more)" if len(found) > most else "")


def schedule_record(made, built: Built) -> dict | None:
    """A throwaway of the schedule factory `made`'s schedule, over a copy of the optimizer as built, as a record
    (the optimizer carries on only where it is what was built, so one copy serves both sides)."""
    if made is None or is_scheduler_object(made):
        return None
    optimizer = _copy(built.blank) if built.blank is not None else None
    if optimizer is None:  # no copy to build a throwaway over: what the schedule is cannot be seen
        return {"optimizer": Value(built.source, "a throwaway schedule needs a copy of the optimizer, which")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scheduler = made(optimizer)
    return {**_scheduler_settings(scheduler),
            **{f"group {i}": {k: Value(v, k) for k, v in g.items() if k not in ("params", *IMPLEMENTATION)}
               for i, g in enumerate(optimizer.param_groups)}}


def _copy(optimizer):
    """An optimizer of the same class over the same groups (values copied, state left out). Where its constructor
    takes other arguments than its defaults hold (a class of the user's own), the object copied with its groups'
    values copied: a throwaway schedule writes only into the groups."""
    try:
        return _constructed_copy(optimizer)
    except (TypeError, ValueError, RuntimeError):
        made = copy.copy(optimizer)
        made.param_groups = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in g.items()
                              if k != "initial_lr"} for g in optimizer.param_groups]
        made.state = collections.defaultdict(dict)
        return made


def _constructed_copy(optimizer):
    accepted = constructor_parameters(type(optimizer))
    groups = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in g.items() if k != "initial_lr"}
              for g in optimizer.param_groups]  # (a tensor rate is filled in place by a schedule: not shared)
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"})


def _scheduler_settings(scheduler) -> dict:
    own = vars(scheduler)
    record = {"class": Value(type(scheduler))}
    record.update((k.lstrip("_"), Value(v, k.lstrip("_"))) for k, v in scheduler.state_dict().items()
                  if k not in PROGRESS and k != "_schedulers")
    # The functions it calls (LambdaLR's lr_lambdas, CyclicLR's scale_fn): state_dict leaves plain functions out.
    record.update((k.lstrip("_"), Value(v, k.lstrip("_"))) for k, v in own.items() if _functions(v))
    for i, child in enumerate(own.get("_schedulers") or ()):
        record[f"scheduler {i}"] = _scheduler_settings(child)
    return record


def _functions(value) -> bool:
    kinds = (types.FunctionType, types.MethodType, functools.partial)
    return isinstance(value, kinds) or (isinstance(value, (list, tuple)) and bool(value)
                                        and all(isinstance(v, kinds) for v in value))


def schedule_change(built: Built, live, recipe) -> tuple[bool, str | None]:
    """(whether the schedule is new; what the summary says), the live optimizer carrying on. `live`: the live
    Schedule or None."""
    made, current = recipe.scheduler, (live.scheduler if live is not None else None)
    if made is None:
        return current is not None, "schedule removed (none given)" if current is not None else None
    if is_scheduler_object(made):
        if made is current:
            return False, f"schedule carried on (the same {type(made).__name__} object)"
        return True, f"new schedule: another {type(made).__name__} object given"
    now = schedule_record(made, built)
    name = now["class"].text if "class" in now else type(made).__name__
    if current is None or built.schedule is None:
        return True, f"new schedule: {name}"
    found, unsure = differences(built.schedule, now)
    if found:
        return True, f"new schedule: {name} " + _listed(found, built.schedule)
    if unsure:
        raise RecipeError(f"scheduler: nbtrain cannot tell whether it makes the schedule stepped so far ({unsure[0]}); "
                          "allowed: a function whose values nbtrain can compare (numbers, strings, tuples, small "
                          "tensors), or an optimizer and a scheduler object (the same objects carry on)")
    return False, f"schedule carried on (same {name})"
