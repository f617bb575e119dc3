"""The user's LR scheduler, composed with nbtrain's LR scaling rule and warm-up.

The scheduler owns the learning rate curve: nbtrain builds it (or adopts the user's
instance) over rates already scaled by the rule, steps it every optimizer step or every
epoch as stated, and lays its warm-up ramp on top. Before each step the scheduler gets its
own last rates back in the param groups, so a chained scheduler (StepLR, CosineAnnealingLR
read the group's rate) never compounds the ramp. A live batch-size change rescales the
schedule as the rule says: its base rates and its current rates by the same factor.
"""
from __future__ import annotations

import torch

from ..recipe import RecipeError


def _is_scheduler(obj) -> bool:
    return hasattr(obj, "step") and hasattr(obj, "get_last_lr") and hasattr(obj, "optimizer")


class Schedule:
    def __init__(self, scheduler, interval: str, monitor: str | None = None):
        self.scheduler = scheduler
        self.interval = interval
        self.monitor = monitor  # ReduceLROnPlateau's held-out number (Lightning's "monitor"); else config.monitor
        self.notes: list[str] = []

    @property
    def on_plateau(self) -> bool:
        """ReduceLROnPlateau: stepped with a held-out number after each validation, as Lightning does."""
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

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
        if _is_scheduler(made):
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
            if not _is_scheduler(scheduler):
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

    def rescale(self, factors: list[float], why: str) -> None:
        """Multiply the schedule's base and current rates (each group by its factor)."""
        if all(f == 1.0 for f in factors):
            return
        for scheduler in _children(self.scheduler):
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * f for lr, f in zip(scheduler.base_lrs, factors)]
            if hasattr(scheduler, "_last_lr"):
                scheduler._last_lr = [lr * f for lr, f in zip(scheduler._last_lr, factors)]
        for group, f in zip(self.scheduler.optimizer.param_groups, factors):
            if "initial_lr" in group:
                group["initial_lr"] *= f
        self.notes.append(f"schedule rescaled x{factors[0]:.3g} ({why})")

    def describe(self) -> str:
        return f"then {type(self.scheduler).__name__} every {self.interval}"

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def _children(scheduler) -> list:
    """A scheduler and those it chains (SequentialLR, ChainedScheduler)."""
    inner = getattr(scheduler, "_schedulers", None) or []
    return [scheduler] + [s for child in inner for s in _children(child)]
