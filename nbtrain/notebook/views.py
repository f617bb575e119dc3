"""Live views of a run in a notebook: a progress bar, a plot redrawn in place, the summary.

Views are MetricsLog subscribers (`view(event, log)`), called in the training loop every
`log_every_n_steps` steps, so each one keeps its own cost small: the bar is tqdm's
(rate-limited by tqdm), and the plot renders only when the time since its last render is
at least `1 / budget` times what that render cost (and at least `min_interval`), so drawing
costs the loop about `budget` (1%) of its time. The final frame is always drawn.
"""
from __future__ import annotations

import base64
import html
import io
import time

from IPython.display import display

from ..plotting import draw


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


class LivePlot:
    """Loss and samples/s against step, one image updated in place through a display handle.

    The figure is built and a first (empty) frame rendered before training starts: that
    takes the import and font set-up out of the loop and measures what a frame costs,
    so the first frame inside the loop is already spaced by the budget.
    """

    def __init__(self, title: str | None = None, budget: float = 0.01, min_interval: float = 1.0,
                 figsize=(8.5, 2.8), dpi: int = 72):
        from matplotlib.figure import Figure  # Agg only: no pyplot figure that the inline backend re-shows
        from ..metrics import MetricsLog
        self.title = title
        self.budget = budget
        self.min_interval = min_interval
        self.dpi = dpi
        self.handle = None
        self.renders = 0
        self.cost_s = 0.0  # spent rendering inside the training loop
        self._figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        self._axes = self._figure.subplots(1, 2)
        started = time.perf_counter()
        self.render(MetricsLog())
        self._next = time.perf_counter() + self._spacing(time.perf_counter() - started)

    def _spacing(self, cost: float) -> float:
        return max(self.min_interval, cost / self.budget)

    def __call__(self, event: dict, log) -> None:
        kind = event["type"]
        if kind not in ("steps", "change", "end") or not len(log):
            return
        now = time.perf_counter()
        if kind != "end" and now < self._next:
            return
        self.render(log)
        cost = time.perf_counter() - now
        if kind != "end":  # the final frame is drawn after the last step's clock reading
            self.cost_s += cost
        self._next = time.perf_counter() + self._spacing(cost)

    def png(self, log) -> bytes:
        draw(log, *self._axes, title=self.title)
        buffer = io.BytesIO()
        self._figure.savefig(buffer, format="png", dpi=self.dpi)
        return buffer.getvalue()

    def render(self, log) -> None:
        steps = log.columns["step"]
        bundle = {"image/png": base64.b64encode(self.png(log)).decode(),
                  "text/plain": f"nbtrain live plot{' ' + self.title if self.title else ''}: loss and samples/s, "
                                f"{'step ' + str(steps[-1]) if steps else 'waiting for the first steps'}"}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)
        self.renders += 1


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


class RunsTable:
    """`%nbtrain_runs`: stored runs, one line each."""

    HEADS = ("id", "name", "when", "status", "model", "device", "precision", "batch", "steps", "samples/s",
             "last loss", "val acc", "peak MB")

    def __init__(self, runs, path):
        self.path = path
        self.rows = [self._row(r) for r in runs]

    @staticmethod
    def _row(run) -> tuple:
        from ..result import _fmt
        s, c = run.summary, run.config
        acc = s.get("val_acc")
        return (str(run.id), run.name or "-", time.strftime("%m-%d %H:%M", time.localtime(run.created)), run.status,
                run.model or "-", f"{s.get('device', '-')} x{s.get('world_size', 1)}", c.get("precision", "-"),
                str(s.get("global_batch", c.get("batch_size"))), str(s.get("steps", "-")),
                _fmt(s.get("samples_per_s")), _fmt(s.get("last_loss")),
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
