"""The progress bar of a run, for a terminal and a notebook alike: tqdm.auto picks the widget in a
kernel and the text bar elsewhere, so the magic, `python -m nbtrain demo` and an exported
train.py show one bar with the same numbers."""
from __future__ import annotations

import sys
import time
import warnings

from .measure.steady import WindowRate
from .records import StartInfo, Summary


class Progress:
    """A MetricsLog view: steps done of planned, loss, and samples/s over the latest log window (so a
    slow start fades out); at the end, the summary's steady rate: one speed on the screen, not two."""

    def __init__(self, description: str = "", **tqdm_options):
        self.description = description
        self.options = tqdm_options
        self.bar = None
        self.cost_s = 0.0  # spent inside the training loop, so a benchmark (and a user) can check it
        self.rate = WindowRate()
        self._showwarning = None  # warnings.showwarning while a text bar holds the terminal's line

    def update(self, event: dict, log) -> None:
        started = time.perf_counter()
        kind = event["type"]
        if kind == "start":
            from tqdm.auto import tqdm  # imported here: only a run that shows a bar pays for it
            self.close()
            self.bar = tqdm(total=StartInfo.from_dict(event["info"]).planned_steps, unit="step", desc=self.description,
                            dynamic_ncols=True, **self.options)
            self.rate.start(event["info"])
            if not _in_a_notebook(self.bar):
                self._route_warnings()
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
                summary = Summary.from_dict(event.get("summary", {}))
                self.bar.set_postfix(loss=f"{summary.last_loss:.4f}", samples_s=f"{summary.samples_per_s:,.0f}",
                                     refresh=False)
            self.close()
        self.cost_s += time.perf_counter() - started

    def close(self) -> None:
        """End the bar (also when training failed and no end event came)."""
        if self._showwarning is not None:
            warnings.showwarning, self._showwarning = self._showwarning, None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _route_warnings(self) -> None:
        """A warning from the user's code, written to the terminal as it is, landed inside the bar's line
        (and the bar was drawn again below it): through tqdm.write it gets a line of its own, above the bar."""
        shown, bar = warnings.showwarning, self.bar

        def above_the_bar(message, category, filename, lineno, file=None, line=None):
            if file not in (None, sys.stderr) or self.bar is not bar:
                return shown(message, category, filename, lineno, file, line)
            bar.write(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"), file=sys.stderr)
        self._showwarning, warnings.showwarning = shown, above_the_bar


def _in_a_notebook(bar) -> bool:
    """tqdm.auto's notebook widget (its output has an area of its own), told without importing it."""
    return any(cls.__module__ == "tqdm.notebook" for cls in type(bar).__mro__)
