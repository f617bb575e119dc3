"""MetricsLog: the pure record of a run, fed by events; views subscribe to it.

Events are plain JSON-able dicts, so a DDP worker can write them to a file and the
kernel can replay them into a log of its own that looks exactly like a local run's.

    {"type": "start", "config": {...}, "info": {...}}
    {"type": "steps", "rows": {"step": [...], "loss": [...], ...}}   # one log window
    {"type": "change", "step": N, "changes": {name: [old, new]}}
    {"type": "epoch", "epoch": E, "step": N, "val_loss": x, "val_acc": y}
    {"type": "end", "summary": {...}}

A long run's history stays bounded. Step rows live in compact columns (machine numbers,
96 bytes a step, where lists of Python floats took ~400), and a "steps" event is not kept a
second time: `events` rebuilds those from the columns. Past MAX_ROWS rows the older half of
the history is thinned to every other row, so a million-step run keeps ~25 MB; each kept row
is still one real step with its exact values, and `thinning` says what was dropped.
"""
from __future__ import annotations

import math
import threading
import warnings
from array import array
from typing import Callable, Protocol, runtime_checkable

COLUMNS = ("step", "epoch", "samples", "time", "loss", "lr", "step_s",
           "data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")
PHASES = ("data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")
_WHOLE = {"step", "epoch", "samples"}  # counts: 64-bit integers; every other column is a float
MAX_ROWS = 2**18      # rows kept at full resolution: 262,144 steps, ~25 MB
MAX_EVENTS = 2**14    # other events kept before the oldest plain epoch events are thinned too

@runtime_checkable
class View(Protocol):
    """What watches a run: `update` at every event (inside the training loop: keep it cheap), `close`
    once the front-end is done with it (also after a failed run, which sends no "end" event)."""

    def update(self, event: dict, log: "MetricsLog") -> None: ...

    def close(self) -> None: ...


class FunctionView:
    """A plain function `fn(event, log)` subscribed as a view; closing it does nothing."""

    def __init__(self, fn: Callable[[dict, "MetricsLog"], None]):
        self.fn = fn

    def update(self, event: dict, log: "MetricsLog") -> None:
        self.fn(event, log)

    def close(self) -> None:
        pass


class Column(array):
    """One history column: an `array` of machine numbers that reads and compares like a list."""

    def __getitem__(self, index):
        item = array.__getitem__(self, index)
        return Column(self.typecode, item) if isinstance(index, slice) else item

    def __eq__(self, other):
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return array.__eq__(self, other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self.tolist())

    def __reduce_ex__(self, protocol):  # pickled and copied as a Column (array's own gives a plain array)
        return _from_bytes, (self.typecode, self.tobytes())

    def __copy__(self):
        return Column(self.typecode, self)

    def __deepcopy__(self, memo):
        return Column(self.typecode, self)


def _from_bytes(typecode: str, data: bytes) -> Column:
    column = Column(typecode)
    column.frombytes(data)
    return column


def _column(name: str, length: int = 0) -> Column:
    whole = name in _WHOLE
    return Column("q" if whole else "d", [0 if whole else math.nan] * length)


def _extend(column: Column, values) -> None:
    before = len(column)
    try:
        column.extend(values)
    except TypeError:  # a missing value (None from an old file) is NaN; a count written as 3.0 is 3
        del column[before:]
        column.extend((math.nan if v is None else v) if column.typecode == "d" else int(v) for v in values)


class MetricsLog:
    def __init__(self):
        self.columns: dict[str, Column] = {name: _column(name) for name in COLUMNS}
        self._marks: list[list] = []  # [rows before it, event] for every event but "steps", in order
        self._views: list[View] = []
        self._stamps: list[Callable[[dict], dict]] = []  # add columns to each window as it arrives
        self._lock = threading.Lock()  # rows, marks and thinning change together; readers copy under it
        self.dropped = 0          # step rows thinned away
        self.dropped_events = 0   # plain epoch events thinned away
        self.full_from_step: int | None = None  # every step from here on is kept

    def __getstate__(self) -> dict:
        """A pickled log is its record only: no views, no lock (e.g. a snapshot sent to be drawn)."""
        with self._lock:
            state = {k: v for k, v in self.__dict__.items() if k not in ("_views", "_stamps", "_lock")}
            state["_marks"] = [list(m) for m in self._marks]
            return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _views=[], _stamps=[], _lock=threading.Lock())

    def subscribe(self, view):
        """Watch this log with a View, or a plain function `fn(event, log)`; returns what it was given."""
        self._views.append(view if isinstance(view, View) else FunctionView(view))
        return view

    def unsubscribe(self, view) -> None:
        """Stop calling `view` (the View subscribe returned, or the function it was given)."""
        self._views = [v for v in self._views if v is not view and not (isinstance(v, FunctionView) and v.fn is view)]

    def stamp(self, fn: Callable[[dict], dict]) -> None:
        """Have `fn(rows)` add columns to every log window from now on, before any view sees it: it returns
        {column: one value per row} (a measurement taken beside the steps, such as the machine's load)."""
        self._stamps.append(fn)

    def unstamp(self, fn: Callable[[dict], dict]) -> None:
        self._stamps = [f for f in self._stamps if f is not fn]

    def emit(self, event: dict) -> None:
        if event["type"] == "steps" and self._stamps:
            rows = dict(event["rows"])
            for fn in list(self._stamps):
                rows.update(fn(rows))
            event = {**event, "rows": rows}
        with self._lock:
            if event["type"] == "steps":
                self._add_rows(event)
            else:
                self._marks.append([len(self.columns["step"]), event])
                if len(self._marks) > MAX_EVENTS:
                    self._thin_events()
        for view in list(self._views):
            try:
                view.update(event, self)
            except Exception as exc:  # a broken view must never stop training
                self.unsubscribe(view)
                warnings.warn(f"nbtrain: a view failed and was detached: {exc!r}", stacklevel=2)

    def _add_rows(self, event: dict) -> None:
        rows, columns = event["rows"], self.columns
        before = len(columns["step"])
        for name, values in rows.items():
            if name not in columns:
                columns[name] = _column(name, before)
            _extend(columns[name], values)
        after = max(len(c) for c in columns.values())
        for name, column in columns.items():  # a window without some column keeps the rows aligned
            if len(column) < after:
                column.extend(_column(name, after - len(column)))
        thinned = event.get("thinned")
        if thinned:  # replaying a thinned history: it says what was dropped before it
            self.dropped += thinned.get("dropped", 0)
            self.dropped_events += thinned.get("dropped_events", 0)
            self.full_from_step = thinned.get("full_from_step", self.full_from_step)
        if after > MAX_ROWS:
            self._thin(MAX_ROWS)

    def _thin(self, max_rows: int) -> None:
        """Drop every other row of the older half until at most `max_rows` rows remain."""
        while len(self.columns["step"]) > max_rows:
            half = len(self.columns["step"]) // 2 & ~1
            if half < 2:
                return
            for column in self.columns.values():
                del column[1:half:2]
            self.dropped += half // 2
            for mark in self._marks:  # rows before an event: those kept of the older half, all after it
                mark[0] = (mark[0] + 1) // 2 if mark[0] <= half else mark[0] - half // 2
            self.full_from_step = int(self.columns["step"][half // 2])

    def _thin_events(self) -> None:
        older = self._marks[:len(self._marks) // 2]
        plain = [m for m in older if m[1]["type"] == "epoch"]
        drop = {id(m) for m in plain[1::2]}
        self.dropped_events += len(drop)
        self._marks = [m for m in self._marks if id(m) not in drop]

    # --- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.columns["step"])

    @property
    def steps_seen(self) -> int:
        """Step rows this log has recorded, thinned away or not."""
        return len(self) + self.dropped

    @property
    def thinning(self) -> str | None:
        """What thinning dropped to keep the history bounded; None when every row is kept."""
        if not self.dropped and not self.dropped_events:
            return None
        text = (f"history thinned to bound its memory: {self.dropped:,} of {self.steps_seen:,} step rows dropped "
                f"(older steps kept at every 2nd, 4th, ... row)")
        if self.full_from_step is not None:
            text += f", every step kept from step {self.full_from_step:,} on"
        if self.dropped_events:
            text += f"; {self.dropped_events:,} older epoch events dropped"
        return text

    @property
    def events(self) -> list[dict]:
        """Every event in order; the "steps" are rebuilt from the columns (one per stretch of rows
        between other events), so replaying them gives a log with the same columns."""
        with self._lock:
            columns = {name: array(c.typecode, c) for name, c in self.columns.items()}
            marks = [tuple(m) for m in self._marks]
            thinned = {"dropped": self.dropped, "dropped_events": self.dropped_events,
                       "full_from_step": self.full_from_step} if self.thinning else None
        out, done = [], 0
        for at, event in marks + [(len(columns["step"]), None)]:
            if at > done:
                steps = {"type": "steps", "rows": {name: c[done:at].tolist() for name, c in columns.items()}}
                if thinned:
                    steps["thinned"], thinned = thinned, None
                out.append(steps)
                done = at
            if event is not None:
                out.append(event)
        return out

    def last(self, event_type: str) -> dict | None:
        if event_type == "steps":
            found = self.of_type("steps")
            return found[-1] if found else None
        for _, event in reversed(self._marks):
            if event["type"] == event_type:
                return event
        return None

    def of_type(self, event_type: str) -> list[dict]:
        if event_type == "steps":
            return [e for e in self.events if e["type"] == "steps"]
        return [event for _, event in list(self._marks) if event["type"] == event_type]

    def read(self, *names: str) -> dict[str, array]:
        """Copies of these columns, taken together: the same rows even while training appends and thins."""
        with self._lock:
            return {name: array(self.columns[name].typecode, self.columns[name]) for name in names}

    def snapshot(self, max_rows: int | None = None) -> "MetricsLog":
        """A consistent copy (no views), thinned to at most `max_rows` rows when given."""
        copy = MetricsLog()
        with self._lock:
            copy.columns = {name: Column(c.typecode, c) for name, c in self.columns.items()}
            copy._marks = [list(m) for m in self._marks]
            copy.dropped, copy.dropped_events, copy.full_from_step = \
                self.dropped, self.dropped_events, self.full_from_step
        if max_rows is not None:
            copy._thin(max_rows)
        return copy

    def tail(self, rows: int = 0, marks: int = 0) -> dict:
        """What the log holds past its first `rows` step rows and `marks` other events, copied together,
        with its thinning counters: a copy elsewhere (the live plot's drawing process) catches up with
        `add_tail`, sent only what it lacks. Counters other than the copy's own mean thinning changed the
        rows it holds: send it the tail from 0."""
        with self._lock:
            return {"rows": rows, "marks": marks,
                    "columns": {name: c[rows:] for name, c in self.columns.items()},
                    "events": [list(m) for m in self._marks[marks:]],
                    "thinned": (self.dropped, self.dropped_events, self.full_from_step)}

    def add_tail(self, tail: dict) -> None:
        """Append another log's `tail`, taken where this log ends (ValueError otherwise)."""
        with self._lock:
            before = len(self.columns["step"])
            if (tail["rows"], tail["marks"]) != (before, len(self._marks)):
                raise ValueError(f"a tail from row {tail['rows']}, event {tail['marks']} does not continue a log "
                                 f"of {before} rows and {len(self._marks)} events")
            for name, values in tail["columns"].items():
                self.columns.setdefault(name, _column(name, before)).extend(values)
            self._marks.extend(list(m) for m in tail["events"])
            self.dropped, self.dropped_events, self.full_from_step = tail["thinned"]

    def to_dict(self) -> dict:
        return {"columns": {name: c.tolist() for name, c in self.columns.items()}, "events": self.events}

    @classmethod
    def from_events(cls, events: list[dict]) -> "MetricsLog":
        log = cls()
        for event in events:
            log.emit(event)
        return log
