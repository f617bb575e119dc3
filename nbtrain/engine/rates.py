"""The learning rate of every param group: the LR rule, warm-up and the user's schedule."""
from __future__ import annotations

from ..config import TrainConfig
from .schedule import Schedule


class LearningRates:
    """Part of Engine (engine.py): the learning rate of every param group: the lr rule, warm-up and the user's schedule."""

    @property
    def base_lrs(self) -> list[float]:
        """Each param group's own rate before the LR rule and warm-up (the optimizer's, as given)."""
        return list(self._optimizer_lrs)

    def replace_schedule(self, fresh: bool = True) -> None:
        """The recipe's scheduler (or none) over the live optimizer, from the rule's rates.

        A scheduler given, replaced or removed in a later call takes effect from that call: a
        factory's curve starts afresh from the optimizer's configured rates (`fresh` drops the
        `initial_lr` an earlier scheduler left in the groups, which torch would start it from).
        """
        self.schedule = None
        for group, lr in zip(self.optimizer.param_groups, self._target_lrs()):
            group["lr"] = lr  # the scheduler is built over the scaled rates, the warm-up is laid on after
            if fresh and not hasattr(self.recipe.scheduler, "optimizer"):
                group.pop("initial_lr", None)
        self.schedule = Schedule.build(self.recipe, self.optimizer)
        if self.schedule is not None:  # an instance built before: its curve scaled to the rule's rates
            base = getattr(self.schedule.scheduler, "base_lrs", self.schedule.lrs())
            self.schedule.rescale([t / b if b else 1.0 for t, b in zip(self._target_lrs(), base)], "LR rule")
        self.set_lr(self.step)

    def check_schedule(self) -> None:
        """Before a run (not a trial, which never validates): a plateau schedule has a number to step on."""
        if self.schedule is not None:
            self.schedule.check(self.config, self.recipe.val_data is not None, self.world.size)

    def _target_lrs(self, config: TrainConfig | None = None) -> list[float]:
        config = config or self.config
        factor = config.lr_factor()
        if config.lr is not None:
            # `lr` replaces the optimizer's default rate; groups with rates of their own keep their
            # ratio to it (a group at lr=0, frozen by the user, stays frozen).
            default = self.optimizer.defaults.get("lr") or 0.0
            return [config.lr * factor * (lr / default if default else 1.0) for lr in self._optimizer_lrs]
        return [lr * factor for lr in self._optimizer_lrs]

    def set_lr(self, step: int) -> None:
        targets = self.schedule.lrs() if self.schedule is not None else self._target_lrs()
        warm = self.config.warmup_steps
        ramp = min(1.0, (step + 1) / warm) if warm else 1.0
        for group, lr in zip(self.optimizer.param_groups, targets):
            group["lr"] = lr * ramp

    def lr_note(self, config: TrainConfig | None = None) -> str:
        """The learning rate this run uses (or `config` would use), and why."""
        c = config or self.config
        lr = self._target_lrs(c)[0]
        base = c.lr if c.lr is not None else self._optimizer_lrs[0]
        note = f"{lr:.4g}"
        if c.scale_lr != "none":
            note += f" ({c.scale_lr} rule: base {base:.4g} x {c.lr_factor():.4g} for global batch " \
                    f"{c.global_batch_size} vs {c.base_batch_size})"
        if c.warmup_steps:
            note += f", linear warm-up over {c.warmup_steps} steps"
        if self.schedule is not None:
            note += ", " + self.schedule.describe()
        return note

    # --- changes between steps -------------------------------------------------------
