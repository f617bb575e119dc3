"""The learning rate of every param group: the LR rule, warm-up and the user's schedule, as plain functions
of what they read (the config, the optimizer, its own rates as given, the schedule). The Engine
(engine.py) keeps those and calls these."""
from __future__ import annotations

from ..config import TrainConfig
from .schedule import Schedule


def target_lrs(config: TrainConfig, optimizer, base_lrs: list[float]) -> list[float]:
    """Each param group's rate under `config`'s LR rule, before warm-up and schedule."""
    factor = config.lr_factor()
    if config.lr is not None:
        # `lr` replaces the optimizer's default rate; groups with rates of their own keep their
        # ratio to it (a group at lr=0, frozen by the user, stays frozen).
        default = optimizer.defaults.get("lr") or 0.0
        return [config.lr * factor * (lr / default if default else 1.0) for lr in base_lrs]
    return [lr * factor for lr in base_lrs]


def build_schedule(recipe, optimizer, targets: list[float], fresh: bool) -> Schedule | None:
    """The recipe's scheduler (or none) over the live optimizer, from the rule's rates `targets`.

    A scheduler given, replaced or removed in a later call takes effect from that call: a
    factory's curve starts afresh from the optimizer's configured rates (`fresh` drops the
    `initial_lr` an earlier scheduler left in the groups, which torch would start it from).
    """
    for group, lr in zip(optimizer.param_groups, targets):
        group["lr"] = lr  # the scheduler is built over the scaled rates, the warm-up is laid on after
        if fresh and not hasattr(recipe.scheduler, "optimizer"):
            group.pop("initial_lr", None)
    schedule = Schedule.build(recipe, optimizer)
    if schedule is not None:  # an instance built before: its curve scaled to the rule's rates
        base = getattr(schedule.scheduler, "base_lrs", schedule.lrs())
        schedule.rescale([t / b if b else 1.0 for t, b in zip(targets, base)], "LR rule")
    return schedule


def set_lr(optimizer, targets: list[float], warmup_steps: int, step: int) -> None:
    """Each group at its target rate, on the linear warm-up's ramp at `step`."""
    ramp = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    for group, lr in zip(optimizer.param_groups, targets):
        group["lr"] = lr * ramp


def lr_note(config: TrainConfig, lr: float, base_lr: float, schedule: Schedule | None) -> str:
    """The learning rate `lr` a run under `config` uses, and why (`base_lr`: the first group's own rate)."""
    c = config
    base = c.lr if c.lr is not None else base_lr
    note = f"{lr:.4g}"
    if c.scale_lr != "none":
        note += f" ({c.scale_lr} rule: base {base:.4g} x {c.lr_factor():.4g} for global batch " \
                f"{c.global_batch_size} vs {c.base_batch_size})"
    if c.warmup_steps:
        note += f", linear warm-up over {c.warmup_steps} steps"
    if schedule is not None:
        note += ", " + schedule.describe()
    return note
