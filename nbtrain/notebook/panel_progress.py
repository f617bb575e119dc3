"""The panel's progress: a bar over the run's planned steps, elapsed and remaining time, the latest loss.

Fed from the training thread (the run's "start" and "steps" events), so an update costs
little: the numbers are kept on every event, the widgets are sent at most a few times a
second (as tqdm's mininterval does), and `end` always shows the final count, which is the
run's own step count (`run_steps`), the same number the status line and runs table state.
"""
from __future__ import annotations

import html
import time

import ipywidgets as widgets

from ..format import clock

MIN_INTERVAL_S = 0.2  # widget updates a second at most 5: a fast run would otherwise flood the browser
BAR_STYLES = {"completed": "success", "stopped": "warning", "interrupted": "warning", "failed": "danger"}




class RunProgress:
    def __init__(self):
        self.bar = widgets.IntProgress(value=0, min=0, max=1, tooltip="steps of this run against its planned steps",
                                       layout=widgets.Layout(flex="1 1 200px", width="auto", min_width="120px",
                                                             max_width="420px"))
        self.bar.add_class("nbtrain-progress-bar")
        self.text = widgets.HTML(layout=widgets.Layout(flex="10 1 300px", min_width="0"))
        self.text.add_class("nbtrain-progress")
        self.widget = widgets.HBox([self.bar, self.text], layout=widgets.Layout(flex_flow="row wrap",
                                                                                align_items="center"))
        self.number = 0
        self.planned: int | None = None
        self.done = 0
        self.loss: float | None = None
        self._started = self._sent = 0.0
        self._first: tuple[float, int] | None = None  # (time, steps) after the first window: warm-up left out
        self.text.value = _line("no run yet: press Run")

    @property
    def value(self) -> str:
        """The progress line as HTML (what the text widget shows)."""
        return self.text.value

    def start(self, number: int, planned: int | None) -> None:
        self.number, self.planned, self.done, self.loss = number, planned, 0, None
        self._started, self._sent, self._first = time.monotonic(), 0.0, None
        self.bar.bar_style = "info"
        self.bar.max, self.bar.value = max(1, self.planned or 1), 0
        self.text.value = _line(f"run #{number} starting…")

    def steps(self, done: int, loss: float) -> None:
        """`done` steps of this run so far; the widgets follow at most every MIN_INTERVAL_S."""
        now = time.monotonic()
        self.done, self.loss = done, loss
        if self._first is None:
            self._first = (now, done)
        if now - self._sent < MIN_INTERVAL_S:
            return
        self._sent = now
        self.bar.value = min(done, self.bar.max)
        parts = [f"run #{self.number} · step {done:,}" + (f" of {self.planned:,}" if self.planned else ""),
                 f"{clock(now - self._started)} elapsed"]
        left = self._remaining(now)
        if left is not None:
            parts.append(f"about {clock(left)} left")
        parts.append(f"loss {loss:.4f}")
        self.text.value = _line(" · ".join(parts))

    def _remaining(self, now: float) -> float | None:
        """Time left at the pace since the first log window (the warm-up window would overstate it)."""
        if not self.planned or self._first is None:
            return None
        t0, d0 = self._first
        if self.done <= d0 or now <= t0:
            return None
        return (self.planned - self.done) * (now - t0) / (self.done - d0)

    def end(self, status: str, steps: int | None = None) -> None:
        """The final state: `steps` is the run's own count (the summary's run_steps) when it has one."""
        self.done = self.done if steps is None else steps
        self.bar.bar_style = BAR_STYLES.get(status, "")
        self.bar.value = min(self.done, self.bar.max)
        of = f" of {self.planned:,}" if self.planned else ""
        loss = f" · final loss {self.loss:.4f}" if self.loss is not None else ""
        elapsed = clock(time.monotonic() - self._started) if self._started else "-"
        self.text.value = _line(f"run #{self.number} {status} at step {self.done:,}{of} · {elapsed}{loss}")

    def add_note(self, note: str) -> None:
        """Append a remark to the final line (where the run was recorded)."""
        self.text.value = self.text.value[:-len("</div>")] + html.escape(note) + "</div>"


def _line(text: str) -> str:
    return f"<div style='font-size:12px;line-height:1.4;white-space:normal'>{html.escape(text)}</div>"
