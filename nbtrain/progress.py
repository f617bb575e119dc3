"""The progress bar of a run, for a terminal and a notebook alike: tqdm.auto picks the widget in a
kernel and the text bar elsewhere, so the magic, `python -m nbtrain demo` and an exported
train.py show one bar with the same numbers."""
from __future__ import annotations

import time

from .measure.steady import WindowRate


class Progress:
    """A MetricsLog view: steps done of planned, loss, and samples/s over the latest log window (so a
    slow start fades out); at the end, the summary's steady rate: one speed on the screen, not two."""

    def __init__(self, description: str = "", **tqdm_options):
        self.description = description
        self.options = tqdm_options
        self.bar = None
        self.cost_s = 0.0  # spent inside the training loop, so a benchmark (and a user) can check it
        self.rate = WindowRate()

    def update(self, event: dict, log) -> None:
        started = time.perf_counter()
        kind = event["type"]
        if kind == "start":
            from tqdm.auto import tqdm  # imported here: only a run that shows a bar pays for it
            self.close()
            self.bar = tqdm(total=event["info"]["planned_steps"], unit="step", desc=self.description,
                            dynamic_ncols=True, **self.options)
            self.rate.start(event["info"])
        elif self.bar is not None and kind == "steps" and event["rows"]["step"]:
            rows = event["rows"]
            self.bar.update(len(rows["step"]))
            rate = self.rate.of(rows)
            self.bar.set_postfix(loss=f"{rows['loss'][-1]:.4f}", samples_s="-" if rate is None else f"{rate:,.0f}",
                                 refresh=False)
        elif self.bar is not None and kind == "epoch" and event.get("val_acc") is not None:
            self.bar.set_postfix(val_loss=f"{event['val_loss']:.4f}", val_acc=f"{100 * event['val_acc']:.1f}%",
                                 refresh=False)
        elif kind == "end":
            if self.bar is not None:
                summary = event.get("summary", {})
                self.bar.set_postfix(loss=f"{summary.get('last_loss', float('nan')):.4f}",
                                     samples_s=f"{summary.get('samples_per_s', float('nan')):,.0f}", refresh=False)
            self.close()
        self.cost_s += time.perf_counter() - started

    def close(self) -> None:
        """End the bar (also when training failed and no end event came)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
