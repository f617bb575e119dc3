"""A run's history against step, from a MetricsLog: the training loss (raw and smoothed) with the
held-out numbers, samples/s, the learning rate; config changes marked. Also the figure handling
every result's plot method shares.

A long run is decimated for drawing (means over spans of steps), so the live plot's redraw
costs the same at step 1,000 and step 1,000,000."""
from __future__ import annotations

import contextlib
from array import array

import numpy as np

from .format import number
from .measure.steady import SteadyRate, of_columns
from .records import Summary, samples_start

MAX_POINTS = 1000  # points a line draws: enough for any figure's width


_RESULT_FIGURE: list = []  # the class, made at first use: matplotlib is imported only where a plot is drawn


def figure_class():
    """The Figure class of every result's plot (a matplotlib Figure that a notebook shows once)."""
    if _RESULT_FIGURE:
        return _RESULT_FIGURE[0]
    import base64
    import io
    from matplotlib.figure import Figure

    class _ResultFigure(Figure):
        """A result's figure (`result.plot(...)` returns it), shown once in a notebook and as one line in a
        terminal ("figure saved to PATH"), never as `<Figure size 900x340 with 4 Axes>`. Shown by the display
        hook, it leaves pyplot's inline backend, which would show it again when the cell ends."""
        saved_to: str | None = None

        def _ipython_display_(self):
            import matplotlib
            from IPython.display import display
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            words = f"figure saved to {self.saved_to}" if self.saved_to else f"a figure of {len(self.axes)} panels"
            display({"image/png": base64.b64encode(buffer.getvalue()).decode(), "text/plain": words}, raw=True)
            if "inline" in matplotlib.get_backend():  # (a window of a GUI backend stays open)
                import matplotlib.pyplot as plt
                plt.close(self)

    _ResultFigure.__name__ = _ResultFigure.__qualname__ = "ResultFigure"  # pickled by name: __getattr__ below
    _RESULT_FIGURE.append(_ResultFigure)
    return _ResultFigure


def __getattr__(name: str):
    if name == "ResultFigure":  # (made at first use, see figure_class)
        return figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_figure(path=None, figsize=(6, 3.2)):
    """A result's figure: for a file (`path`), an Agg figure outside pyplot (pyplot's backend, the notebook's
    inline one included, stays as it was, and nothing piles up); otherwise one of pyplot's, which a script
    shows with plt.show() and a notebook once."""
    if path is not None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        figure = figure_class()(figsize=figsize, layout="constrained")
        FigureCanvasAgg(figure)
        return figure
    import matplotlib.pyplot as plt
    return plt.figure(figsize=figsize, layout="constrained", FigureClass=figure_class())


def saved(figure, path) -> None:
    if path is not None:
        figure.savefig(path, dpi=100)
        figure.saved_to = str(path)


@contextlib.contextmanager
def axes(path=None, ax=None, figsize=(6, 3.2)):
    """An axis to draw on — `ax`, or one on a new figure (new_figure) — whose figure is saved to `path` on exit."""
    if ax is None:
        ax = new_figure(path, figsize).add_subplot()
    yield ax
    saved(ax.figure, path)


def _numbers(column: array) -> np.ndarray:
    return np.frombuffer(column, dtype=np.dtype(column.typecode))  # (a copy from MetricsLog.read: no one appends)


def _bucket_starts(rows: int, every: int) -> np.ndarray:
    return np.arange(0, rows, max(every, 1))


def _every(log, rows: int, max_points: int) -> int:
    """Rows per drawn point: the log window, or more where the run has more than `max_points` of them."""
    start = log.last("start")
    window = (start or {}).get("config", {}).get("log_every_n_steps") or 1
    return max(int(window), -(-rows // max_points))


def throughput_series(log, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """(step, samples/s) at the end of each log window (or of each of at most `max_points` spans of
    steps, in a long run), measured over that span."""
    cols = log.read("step", "time", "samples")
    rows = len(cols["step"])
    if not rows:
        return [], []
    ends = np.append(_bucket_starts(rows, _every(log, rows, max_points))[1:] - 1, rows - 1)
    steps, t, s = (_numbers(cols[name])[ends] for name in ("step", "time", "samples"))
    t0 = np.append(0.0, t[:-1])
    s0 = np.append(samples_start(log), s[:-1])
    ok = t > t0  # (a requeued run's clock starts again: no rate across that)
    return steps[ok].tolist(), ((s - s0)[ok] / (t - t0)[ok]).tolist()


def column_series(log, name: str, max_points: int = MAX_POINTS) -> tuple[list, list, int]:
    """(step, value) of a step column drawn: every step, or the mean of each span of steps when there
    are more than `max_points`; and the steps per point."""
    cols = log.read("step", name)
    rows = len(cols["step"])
    steps, values = _numbers(cols["step"]), _numbers(cols[name])
    if rows <= max_points:
        return steps.tolist(), values.tolist(), 1
    every = -(-rows // max_points)
    starts = _bucket_starts(rows, every)
    means = np.add.reduceat(values, starts) / np.diff(np.append(starts, rows))
    return steps[np.append(starts[1:] - 1, rows - 1)].tolist(), means.tolist(), every


def loss_series(log, max_points: int = MAX_POINTS) -> tuple[list, list, int]:
    return column_series(log, "loss", max_points)


def smoothed(values: list, points: int = 25) -> np.ndarray:
    """A centred running mean over ~1/`points` of the drawn line (3 points at least, from 20 on;
    narrower at the ends), so the trend shows without lagging behind the raw curve; NaNs (a missing
    value) are left out of the means."""
    values = np.asarray(values, dtype=float)
    width = max(len(values) // points, 3 if len(values) >= 20 else 1) | 1  # odd: centred on each point
    if width == 1:
        return values
    kernel = np.ones(width)
    known = np.isfinite(values)
    sums = np.convolve(np.where(known, values, 0.0), kernel, mode="same")
    counts = np.convolve(known.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def held_out_series(log, max_points: int = MAX_POINTS) -> dict[str, tuple[list, list]]:
    """{name: (steps, values)} of every held-out number the run's validations gave (val_loss, val_acc,
    val_<metric>), at most `max_points` points each."""
    series: dict[str, tuple[list, list]] = {}
    for event in log.of_type("epoch"):
        if event.get("val_loss") is None:
            continue  # an epoch boundary without a validation
        for name, value in event.items():
            if name.startswith("val") and isinstance(value, (int, float)):
                steps, values = series.setdefault(name, ([], []))
                steps.append(event["step"])
                values.append(value)
    every = max(1, -(-max((len(s) for s, _ in series.values()), default=0) // max_points))
    return {name: (steps[::-1][::every][::-1], values[::-1][::every][::-1])  # the latest point always kept
            for name, (steps, values) in series.items()}


_METRIC_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")  # not the losses'


def _label(name: str) -> str:
    return "held-out " + (name[4:] if name.startswith("val_") else name)


def _draw_loss(log, ax, title, max_points: int, crowded: bool = False) -> None:
    """The training loss, faint as measured and solid smoothed, with the held-out numbers: the loss on
    the same scale, accuracy and the user's metrics on a twin axis of their own."""
    steps, loss, every = loss_series(log, max_points)
    trend = smoothed(loss)
    smoothing = len(loss) and not np.array_equal(trend, np.asarray(loss, dtype=float), equal_nan=True)
    ax.plot(steps, loss, color="tab:blue", lw=0.8, alpha=0.35 if smoothing else 1.0,
            label="training loss" + (f" (mean of {every} steps)" if every > 1 else ""))
    if smoothing:
        ax.plot(steps, trend, color="tab:blue", lw=1.6, label="smoothed")
    ax.set_ylabel("loss")
    held = held_out_series(log, max_points)
    if "val_loss" in held:
        ax.plot(*held.pop("val_loss"), color="tab:red", lw=1, marker="o", ms=3.5, label="held-out loss")
    metric_ax = _metric_axis(ax, bool(held), crowded)
    percent = list(held) == ["val_acc"]  # accuracy alone: in percent, as the summary says it (96.94%)
    for i, (name, (steps, values)) in enumerate(held.items()):
        # The latest accuracy in the summary's own words, in its legend entry (beside the point, it sat on
        # the line into it).
        label = f"held-out accuracy, latest {number(100 * values[-1], '%')}" if percent else _label(name)
        metric_ax.plot(steps, [100 * v for v in values] if percent else values, lw=1, ls=":", ms=3.5,
                       color=_METRIC_COLORS[i % len(_METRIC_COLORS)], marker="sD^v<>"[i % 6], label=label)
    if percent:
        metric_ax.yaxis.set_major_formatter(lambda value, _position: f"{value:g}%")
        metric_ax.set_ylabel("held-out accuracy", fontsize=8)
    handles = [h for a in (ax, metric_ax) if a is not None for h in a.get_legend_handles_labels()[0]]
    if len(handles) > 1:  # above the panel, under the title: inside, it would hide the points it names
        ax.legend(handles=handles, title=title, fontsize=6.5, title_fontsize=9, loc="lower center",
                  bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False, handlelength=1.5, columnspacing=1.0,
                  borderaxespad=0.2)
    elif title:
        ax.set_title(title)


def _metric_axis(ax, wanted: bool, crowded: bool):
    """The loss panel's twin axis for held-out metrics, or None; a redraw in place reuses (and clears)
    the one it made, rather than stacking another."""
    metric_ax = getattr(ax, "_nbtrain_metric_ax", None)
    if metric_ax is not None:
        metric_ax.clear()
    elif wanted:
        metric_ax = ax._nbtrain_metric_ax = ax.twinx()
        if crowded:  # samples/s already holds this panel's right edge: the metric scale moves out past it
            metric_ax.spines["right"].set_position(("outward", 62))
    if metric_ax is not None and wanted:
        metric_ax.set_ylabel("held-out metric", fontsize=8)
        metric_ax.yaxis.set_label_position("right")  # clear() put it on the left, over the loss's own
        metric_ax.tick_params(labelsize=7)
    return metric_ax if wanted else None


def _draw_lr(log, ax, max_points: int) -> None:
    steps, lrs, every = column_series(log, "lr", max_points)
    ax.plot(steps, lrs, color="0.3", lw=1.2)
    ax.set_ylabel("learning rate", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.yaxis.get_offset_text().set_fontsize(7)


def _lr_panel(log, rate_ax, lr_ax) -> bool:
    """Whether the learning rate gets its panel: only when it changes (a warm-up, a schedule, a change
    made live); a constant rate is the summary's one number, and samples/s takes the panel's room."""
    lrs = _numbers(log.read("lr")["lr"])
    changes = len(lrs) > 1 and bool(np.nanmax(lrs) > np.nanmin(lrs))
    spec = getattr(lr_ax, "_nbtrain_spec", None)
    if spec is None:  # the stacked layout history_axes made: samples/s above the learning rate
        spec = lr_ax._nbtrain_spec = (rate_ax.get_subplotspec(), lr_ax.get_subplotspec())
    rate_spec, lr_spec = spec
    lr_ax.set_visible(changes)
    rate_ax.set_subplotspec(rate_spec if changes else rate_spec.get_gridspec()[:, lr_spec.colspan.start])
    return changes


def _step_text(step, _position=None) -> str:
    """A step tick as people read it: 250k, not 250000 running into its neighbour."""
    return f"{step / 1e6:g}M" if abs(step) >= 1e6 else f"{step / 1e3:g}k" if abs(step) >= 1e4 else f"{step:g}"


def draw(log, loss_ax, rate_ax, title=None, max_points: int = MAX_POINTS, lr_ax=None) -> None:
    """Draw (or redraw in place) a run's history: the training loss (raw, faint, and smoothed) with
    the held-out numbers, samples/s, and the learning rate on `lr_ax` when given. At most
    `max_points` points a line, so a redraw costs the same however long the run."""
    from matplotlib.ticker import MaxNLocator, NullFormatter, StrMethodFormatter
    thousands = StrMethodFormatter("{x:,.0f}")  # 8,554 as the tables write it, not 8.55e+03
    panels = [ax for ax in (loss_ax, rate_ax, lr_ax) if ax is not None]
    for ax in panels:
        ax.clear()
    twin = loss_ax.get_shared_x_axes().joined(loss_ax, rate_ax)  # samples/s on the loss panel's right side
    _draw_loss(log, loss_ax, title, max_points, crowded=twin)
    steps, rates = throughput_series(log, max_points)
    rate_ax.plot(steps, rates, color="tab:orange", lw=1.2, marker="o" if len(steps) < 200 else None, ms=2,
                 alpha=0.55, label="each log window")
    _draw_steady(log, rate_ax, max_points)
    rate_ax.set_ylabel("samples/s")
    positive = [r for r in rates if r > 0]
    # Windows 20x apart (a fast start, then slow steps): on a log scale both show, and the steady line is not
    # flattened against the bottom under points that tower over it.
    rate_ax.set_yscale("log" if positive and max(positive) > 20 * min(positive) else "linear")
    rate_ax.yaxis.set_major_formatter(thousands)
    rate_ax.yaxis.set_minor_formatter(NullFormatter())
    if twin:
        rate_ax.yaxis.set_label_position("right")  # clear() put it back on the left, over the loss's
    if lr_ax is not None and not _lr_panel(log, rate_ax, lr_ax):
        panels.remove(lr_ax)
        lr_ax = None
    elif lr_ax is not None:
        _draw_lr(log, lr_ax, max_points)
    stacked = lr_ax is not None and lr_ax.get_shared_x_axes().joined(rate_ax, lr_ax)  # one step axis, below
    for ax in panels:
        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))  # steps are whole: no step 2.5
        ax.xaxis.set_major_formatter(_step_text)
        if ax is rate_ax and stacked:
            ax.tick_params(labelbottom=False)
        else:  # (samples/s alone, once the learning rate's panel went: its steps shown again)
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("optimizer step", fontsize=8 if ax is lr_ax else None)
    for event in log.of_type("change"):
        label = ", ".join(f"{k} {v[0]}→{v[1]}" for k, v in event["changes"].items())
        for ax in panels:
            ax.axvline(event["step"], color="grey", ls="--", lw=0.8)
        loss_ax.annotate(label, (event["step"], 1), xycoords=("data", "axes fraction"),
                         fontsize=7, rotation=90, va="top", ha="right", color="grey")


def steady_of(log) -> SteadyRate:
    """The run's steady rate as its summary states it: the summary's own, once the run has ended;
    while it runs, measure.steady's one estimate of the steps so far (the same function the summary uses)."""
    end = log.last("end")
    known = Summary.from_dict(end["summary"]).steady if end is not None else None
    if known is not None:
        return known
    return of_columns(log.read("time", "samples"), samples_start(log))


def _draw_steady(log, rate_ax, max_points: int = MAX_POINTS) -> None:
    """The steady rate as a line over the steps after the warm-up, its 95% interval as a band around it: the
    number the summary reports, on the panel whose window rates swing around it. That rate is all samples after
    the warm-up over all their seconds, so a slow window weighs as long as it took and many short fast ones
    little: the same ratio up to each window's end is drawn too (dashed), ending on the line, so points far
    above it read as short windows, not as a wrong line."""
    steady = steady_of(log)
    cols = log.read("step", "time", "samples")
    steps = cols["step"]
    if not np.isfinite(steady.rate) or steady.warmup_steps >= len(steps):
        return
    span = [steps[steady.warmup_steps], steps[-1]]
    if np.isfinite(steady.low) and np.isfinite(steady.high):
        rate_ax.fill_between(span, steady.low, steady.high, color="tab:red", alpha=0.18, lw=0)
    rate_ax.hlines(steady.rate, *span, color="tab:red", lw=1.6,
                   label="steady " + steady.text("").split(";")[0])
    running_steps, running = running_rate(log, steady.warmup_steps, cols, max_points)
    rate_ax.plot(running_steps, running, color="tab:red", lw=0.9, ls="--", label="steady so far")
    # above the panel, as the loss panel's: inside, it hid the window rates it sits over
    rate_ax.legend(fontsize=6.5, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False,
                   handlelength=1.5, borderaxespad=0.2)


def running_rate(log, warmup_steps: int, cols=None, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """(step, samples / seconds from the warm-up's end to that step): the steady rate of the steps so far,
    time-weighted as the summary's is, at the end of each drawn window after the warm-up."""
    cols = cols or log.read("step", "time", "samples")
    rows = len(cols["step"])
    step, t, s = (_numbers(cols[name]) for name in ("step", "time", "samples"))
    t0, s0 = (t[warmup_steps - 1], s[warmup_steps - 1]) if warmup_steps else (0.0, samples_start(log))
    ends = np.append(_bucket_starts(rows, _every(log, rows, max_points))[1:] - 1, rows - 1)
    ends = ends[(ends >= warmup_steps) & (t[ends] > t0)]  # (a requeued run's clock starts again: no rate across)
    return step[ends].tolist(), ((s[ends] - s0) / (t[ends] - t0)).tolist()


def history_axes(figure):
    """The history's panels on `figure`: the loss on the left; samples/s above a short learning-rate
    panel on the right, sharing their step axis."""
    grid = figure.add_gridspec(2, 2, width_ratios=(1.3, 1), height_ratios=(1.6, 1))
    loss_ax = figure.add_subplot(grid[:, 0])
    rate_ax = figure.add_subplot(grid[0, 1])
    lr_ax = figure.add_subplot(grid[1, 1], sharex=rate_ax)
    return loss_ax, rate_ax, lr_ax


def live_frame(figures: dict, log, figsize, dpi: int, title=None) -> bytes:
    """A live-plot frame of `log` as PNG bytes. The figure for each size is made once and kept in
    `figures`: making one is costly, and the live plot draws many frames."""
    import io
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    key = (tuple(figsize), dpi)
    if key not in figures:
        # A layout engine keeps the twin and stacked axes' labels apart; it is most of a frame's cost,
        # which the live plot pays in its drawing process, not in the training kernel.
        figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        FigureCanvasAgg(figure)
        figures[key] = (figure, history_axes(figure))
    figure, axes = figures[key]
    draw(log, *axes[:2], title=title, lr_ax=axes[2])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def plot_history(log, path=None, ax=None, title=None):
    if ax is None:
        fig = new_figure(path, figsize=(9, 3.4))
        loss_ax, rate_ax, lr_ax = history_axes(fig)
    else:  # one axis given: the loss on it, samples/s on a twin axis, no room for the learning rate
        loss_ax, fig, lr_ax = ax, ax.figure, None
        rate_ax = ax.twinx()
    draw(log, loss_ax, rate_ax, title, lr_ax=lr_ax)
    saved(fig, path)
    return fig


def bar_plot(labels, values, title, xlabel, path=None, ax=None, highlight=None):
    """Horizontal bars, one per label, the chosen one (`highlight`) in green: every tool's table as a figure."""
    with axes(path, ax, figsize=(7, 0.45 * len(labels) + 1.2)) as ax:
        colors = ["tab:green" if i == highlight else "tab:blue" for i in range(len(labels))]
        ax.barh(range(len(labels)), values, color=colors)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=9, loc="left")
    return ax.figure
