"""Early stopping and the best weights, on a monitored held-out number (Lightning's EarlyStopping
and ModelCheckpoint(save_top_k=1), as config options).

After each validation the monitor sees the numbers: it remembers the best value and, when
`restore_best` is on, a CPU copy of the weights at that point; after `patience` validations
without improvement it asks the run to stop. At the end of the run the best weights can be
put back, and the summary says which step they came from.

A monitored name the run can never report is refused before anything trains when the names are
known up front (a loss_fn and metrics, no validation_step); otherwise the first validation finds
it, and the run ends there as failed, with what it trained kept, instead of raising mid-loop.
"""
from __future__ import annotations

import difflib
import math

from ..options import ConfigError, Problem
from ..monitored import AUTO_WORDS, direction


def up_front_names(recipe) -> list[str] | None:
    """The held-out numbers a run of `recipe` reports (evaluation.py), when they are known before it
    trains; None when a validation_step or a LightningModule's self.log(...) may add others."""
    if recipe.validation_step is not None or recipe.logged is not None:
        return None
    if recipe.training_step is not None or recipe.loss_fn is None:
        return ["val_loss"]
    return ["val_loss", "val_acc"] + [f"val_{name}" for name in recipe.metrics or {}]


def unknown_monitor(name: str, known: list[str]) -> ConfigError:
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return ConfigError([Problem("monitor", name, f"not among the held-out numbers; {hint}allowed: {', '.join(known)}")])


def check_monitor(config, recipe) -> None:
    """Refuse, before anything trains, a monitor this run could never report."""
    if config.monitor is None:
        return
    if recipe.val_data is None:
        raise ConfigError([Problem("monitor", config.monitor, "needs held-out data: give val_data")])
    names = up_front_names(recipe)
    if names is not None and config.monitor not in names:
        raise unknown_monitor(config.monitor, names)
    if config.mode == "auto" and direction(config.monitor) is None:  # not guessed: asked for
        raise ConfigError([Problem("mode", "auto", f"nbtrain cannot tell from the name {config.monitor!r} whether "
                                                   f"it should go up or down; allowed: mode='max' or mode='min' "
                                                   f"(auto reads a name: {AUTO_WORDS})")])


class Monitor:
    def __init__(self, name: str, mode: str, patience: int | None, restore_best: bool):
        self.name, self.patience, self.keeps_best = name, patience, restore_best
        self.mode = mode if mode != "auto" else direction(name)  # check_monitor refused a name that says neither
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_weights: dict | None = None
        self.waited = 0
        self.last: float | None = None
        self.problem: ConfigError | None = None  # the name was not among a validation's numbers

    def improves(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def update(self, numbers: dict, step: int, model) -> bool:
        """Take one validation's numbers; True when the run should stop (early, or failed: `problem`)."""
        if self.name not in numbers or numbers[self.name] is None:
            # Raised here, mid-loop, the run's result would be lost: it ends failed at this step instead.
            self.problem = self.problem or unknown_monitor(self.name, [k for k, v in numbers.items() if v is not None])
            return True
        value = float(numbers[self.name])
        self.last = value
        if math.isfinite(value) and self.improves(value):
            self.best, self.best_step, self.waited = value, step, 0
            if self.keeps_best:
                self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            return False
        self.waited += 1
        return self.patience is not None and self.waited >= self.patience

    @property
    def failure(self) -> str:
        """Why the run failed ('monitor=...: not among the held-out numbers; ...'), or ''."""
        p = self.problem.problems[0] if self.problem is not None else None
        return f"{p.option}={p.value!r}: {p.allowed}" if p else ""

    def stop_message(self, step: int) -> str:
        return (f"early stop at step {step}: {self.name} did not improve for {self.waited} validations "
                f"(best {self.best:.4g} at step {self.best_step})")

    def put_best_back(self, model) -> str | None:
        """Put the best weights back; the note that says so (None when the last ones are the best)."""
        if self.best_weights is None or self.last == self.best:
            return None
        model.load_state_dict(self.best_weights)
        return (f"kept the best weights: {self.name} {self.best:.4g} at step {self.best_step} "
                f"(the last validation had {self.last:.4g}); the optimizer state is the last step's")
