"""Live views of a run in a notebook: a plot redrawn in place (the summary after it is the RunResult's own table).

The plot is a MetricsLog view (metrics.View: `update` at every event, `close` when the run is
over), called in the training loop every `log_every_n_steps` steps, so there it only marks
itself stale; it draws on its own thread about once a second, and its final frame when the run
ends. The progress bar is nbtrain.progress.Progress (tqdm.auto), the same as in a terminal.
"""
from __future__ import annotations

import atexit
import base64
import threading
import time

from IPython.display import display
from ..plotting import live_frame
from .plot_process import FrameProcess


_FIGURES: dict = {}
_FIGURES_LOCK = threading.Lock()
FRAMES = FrameProcess()  # the kernel's drawing process, started at the first frame
atexit.register(FRAMES.close)


class LivePlot:
    """Loss (with held-out numbers), samples/s and learning rate against step, redrawn about once a
    second on a thread of its own.

    The training thread only marks the plot stale (one cheap event handler), so drawing never
    sits in a measured step and a costly frame makes frames no rarer: the plot is live from
    the first second of a run. Frames go to a display handle updated in place (a %%nbtrain
    cell) or to an ipywidgets Image (the panel), both safe to update from another thread.
    Figures use matplotlib's object API on an Agg canvas, never pyplot, so the drawing
    thread owns its figure outright.
    """

    def __init__(self, title: str | None = None, interval_s: float = 1.0, widget: bool = False,
                 figsize=(8.5, 2.8), dpi: int = 120, budget: float = 0.03):
        self.title = title
        self.budget = budget
        self.interval_s = interval_s
        self.figsize, self.dpi = figsize, dpi
        self.image = None
        if widget:
            import ipywidgets as widgets
            self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="760px"))
            self.image.add_class("nbtrain-live-plot")
        self.handle = None
        self.renders = 0
        self.cost_s = 0.0  # spent inside the training loop (marking the plot stale)
        self.error: str | None = None
        self.fallback: str | None = None  # why a frame was drawn on this thread, if one was
        self.held_s = 0.0  # the latest frame's CPU time on this thread: its time holding the GIL
        self.drawn_s = 0.0  # the latest frame's CPU time in the drawing process
        self._log = None
        self._stale = threading.Event()
        self._begun = threading.Event()  # the run's first event arrived: it passed its checks and trains
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, log, title: str | None = None) -> "LivePlot":
        """Draw `log` as it grows, until `finish()`."""
        self.finish()
        self._log = log
        self.title = title if title is not None else self.title
        self._done.clear()
        self._begun.clear()
        log.subscribe(self)
        self._thread = threading.Thread(target=self._loop, name="nbtrain-live-plot", daemon=True)
        self._thread.start()
        return self

    def update(self, event, log) -> None:
        """The training thread's part: mark the plot stale (drawing happens on the plot's own thread)."""
        started = time.perf_counter()
        self._begun.set()
        if event["type"] in ("steps", "change", "end"):
            self._stale.set()
        self.cost_s += time.perf_counter() - started

    def _loop(self) -> None:
        # Nothing starts before the run's first event: a cell refused by its checks (bad input) starts no
        # drawing process and leaves no process behind.
        while not self._begun.wait(0.05):
            if self._done.is_set():
                return
        started = time.monotonic()
        try:  # the drawing process started and matplotlib loaded while the run's first second passes
            FRAMES.warm(self.figsize, self.dpi)
        except RuntimeError:
            pass  # the first frame says so, and is drawn here
        due = started + self.interval_s
        while not self._done.wait(max(0.0, due - time.monotonic())):
            if not self._stale.is_set():
                due = time.monotonic() + min(self.interval_s, 0.2)
                continue
            self._stale.clear()
            started = time.monotonic()
            held = self.redraw()
            # About once a second, counted from the start of the last frame: the wait for the drawing process is
            # not added to the second. Never more than `budget` of training time on this thread (a frame drawn
            # here holds the GIL), and the drawing process busy at most half of a core (one the training may
            # want). Both in CPU time: on a loaded machine, waiting for a core takes nothing from training.
            due = started + max(self.interval_s, held / self.budget, 2 * self.drawn_s)

    def finish(self) -> None:
        """Stop following and draw the final state once."""
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        self._thread = None
        if self._log is not None:
            self._log.unsubscribe(self)
        self.redraw()

    def close(self) -> None:
        """The view protocol's end: the final frame, drawn once."""
        self.finish()

    def redraw(self) -> float:
        """Draw the latest state; returns the seconds of CPU this thread spent on it, i.e. held the GIL
        (waiting for the drawing process, for the GIL or for a core does not count: training runs meanwhile)."""
        if self._log is None:
            return 0.0
        started, self.drawn_s = time.thread_time(), 0.0
        try:
            if len(self._log):
                self._show(self.png(self._log), self._log)
        except Exception as exc:  # said by the front-end; training goes on
            self.error = f"live plot failed: {exc!r}"
        self.held_s = time.thread_time() - started
        return self.held_s

    def png(self, log) -> bytes:
        """A frame, drawn in the kernel's drawing process (plot_process.py), which is sent only what the log
        gained since the last frame, so the training thread never waits for it; on this thread, holding
        the GIL, only if that process cannot draw."""
        try:
            png = FRAMES.png(log, self.figsize, self.dpi, self.title)
            self.drawn_s = FRAMES.drawn_s
            return png
        except RuntimeError as exc:
            self.fallback = str(exc)
        snapshot = log.snapshot()  # a consistent copy while training appends to the original
        with _FIGURES_LOCK:  # one figure per size for every live plot of the kernel: made (costly) once
            return live_frame(_FIGURES, snapshot, self.figsize, self.dpi, self.title)

    def _show(self, png: bytes, log) -> None:
        self.renders += 1
        if self.image is not None:
            self.image.value = png
            return
        steps = log.columns["step"]
        bundle = {"image/png": base64.b64encode(png).decode(),
                  "text/plain": f"nbtrain live plot{' ' + self.title if self.title else ''}: loss, samples/s and lr, "
                                f"step {steps[-1]}"}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)
