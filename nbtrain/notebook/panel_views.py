"""The panel's views: the runs table and the compare view (its live plot is views.LivePlot).

Training runs in a background thread, so these views never use an Output widget's
context manager (it captures output per thread unreliably). They only assign widget
values (Image bytes, HTML text), which ipywidgets sends safely from any thread.
Figures are drawn with matplotlib's object API on an Agg canvas, never pyplot, so a
background thread owns its figure outright.
"""
from __future__ import annotations

import html
import io
import math

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..compare import versus
from ..measure.ab import describe_change
from .panel_runs import RunRecord


def render_png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


COLUMNS = ("run", "status", "device", "precision", "batch", "accum", "workers", "processes", "global batch",
           "lr", "steps", "samples/s", "time/epoch", "peak memory", "final loss")


class RunsTable:
    def __init__(self):
        self.html = widgets.HTML()
        self.html.add_class("nbtrain-runs")

    def show(self, runs: list[RunRecord]) -> None:
        head = "".join(f"<th>{c}</th>" for c in COLUMNS)
        rows = "".join(
            f"<tr class='nbtrain-run-row' data-run='{r.number}' data-status='{html.escape(r.status)}'>"
            + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.cells()) + "</tr>"
            for r in runs)
        style = "border-collapse:collapse;font-size:12px"
        self.html.value = (f"<table style='{style}' border='1' cellpadding='3'><thead><tr>{head}</tr></thead>"
                           f"<tbody>{rows}</tbody></table>" if runs else "<i>no runs yet</i>")


class CompareView:
    """Chosen runs side by side: loss against training time, throughput, and measured ratios."""

    def __init__(self):
        self.select = widgets.SelectMultiple(description="compare", rows=4)
        self.select.add_class("nbtrain-compare-select")
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="760px"))
        self.image.add_class("nbtrain-compare-plot")
        self.summary = widgets.HTML()
        self.summary.add_class("nbtrain-compare-summary")
        self.widget = widgets.VBox([self.select, self.summary, self.image])
        self._runs: dict[int, RunRecord] = {}

    def offer(self, runs: list[RunRecord]) -> None:
        """Make finished runs selectable; the newest few are chosen."""
        finished = [r for r in runs if r.result is not None]
        self._runs = {r.number: r for r in finished}
        self.select.options = [(r.label(), r.number) for r in finished]
        self.select.value = tuple(r.number for r in finished[-4:])

    def draw(self) -> None:
        chosen = [self._runs[n] for n in self.select.value if n in self._runs]
        if not chosen:
            self.summary.value, self.image.value = "", b""
            return
        self.summary.value = comparison_text(chosen)
        figure = Figure(figsize=(8.4, 2.8), layout="constrained")
        loss_ax, rate_ax = figure.subplots(1, 2)
        labels = run_labels(chosen)
        for run, label in zip(chosen, labels):
            cols = run.result.log.columns
            loss_ax.plot(cols["time"], cols["loss"], lw=1.2, label=label)
        loss_ax.set_xlabel("training time (s)")
        loss_ax.set_ylabel("training loss")
        loss_ax.legend(fontsize=7)
        steady = [run.result.steady() for run in chosen]
        rates = [0 if math.isnan(r.rate) else r.rate for r in steady]
        # The bars carry their 95% intervals: overlapping whiskers mean the runs cannot be told apart.
        errors = [[max(0.0, r.rate - r.low) if math.isfinite(r.low) else 0 for r in steady],
                  [max(0.0, r.high - r.rate) if math.isfinite(r.high) else 0 for r in steady]]
        rate_ax.bar(range(len(chosen)), rates, yerr=errors, capsize=4, color="tab:orange")
        rate_ax.set_xticks(range(len(chosen)), labels, fontsize=7)
        rate_ax.set_ylabel("steady samples/s")
        self.image.value = render_png(figure)


def run_labels(runs: list[RunRecord]) -> list[str]:
    """Each run named by what differs from the first chosen one ('#2 precision=bf16-mixed')."""
    first = runs[0].result.config
    return [f"#{r.number} " + (describe_change(first, r.result.config) if r is not runs[0] else "(first)")
            for r in runs]


def comparison_text(runs: list[RunRecord]) -> str:
    """Each run's steady throughput against the first chosen one, as a verdict with its interval."""
    first = runs[0]
    parts = [f"#{run.number} vs #{first.number}: " + versus(first.result, run.result).text(
        describe_change(first.result.config, run.result.config)) for run in runs[1:]]
    if parts:
        parts.append("runs measured at different times; nbtrain.ab(...) measures two configs in alternation")
    return "<small>" + "<br>".join(html.escape(p) for p in parts or [f"#{first.number} alone"]) + "</small>"
