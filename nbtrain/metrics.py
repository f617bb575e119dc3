"""MetricsLog: the pure record of a run, fed by events; views subscribe to it.

Events are plain JSON-able dicts, so a DDP worker can write them to a file and the
kernel can replay them into a log of its own that looks exactly like a local run's.

    {"type": "start", "config": {...}, "info": {...}}
    {"type": "steps", "rows": {"step": [...], "loss": [...], ...}}   # one log window
    {"type": "change", "step": N, "changes": {name: [old, new]}}
    {"type": "epoch", "epoch": E, "step": N, "val_loss": x, "val_acc": y}
    {"type": "end", "summary": {...}}
"""
from __future__ import annotations

import warnings
from typing import Callable

COLUMNS = ("step", "epoch", "samples", "time", "loss", "lr", "step_s",
           "data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")
PHASES = ("data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")

View = Callable[[dict, "MetricsLog"], None]


class MetricsLog:
    def __init__(self):
        self.columns: dict[str, list] = {name: [] for name in COLUMNS}
        self.events: list[dict] = []
        self._views: list[View] = []

    def subscribe(self, view: View) -> View:
        self._views.append(view)
        return view

    def unsubscribe(self, view: View) -> None:
        if view in self._views:
            self._views.remove(view)

    def emit(self, event: dict) -> None:
        self.events.append(event)
        if event["type"] == "steps":
            for name, values in event["rows"].items():
                self.columns.setdefault(name, []).extend(values)
        for view in list(self._views):
            try:
                view(event, self)
            except Exception as exc:  # a broken view must never stop training
                self._views.remove(view)
                warnings.warn(f"nbtrain: a view failed and was detached: {exc!r}", stacklevel=2)

    # --- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.columns["step"])

    def last(self, event_type: str) -> dict | None:
        for event in reversed(self.events):
            if event["type"] == event_type:
                return event
        return None

    def of_type(self, event_type: str) -> list[dict]:
        return [e for e in self.events if e["type"] == event_type]

    def to_dict(self) -> dict:
        return {"columns": self.columns, "events": self.events}

    @classmethod
    def from_events(cls, events: list[dict]) -> "MetricsLog":
        log = cls()
        for event in events:
            log.emit(event)
        return log
