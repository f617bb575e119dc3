"""Loss and throughput against step, from a MetricsLog; config changes marked; and the figure
handling every result's plot method shares.

A long run is decimated for drawing (means over spans of steps), so the live plot's redraw
costs the same at step 1,000 and step 1,000,000."""
from __future__ import annotations

import contextlib
from array import array

import numpy as np

MAX_POINTS = 1000  # points a line draws: enough for any figure's width


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
    start = log.last("start")
    ends = np.append(_bucket_starts(rows, _every(log, rows, max_points))[1:] - 1, rows - 1)
    steps, t, s = (_numbers(cols[name])[ends] for name in ("step", "time", "samples"))
    t0 = np.append(0.0, t[:-1])
    s0 = np.append(start["info"].get("samples_start", 0) if start else 0, s[:-1])
    ok = t > t0  # (a requeued run's clock starts again: no rate across that)
    return steps[ok].tolist(), ((s - s0)[ok] / (t - t0)[ok]).tolist()


def loss_series(log, max_points: int = MAX_POINTS) -> tuple[list, list, int]:
    """(step, loss) drawn: every step, or the mean of each span of steps when there are more than
    `max_points`; and the steps per point."""
    cols = log.read("step", "loss")
    rows = len(cols["step"])
    steps, loss = _numbers(cols["step"]), _numbers(cols["loss"])
    if rows <= max_points:
        return steps.tolist(), loss.tolist(), 1
    every = -(-rows // max_points)
    starts = _bucket_starts(rows, every)
    means = np.add.reduceat(loss, starts) / np.diff(np.append(starts, rows))
    return steps[np.append(starts[1:] - 1, rows - 1)].tolist(), means.tolist(), every


def draw(log, loss_ax, rate_ax, title=None, max_points: int = MAX_POINTS) -> None:
    """Draw (or redraw in place) the two panels of a run's history; at most `max_points` points a
    line, so a redraw costs the same however long the run."""
    loss_ax.clear()
    rate_ax.clear()
    steps, loss, every = loss_series(log, max_points)
    loss_ax.plot(steps, loss, color="tab:blue", lw=1.2)
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("training loss" + (f" (mean of {every} steps)" if every > 1 else ""))
    steps, rates = throughput_series(log, max_points)
    rate_ax.plot(steps, rates, color="tab:orange", lw=1.2, marker="o" if len(steps) < 200 else None, ms=2)
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
