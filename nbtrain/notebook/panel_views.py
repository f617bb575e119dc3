"""The panel's views: the runs table, the compare view, "copy as code" (its live plot is views.LivePlot).

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

from ..runs import table
from ..runs.apart import against, footnotes
from ..runs.repeats import evidence
from ..config import TrainConfig
from ..measure.ab import describe_change
from .panel_help import BUTTONS
from .panel_runs import RunRecord


HIDPI = 2  # figures drawn at twice the pixels they are shown at: sharp on HiDPI screens


def render_png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=72 * HIDPI)
    return buffer.getvalue()


def show_once_drawn(image: widgets.Image, placeholder: widgets.Widget | None = None) -> None:
    """Keep an Image hidden while it is empty (the browser would show a broken-image icon), and show
    `placeholder` instead until the first frame."""
    def update(_change=None):
        drawn = len(image.value) > 0
        image.layout.display = None if drawn else "none"
        if placeholder is not None:
            placeholder.layout.display = "none" if drawn else None
    image.observe(update, "value")
    update()


def fit_width(image: widgets.Image, max_width: str = "760px") -> None:
    """An image as wide as its column (up to `max_width`), its height following."""
    image.layout.width, image.layout.max_width, image.layout.height = "100%", max_width, "auto"
    image.layout.margin = "0"  # a margin added to 100% would stick out of the column


def readout_html(c: TrainConfig, lr_note: str) -> str:
    """What the settings add up to: the global batch and its factors, the learning rate, the budget."""
    devices = f"{c.world_size} device{'s' if c.world_size > 1 else ''}"
    budget = ", ".join(x for x in (f"{c.epochs_budget} epoch(s)" if c.epochs_budget else "",
                                   f"at most {c.max_steps} steps" if c.max_steps else "") if x)
    return (f"<div style='line-height:1.4;white-space:normal'><b>global batch {c.global_batch_size}</b> = "
            f"batch {c.batch_size} × accumulate {c.accumulate_grad_batches} × {devices} · "
            f"<b>learning rate {html.escape(lr_note)}</b> · {c.precision} on {c.device_type} · {budget}</div>")


class RunsView:
    """The panel's widget of the one runs table (runs.table.RunsTable): the columns that matter first, every
    other setting and measurement folded under a toggle."""

    def __init__(self):
        self.html = widgets.HTML()
        self.html.add_class("nbtrain-runs")
        self.details = widgets.ToggleButton(description="details", icon="list", tooltip=BUTTONS["details"],
                                            layout=widgets.Layout(width="auto", align_self="flex-start"))
        self.details.add_class("nbtrain-runs-details")
        self.details.observe(lambda _change: self.show(self._runs), "value")
        self.widget = widgets.VBox([self.html, self.details])
        self._runs: list[RunRecord] = []

    def show(self, runs: list[RunRecord]) -> None:
        self._runs = list(runs)
        if not runs:
            self.html.value = "<i>no runs yet: press Run</i>"
            return
        self.html.value = table.RunsTable([run.row() for run in runs]).html(details=self.details.value)


CODE_STYLE = ("margin:2px 0;padding:4px 6px;background:var(--jp-layout-color2,#f5f5f5);"
              "border:1px solid var(--jp-border-color2,#ddd);font-size:12px;line-height:1.4;white-space:pre-wrap;"
              "overflow-wrap:anywhere;user-select:all")


class CodeView:
    """'copy as code': the settings as a %%nbtrain line and a TrainConfig(...) expression, one click selects each."""

    def __init__(self):
        self.toggle = widgets.ToggleButton(description="copy as code", icon="code", tooltip=BUTTONS["code"],
                                           layout=widgets.Layout(width="auto"))
        self.toggle.add_class("nbtrain-code-toggle")
        self.html = widgets.HTML(layout=widgets.Layout(display="none"))
        self.html.add_class("nbtrain-code")
        self.toggle.observe(lambda change: setattr(self.html.layout, "display", None if change["new"] else "none"),
                            "value")

    def show(self, config: TrainConfig | None) -> None:
        if config is None:
            self.html.value = "<i>the settings above are invalid: the status line says why</i>"
            return
        self.html.value = "".join(f"<pre style='{CODE_STYLE}'>{html.escape(text)}</pre>"
                                  for text in (config.as_flags(), config.as_code()))


class CompareView:
    """Chosen runs side by side: loss against training time, throughput, and measured ratios."""

    def __init__(self):
        # No description: ipywidgets 8 then shows the tooltip on the list itself.
        self.select = widgets.SelectMultiple(rows=4, tooltip=BUTTONS["compare"], layout=widgets.Layout(width="auto"))
        self.select.add_class("nbtrain-compare-select")
        self.image = widgets.Image(format="png")
        fit_width(self.image)
        self.image.add_class("nbtrain-compare-plot")
        show_once_drawn(self.image)
        self.summary = widgets.HTML()
        self.summary.add_class("nbtrain-compare-summary")
        heading = widgets.HTML("<b>compare</b> <small>(Ctrl- or Shift-click to choose several runs)</small>")
        self.widget = widgets.VBox([heading, self.select, self.summary, self.image])
        self._runs: dict[int, RunRecord] = {}

    def offer(self, runs: list[RunRecord]) -> None:
        """Make finished runs selectable; the newest few are chosen."""
        finished = [r for r in runs if r.result is not None]
        self._runs = {r.number: r for r in finished}
        self.select.options = [(choice_label(r, runs[0]), r.number) for r in finished]
        self.select.value = tuple(r.number for r in finished[-4:])

    def draw(self) -> None:
        chosen = [self._runs[n] for n in self.select.value if n in self._runs]
        if not chosen:
            self.summary.value, self.image.value = "", b""
            return
        self.summary.value = comparison_text(chosen)
        figure = Figure(figsize=(7.6, 2.6), layout="constrained")
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
        rate_ax.set_xticks(range(len(chosen)), [f"#{run.number}" for run in chosen], fontsize=8)
        rate_ax.set_ylabel("steady samples/s")
        rate_ax.set_title("whiskers: 95% interval", fontsize=8)
        self.image.value = render_png(figure)


def choice_label(run: RunRecord, first: RunRecord) -> str:
    """A run in the compare list: by what differs from the first run, as in the runs table."""
    if run is first:
        return f"{run.label()} (first run)"
    return f"#{run.number} {describe_change(first.config, run.config)}"


def run_labels(runs: list[RunRecord]) -> list[str]:
    """Each run named by what differs from the first chosen one ('#2 precision=bf16-mixed')."""
    first = runs[0].result.config
    return [f"#{r.number} " + (describe_change(first, r.result.config) if r is not runs[0] else "(first)")
            for r in runs]


def comparison_text(runs: list[RunRecord]) -> str:
    """Each run's steady throughput against the first chosen one, as a verdict with its interval (the
    comparison table's rules: an A/A check for the same settings, none for runs too short or a load that
    could explain it)."""
    first = runs[0]
    seen = evidence([run.result for run in runs])  # the panel's runs of one settings: A/A evidence

    # each run against the first: its verdict, or withheld.py's record of why none (the words read, never re-decided)
    readings = [against((f"#{first.number}", first.result), (f"#{run.number}", run.result), seen) for run in runs[1:]]
    parts = [f"#{run.number} vs #{first.number}: " + reading.line(describe_change(first.result.config, run.result.config))
             for run, reading in zip(runs[1:], readings)]
    if parts:  # the panel's lines carry no mark: no note for one
        parts += footnotes(readings, marked=False) or ["runs measured at different times; nbtrain.ab(...) measures "
                                                       "two configs in alternation"]
    return ("<div style='font-size:12px;line-height:1.4;white-space:normal'>"
            + "<br>".join(html.escape(p) for p in parts or [f"#{first.number} alone"]) + "</div>")
