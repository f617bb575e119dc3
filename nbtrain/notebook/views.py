"""Live views of a run in a notebook: a progress bar, a plot redrawn in place, the summary.

Views are MetricsLog subscribers (`view(event, log)`), called in the training loop every
`log_every_n_steps` steps, so each one keeps its own cost small: the bar is tqdm's
(rate-limited by tqdm), and the plot only marks itself stale there; it draws on its own
thread about once a second, and its final frame when the run ends.
"""
from __future__ import annotations

import base64
import html
import io
import threading
import time

from IPython.display import display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..plotting import draw, history_axes


class LiveProgress:
    """A notebook progress bar (tqdm.auto: a widget in a kernel) with samples/s and loss."""

    def __init__(self, description: str = "", **tqdm_options):
        self.description = description
        self.options = tqdm_options
        self.bar = None
        self.cost_s = 0.0

    def __call__(self, event: dict, log) -> None:
        started = time.perf_counter()
        kind = event["type"]
        if kind == "start":
            from tqdm.auto import tqdm
            self.bar = tqdm(total=event["info"]["planned_steps"], unit="step", desc=self.description,
                            dynamic_ncols=True, **self.options)
            self._mark = (0.0, event["info"].get("samples_start", 0))
        elif self.bar is not None and kind == "steps" and event["rows"]["step"]:
            rows = event["rows"]
            self.bar.update(len(rows["step"]))
            (t0, s0), t1, s1 = self._mark, rows["time"][-1], rows["samples"][-1]
            self._mark = (t1, s1)  # samples/s over this log window only, so a slow start fades out
            self.bar.set_postfix(loss=f"{rows['loss'][-1]:.4f}",
                                 samples_s=f"{(s1 - s0) / (t1 - t0):,.0f}" if t1 > t0 else "-", refresh=False)
        elif self.bar is not None and kind == "epoch" and event.get("val_acc") is not None:
            self.bar.set_postfix(val_loss=f"{event['val_loss']:.4f}", val_acc=f"{100 * event['val_acc']:.1f}%",
                                 refresh=False)
        elif kind == "end":
            if self.bar is not None:  # end on the summary's steady rate: one speed on the screen, not two
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


_FIGURES: dict = {}
_FIGURES_LOCK = threading.Lock()


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
                 figsize=(8.5, 2.8), dpi: int = 72, budget: float = 0.03):
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
        self._log = None
        self._stale = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, log, title: str | None = None) -> "LivePlot":
        """Draw `log` as it grows, until `finish()`."""
        self.finish()
        self._log = log
        self.title = title if title is not None else self.title
        self._done.clear()
        log.subscribe(self._on_event)
        self._thread = threading.Thread(target=self._loop, name="nbtrain-live-plot", daemon=True)
        self._thread.start()
        return self

    def _on_event(self, event, log) -> None:
        started = time.perf_counter()
        if event["type"] in ("steps", "change", "end"):
            self._stale.set()
        self.cost_s += time.perf_counter() - started

    def _loop(self) -> None:
        wait = self.interval_s
        while not self._done.wait(wait):
            if self._stale.is_set():
                self._stale.clear()
                started = time.perf_counter()
                self.redraw()
                # About once a second; a slow machine's costly frame spaces the next one out, so drawing
                # (which holds the GIL) never takes more than `budget` of the training thread's time.
                wait = max(self.interval_s, (time.perf_counter() - started) / self.budget)

    def finish(self) -> None:
        """Stop following and draw the final state once."""
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        self._thread = None
        if self._log is not None:
            self._log.unsubscribe(self._on_event)
        self.redraw()

    close = finish

    def redraw(self) -> None:
        if self._log is None:
            return
        try:
            snapshot = self._log.snapshot()  # a consistent copy while training appends to the original
            if len(snapshot):
                self._show(self.png(snapshot), snapshot)
        except Exception as exc:  # said by the front-end; training goes on
            self.error = f"live plot failed: {exc!r}"

    def png(self, log) -> bytes:
        """A frame. The figure is kept between frames, with fixed margins: a layout engine would be most
        of a frame's cost, and a frame's cost is time the training thread waits for the GIL."""
        with _FIGURES_LOCK:  # one figure per size for every live plot of the kernel: made (costly) once
            key = (tuple(self.figsize), self.dpi)
            if key not in _FIGURES:
                figure = Figure(figsize=self.figsize, dpi=self.dpi)
                FigureCanvasAgg(figure)
                # Fixed margins, room for six-digit tick labels: no layout engine to run at every frame.
                figure.subplots_adjust(left=0.075, right=0.985, bottom=0.16, top=0.88, wspace=0.3, hspace=0.12)
                _FIGURES[key] = (figure, history_axes(figure))
            figure, axes = _FIGURES[key]
            draw(log, *axes[:2], title=self.title, lr_ax=axes[2])
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=self.dpi)
            return buffer.getvalue()

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


class Summary:
    """The compact after-run summary: RunResult.rows() as an HTML table (text in a terminal)."""

    def __init__(self, result, notes: list[str] = ()):
        self.result = result
        self.notes = list(notes)

    def __repr__(self) -> str:
        return "\n".join([self.result.table()] + self.notes)

    def _repr_html_(self) -> str:
        title = html.escape(f"nbtrain run{' ' + self.result.name if self.result.name else ''}")
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                       f"<td style='text-align:left'>{html.escape(text)}</td></tr>" for label, text in self.result.rows())
        notes = "".join(f"<div>{html.escape(note)}</div>" for note in self.notes)
        return f"<div><b>{title}</b><table>{rows}</table>{notes}</div>"


def _steady_cell(summary: dict) -> str:
    """Steady samples/s with its 95% interval, compact for a table cell."""
    from ..runs.result import _fmt
    steady = summary.get("steady") or {}
    low, high = steady.get("low"), steady.get("high")
    if low is None or high is None or low != low or high != high:
        return _fmt(summary.get("samples_per_s"))
    return f"{_fmt(summary.get('samples_per_s'))} ({_fmt(low)}-{_fmt(high)})"


class RunsTable:
    """`%nbtrain_runs`: stored runs, one line each."""

    HEADS = ("id", "name", "when", "status", "model", "device", "precision", "batch", "steps", "samples/s",
             "last loss", "val loss", "val acc", "peak MB")

    def __init__(self, runs, path):
        self.path = path
        self.rows = [self._row(r) for r in runs]

    @staticmethod
    def _row(run) -> tuple:
        from ..runs.result import _fmt
        s, c = run.summary, run.config
        acc = s.get("val_acc")
        return (str(run.id), run.name or "-", time.strftime("%m-%d %H:%M", time.localtime(run.created)), run.status,
                run.model or "-", f"{s.get('device', '-')} x{s.get('world_size', 1)}", c.get("precision", "-"),
                str(s.get("global_batch", c.get("batch_size"))), str(s.get("steps", "-")),
                _steady_cell(s), _fmt(s.get("last_loss")), _fmt(s.get("val_loss")),
                "-" if acc is None else f"{100 * acc:.1f}%", _fmt(s.get("peak_mem_mb")))

    def __repr__(self) -> str:
        if not self.rows:
            return f"no runs stored in {self.path} yet"
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(self.HEADS)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in [self.HEADS, *self.rows]]
        return "\n".join([f"runs in {self.path}"] + lines)

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<div>no runs stored in {html.escape(str(self.path))} yet</div>"
        head = "".join(f"<th>{h}</th>" for h in self.HEADS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in self.rows)
        return f"<div>runs in {html.escape(str(self.path))}</div><table><tr>{head}</tr>{body}</table>"
