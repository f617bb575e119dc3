"""The learning rate of every param group: the LR rule, warm-up and the user's schedule, as plain functions
of what they read (the config, the optimizer, its own rates as given, the schedule). The Engine
(engine.py) keeps those and calls these.

The user's rates and schedule are used as written; only an LR rule the user asked for (scale_lr, or
lr=) changes them, by the rule's own factor. The warm-up ramp multiplies the rate of step s (counted
from 0) by (s + 1) / warmup_steps: it starts at 1/warmup_steps of the rate and reaches all of it at
step warmup_steps.
"""
from __future__ import annotations

from ..config import TrainConfig
from .schedule import Schedule, is_scheduler


def target_lrs(config: TrainConfig, optimizer, base_lrs: list[float]) -> list[float]:
    """Each param group's rate under `config`'s LR rule, before warm-up and schedule."""
    factor = config.lr_factor()
    if config.lr is not None:
        # `lr` replaces the optimizer's default rate; groups with rates of their own keep their
        # ratio to it (a group at lr=0, frozen by the user, stays frozen).
        default = optimizer.defaults.get("lr") or 0.0
        return [config.lr * factor * (lr / default if default else 1.0) for lr in base_lrs]
    return [lr * factor for lr in base_lrs]


def rule_factors(config: TrainConfig, optimizer, base_lrs: list[float]) -> list[float]:
    """What the LR rule multiplies each group's rate by (1.0 where nothing was asked, or the rate is 0)."""
    default = optimizer.defaults.get("lr") or 0.0
    if config.lr is None or default:
        factor = config.lr_factor() * (config.lr / default if config.lr is not None else 1.0)
        return [factor if lr else 1.0 for lr in base_lrs]
    return [t / b if b else 1.0 for t, b in zip(target_lrs(config, optimizer, base_lrs), base_lrs)]


def rule_text(config: TrainConfig, optimizer) -> str:
    """The LR rule the user asked for, in words (what a rescaled schedule's note says it followed)."""
    asked = [f"lr={config.lr:.4g} for the optimizer's {optimizer.defaults.get('lr', 0):.4g}"] \
        if config.lr is not None else []
    if config.scale_lr != "none":
        asked.append(f"{config.scale_lr} rule: global batch {config.global_batch_size} vs {config.base_batch_size}")
    return ", ".join(asked)


def build_schedule(recipe, optimizer, config: TrainConfig, base_lrs: list[float], fresh: bool) -> Schedule | None:
    """The recipe's scheduler (or none) over the live optimizer, as written, times the LR rule's factor.

    A factory is built over the optimizer's own rates `base_lrs`, as the user's loop would build it; an
    instance is taken as it is. A scheduler given, replaced or removed in a later call takes effect from
    that call: a factory's curve starts afresh from the optimizer's rates (`fresh` drops the `initial_lr`
    an earlier scheduler left in the groups, which torch would start it from).

    The LR rule's factor then reaches every rate torch's own schedulers keep (Schedule.rescale). A scheduler
    class of the user's own may keep rates where nbtrain cannot see them (`self.peak = group["lr"]`): a
    factory making one is built again over the rates the rule already scaled, as the user's loop under that
    rule would build it. Only an instance, built already, is left to the rescale.
    """
    factory = recipe.scheduler is not None and not is_scheduler(recipe.scheduler)
    if factory:
        for group, lr in zip(optimizer.param_groups, base_lrs):
            group["lr"] = lr
            if fresh:
                group.pop("initial_lr", None)
    before = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    schedule = Schedule.build(recipe, optimizer)
    if schedule is None:
        return None
    factors, why = rule_factors(config, optimizer, base_lrs), rule_text(config, optimizer)
    if not factory or schedule.of_torch() or all(f == 1.0 for f in factors):
        schedule.rescale(factors, why)
        return schedule
    for group, settings, f in zip(optimizer.param_groups, before, factors):  # as they were, times the rule
        for name in [k for k in group if k != "params"]:
            del group[name]
        group.update(settings)
        for name in {"lr", "initial_lr"} & group.keys():
            group[name] = group[name] * f
    schedule = Schedule.build(recipe, optimizer)
    schedule.notes.append(f"schedule built over the rates the LR rule scaled ({why}): {schedule.user_class()} "
                          "is a scheduler class of the user's own, whose own values nbtrain cannot scale")
    return schedule


def steps_as_written(config: TrainConfig) -> bool:
    """Whether a schedule counted in steps moves one step an optimizer step (schedule_position is `step`)."""
    return config.schedule_counts != "samples" or config.base_batch_size is None


def schedule_position(config: TrainConfig, step: int) -> int:
    """Steps a schedule counted in steps has taken after `step` optimizer steps: `step` as written
    (schedule_counts='steps'); laid over samples, the steps of base_batch_size that as many samples hold,
    floor(step x global batch / base_batch_size), so a warm-up or decay covers the samples it was written for."""
    if steps_as_written(config):
        return step
    return step * config.global_batch_size // config.base_batch_size


def set_lr(optimizer, targets: list[float], warmup_steps: int, step: int) -> None:
    """Each group at its target rate, times the warm-up ramp (step + 1) / warmup_steps while step < warmup_steps."""
    ramp = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    for group, lr in zip(optimizer.param_groups, targets):
        group["lr"] = lr * ramp


def warmup_text(warmup_steps: int) -> str:
    return f"linear warm-up over {warmup_steps} steps (from 1/{warmup_steps} of the rate to all of it)"


def lr_note(config: TrainConfig, lr: float, base_lr: float, schedule: Schedule | None) -> str:
    """The learning rate `lr` a run under `config` uses, and why (`base_lr`: the first group's own rate)."""
    c = config
    base = c.lr if c.lr is not None else base_lr
    note = f"{lr:.4g}"
    if c.scale_lr != "none":
        note += f" ({c.scale_lr} rule: base {base:.4g} x {c.lr_factor():.4g} for global batch " \
                f"{c.global_batch_size} vs {c.base_batch_size})"
    if c.warmup_steps:
        note += ", " + warmup_text(c.warmup_steps)
    if schedule is not None:
        note += ", " + schedule.describe()
    return note
