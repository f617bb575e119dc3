"""The user's LR scheduler, stepped as written, composed with nbtrain's LR rule and warm-up.

The scheduler owns the learning rate curve. nbtrain builds it (or adopts the user's instance) over the
optimizer's own rates, exactly as the user's code would, and changes it only where the user asked: an
LR rule (scale_lr, or lr=) multiplies every rate the schedule keeps by the rule's own factor (its base
rates, OneCycleLR's max/initial/min rates, CyclicLR's bounds, the cosine floor, ReduceLROnPlateau's
minimum rates, a chained schedule's children), so the curve keeps its shape at the scaled height. It is
stepped every optimizer step or every epoch (`interval`): as given, or by what the schedule counts
(OneCycleLR and CyclicLR count optimizer steps; the others are stepped once an epoch, as Lightning and
PyTorch's own examples step them). The warm-up ramp is laid on top: before each step the scheduler gets
its own last rates back in the param groups, so a chained scheduler (StepLR, CosineAnnealingLR read the
group's rate) never compounds the ramp.
"""
from __future__ import annotations

import torch
from torch.optim import lr_scheduler

from ..recipe import RecipeError

# Schedules whose lengths count optimizer steps: torch's documentation steps them after every batch.
STEP_COUNTING = (lr_scheduler.OneCycleLR, lr_scheduler.CyclicLR)
# The rates each kind of scheduler keeps, beyond the param groups' "lr" and "initial_lr": a list holds one
# rate per param group, a number one rate for all (eps: ReduceLROnPlateau's smallest change of a rate).
KEPT_RATES = {lr_scheduler.LRScheduler: ("base_lrs", "_last_lr"), lr_scheduler.CyclicLR: ("max_lrs",),
              lr_scheduler.ReduceLROnPlateau: ("min_lrs", "default_min_lr", "eps"),
              lr_scheduler.CosineAnnealingLR: ("eta_min",), lr_scheduler.CosineAnnealingWarmRestarts: ("eta_min",)}
GROUP_RATES = {lr_scheduler.OneCycleLR: ("max_lr", "min_lr")}  # kept in the param groups themselves
COLLAPSED = 1e-6  # a rate below this fraction of its highest in a run is said to have collapsed


def is_scheduler(obj) -> bool:
    return hasattr(obj, "step") and hasattr(obj, "get_last_lr") and hasattr(obj, "optimizer")


def default_interval(scheduler) -> tuple[str, str]:
    """How often a scheduler given without scheduler_interval is stepped, and why."""
    counting = next((s for s in children(scheduler) if isinstance(s, STEP_COUNTING)), None)
    if counting is not None:
        return "step", f"by default: {type(counting).__name__} counts optimizer steps"
    return "epoch", "by default, as Lightning and PyTorch's examples step it; scheduler_interval='step' " \
                    "steps it every optimizer step"


class Schedule:
    def __init__(self, scheduler, interval: str | None = None, monitor: str | None = None):
        self.scheduler = scheduler
        self.interval = interval  # None: decided by what the schedule counts (default_interval)
        self.monitor = monitor  # ReduceLROnPlateau's held-out number (Lightning's "monitor"); else config.monitor
        self.notes: list[str] = []

    @property
    def interval(self) -> str:
        """"step" (every optimizer step) or "epoch": as given, else by what the schedule counts."""
        return self.given_interval or default_interval(self.scheduler)[0]

    @interval.setter
    def interval(self, interval: str | None) -> None:
        self.given_interval = interval

    @property
    def on_plateau(self) -> bool:
        """ReduceLROnPlateau: stepped with a held-out number after each validation, as Lightning does."""
        return isinstance(self.scheduler, lr_scheduler.ReduceLROnPlateau)

    def check(self, config, has_val_data: bool, world_size: int) -> None:
        """Refuse, before training, a plateau schedule that would have no held-out number to step on."""
        if not self.on_plateau or (has_val_data and (self.monitor or config.monitor) and world_size == 1):
            return
        if world_size > 1:  # only the first rank validates: the ranks' rates would part
            raise RecipeError("scheduler: ReduceLROnPlateau steps on a held-out number that only the first of "
                              f"{world_size} processes computes; allowed: devices=1, or another scheduler")
        needs = "val_data and monitor (e.g. monitor='val_loss')" if not has_val_data else "monitor='val_loss' (or " \
            "another held-out number)"
        raise RecipeError(f"scheduler: ReduceLROnPlateau steps on a monitored held-out number, and this run has no "
                          f"{'val_data' if not has_val_data else 'monitor'}; allowed: give {needs} (it is then "
                          "stepped with that number after each validation), or another scheduler")

    def step_on(self, numbers: dict, config, optimizer: torch.optim.Optimizer) -> None:
        """A plateau schedule's step with this validation's monitored number."""
        name = self.monitor or config.monitor
        if name not in numbers or numbers[name] is None:
            known = ", ".join(k for k, v in numbers.items() if v is not None)
            raise RecipeError(f"scheduler: ReduceLROnPlateau monitors {name!r}, not among the held-out numbers; "
                              f"allowed: {known}")
        for group, lr in zip(optimizer.param_groups, self.lrs()):
            group["lr"] = lr
        self.scheduler.step(float(numbers[name]))

    @classmethod
    def build(cls, recipe, optimizer: torch.optim.Optimizer) -> "Schedule | None":
        made = recipe.scheduler
        if made is None:
            return None
        if is_scheduler(made):
            if made.optimizer is not optimizer:
                raise RecipeError("scheduler: it drives another optimizer than the one nbtrain steps (an instance "
                                  "is bound to its optimizer); allowed: a function optimizer -> scheduler, e.g. "
                                  "lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)")
            scheduler = made
        else:
            try:
                scheduler = made(optimizer)
            except TypeError as error:
                if error.__traceback__.tb_next is not None:
                    raise
                raise RecipeError(f"scheduler: calling it with the optimizer failed ({error}); allowed: a function "
                                  "optimizer -> LR scheduler") from None
            if not is_scheduler(scheduler):
                raise RecipeError(f"scheduler: the factory returned a {type(scheduler).__name__}; allowed: a "
                                  "torch.optim.lr_scheduler scheduler")
        return cls(scheduler, recipe.scheduler_interval, getattr(recipe, "scheduler_monitor", None))

    def lrs(self) -> list[float]:
        return list(self.scheduler.get_last_lr())

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.on_plateau:  # stepped with the held-out number instead (step_on)
            return
        for group, lr in zip(optimizer.param_groups, self.lrs()):  # the scheduler's own rates, ramp removed
            group["lr"] = lr
        self.scheduler.step()

    def rescale(self, factors: float | list[float], why: str) -> None:
        """Multiply every rate the schedule keeps (each param group's by its factor), so its curve keeps its
        shape at the new height: what the LR rule asks of the user's schedule, and nothing else does."""
        factors = factors if isinstance(factors, list) else [factors] * len(self.scheduler.optimizer.param_groups)
        if all(f == 1.0 for f in factors):
            return
        # A rate kept once for all groups (a cosine floor) takes the rule's factor: the rule gives every group
        # the same one, except a group at rate 0, which is given 1.0 (nothing in it to scale).
        common = next((f for f in factors if f != 1.0), 1.0)
        schedulers = children(self.scheduler)
        for scheduler in schedulers:
            for kind, names in KEPT_RATES.items():
                if isinstance(scheduler, kind):
                    for name in names:
                        if getattr(scheduler, name, None) is not None:
                            setattr(scheduler, name, scaled(getattr(scheduler, name), factors, common))
        group_rates = {"lr", "initial_lr"}.union(*(names for kind, names in GROUP_RATES.items()
                                                    if any(isinstance(s, kind) for s in schedulers)))
        for group, f in zip(self.scheduler.optimizer.param_groups, factors):
            for name in group_rates & group.keys():
                group[name] = group[name] * f
        own = self.user_class()
        self.notes.append(f"schedule rescaled x{common:.3g} ({why})" + (
            f"; {own} is a scheduler class of the user's own: rates it keeps in its own attributes are not "
            "rescaled" if own else ""))

    def of_torch(self) -> bool:
        """Whether every scheduler here is one of torch's own classes (whose kept rates `rescale` knows)."""
        return self.user_class() is None

    def user_class(self) -> str | None:
        """The name of the first scheduler class here that is not torch's own, or None."""
        return next((type(s).__name__ for s in children(self.scheduler)
                     if not type(s).__module__.startswith("torch.")), None)

    def describe(self) -> str:
        return "then " + self.stepping()

    def stepping(self) -> str:
        """Which scheduler is stepped how often, and why."""
        name = type(self.scheduler).__name__
        if self.on_plateau:
            return f"{name} after each validation, on {self.monitor or 'the monitored number'}"
        why = "as given" if self.given_interval else default_interval(self.scheduler)[1]
        return f"{name} every {self.interval} ({why})"

    def run_notes(self, steps, lrs) -> list[str]:
        """What a run's summary says of the schedule: its rescales, and one warning where the rate it trained
        at (`lrs`, at `steps`) fell below a millionth of its highest earlier in the run."""
        peak = 0.0
        for step, lr in zip(steps, lrs):
            peak = max(peak, lr)
            if lr < peak * COLLAPSED:
                return self.notes + [f"the learning rate collapsed: {lr:.3g} at step {step}, under a millionth of the "
                                     f"{peak:.3g} it reached earlier in this run; {self.stepping()}"]
        return list(self.notes)

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def scaled(value, factors: list[float], common: float):
    """A kept rate (one per group, or one for all) times the rule's factor."""
    if isinstance(value, (list, tuple)):
        return type(value)(v * f for v, f in zip(value, factors))
    return value * common


def children(scheduler) -> list:
    """A scheduler and those it chains (SequentialLR, ChainedScheduler)."""
    inner = getattr(scheduler, "_schedulers", None) or []
    return [scheduler] + [s for child in inner for s in children(child)]
