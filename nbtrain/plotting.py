"""Loss and throughput against step, from a MetricsLog; config changes marked; and the figure
handling every result's plot method shares."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def axes(path=None, ax=None, figsize=(6, 3.2)):
    """An axis to draw on — `ax`, or one on a new figure — whose figure is saved to `path` on exit.

    A figure drawn for a file is closed after saving, so scripts and notebooks do not pile them up.
    """
    import matplotlib
    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    yield ax
    if path is not None:
        ax.figure.savefig(path, dpi=100)
        plt.close(ax.figure)


def throughput_series(log) -> tuple[list, list]:
    """(step, samples/s) at the end of each log window, measured over that window."""
    start = log.last("start")
    prev_samples = start["info"].get("samples_start", 0) if start else 0
    prev_time = 0.0
    steps, rates = [], []
    for event in log.of_type("steps"):
        rows = event["rows"]
        if not rows["step"]:
            continue
        t, s = rows["time"][-1], rows["samples"][-1]
        if t > prev_time:
            steps.append(rows["step"][-1])
            rates.append((s - prev_samples) / (t - prev_time))
        prev_time, prev_samples = t, s
    return steps, rates


def draw(log, loss_ax, rate_ax, title=None) -> None:
    """Draw (or redraw in place) the two panels of a run's history."""
    cols = log.columns
    loss_ax.clear()
    rate_ax.clear()
    loss_ax.plot(cols["step"], cols["loss"], color="tab:blue", lw=1.2)
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("training loss")
    steps, rates = throughput_series(log)
    rate_ax.plot(steps, rates, color="tab:orange", lw=1.2, marker="o", ms=2)
    rate_ax.set_xlabel("optimizer step")
    rate_ax.set_ylabel("samples/s")
    for event in log.of_type("change"):
        label = ", ".join(f"{k} {v[0]}→{v[1]}" for k, v in event["changes"].items())
        for ax in (loss_ax, rate_ax):
            ax.axvline(event["step"], color="grey", ls="--", lw=0.8)
        loss_ax.annotate(label, (event["step"], 1), xycoords=("data", "axes fraction"),
                         fontsize=7, rotation=90, va="top", ha="right", color="grey")
    if title:
        loss_ax.set_title(title)


def plot_history(log, path=None, ax=None, title=None):
    import matplotlib
    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    if ax is None:
        fig, (loss_ax, rate_ax) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    else:
        loss_ax, fig = ax, ax.figure
        rate_ax = ax.twinx()
    draw(log, loss_ax, rate_ax, title)
    if path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig
