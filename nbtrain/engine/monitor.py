"""Early stopping and the best weights, on a monitored held-out number (Lightning's EarlyStopping
and ModelCheckpoint(save_top_k=1), as config options).

After each validation the monitor sees the numbers: it remembers the best value and, when
`restore_best` is on, a CPU copy of the weights at that point; after `patience` validations
without improvement it asks the run to stop. At the end of the run the best weights can be
put back, and the summary says which step they came from.
"""
from __future__ import annotations

import math

from ..config import ConfigError, Problem


# mode="auto": a name that says error or loss goes down, whatever else it says (val_top1_error, val_acc_loss);
# otherwise an accuracy-like name goes up, and anything else down. "top" says neither (a top-1 error or hit rate).
_GOES_DOWN = ("loss", "error", "mse", "mae", "nll", "perplexity")
_GOES_UP = ("acc", "f1", "auc", "precision", "recall", "iou", "dice")


def auto_mode(name: str) -> str:
    """'min' or 'max' for a monitored name under mode='auto'."""
    name = name.lower()
    if any(word in name for word in _GOES_DOWN):
        return "min"
    return "max" if any(word in name for word in _GOES_UP) else "min"


class Monitor:
    def __init__(self, name: str, mode: str, patience: int | None, restore_best: bool):
        self.name, self.patience, self.keeps_best = name, patience, restore_best
        self.mode = mode if mode != "auto" else auto_mode(name)
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_weights: dict | None = None
        self.waited = 0
        self.last: float | None = None

    def improves(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def update(self, numbers: dict, step: int, model) -> bool:
        """Take one validation's numbers; True when the run should stop early."""
        if self.name not in numbers or numbers[self.name] is None:
            known = ", ".join(k for k, v in numbers.items() if v is not None)
            raise ConfigError([Problem("monitor", self.name, f"not among the held-out numbers; allowed: {known}")])
        value = float(numbers[self.name])
        self.last = value
        if math.isfinite(value) and self.improves(value):
            self.best, self.best_step, self.waited = value, step, 0
            if self.keeps_best:
                self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            return False
        self.waited += 1
        return self.patience is not None and self.waited >= self.patience

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
