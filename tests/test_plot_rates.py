"""The samples/s panel draws what its steady line means: all samples after the warm-up over all their
seconds, so its points (one per log window, unweighted) and its line agree on a run that starts fast and
ends slow (issue 53.5: the line sat under almost all points and read as wrong)."""
import matplotlib
import pytest

matplotlib.use("Agg")

from nbtrain.metrics import MetricsLog  # noqa: E402
from nbtrain.plotting import draw, history_axes, steady_of, throughput_series  # noqa: E402


def fast_then_slow(fast_steps: int = 150, steps: int = 400) -> MetricsLog:
    """32-sample steps at 60,000 samples/s, then at 400 samples/s: the demo's shape."""
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 10}, "info": {}})
    t = 0.0
    for start in range(0, steps, 10):
        rows = {name: [] for name in ("step", "samples", "time", "loss", "lr")}
        for step in range(start, start + 10):
            t += 32 / (60_000 if step < fast_steps else 400)
            for name, value in zip(rows, (step, 32 * (step + 1), t, 1 / (step + 1), 1e-3)):
                rows[name].append(value)
        log.emit({"type": "steps", "rows": rows})
    return log


def test_the_samples_panel_draws_the_time_weighted_rate_that_ends_on_its_steady_line():
    from matplotlib.figure import Figure
    log = fast_then_slow()
    loss_ax, rate_ax, lr_ax = history_axes(Figure(figsize=(9, 3.4)))
    draw(log, loss_ax, rate_ax, lr_ax=lr_ax)
    steady = steady_of(log)
    _, windows = throughput_series(log)
    assert sorted(windows)[len(windows) // 2] < steady.rate < max(windows) / 10  # what the issue saw
    (running,) = [line for line in rate_ax.get_lines() if line.get_linestyle() == "--"]
    ys = running.get_ydata()
    assert ys[-1] == pytest.approx(steady.rate)  # the same ratio, so far: it ends on the line
    assert ys[0] > 10 * steady.rate and all(a >= b * (1 - 1e-9) for a, b in zip(ys, ys[1:]))  # high while fast, then falling
    assert "so far" in running.get_label()
    assert rate_ax.get_yscale() == "log"  # windows 150x apart: both show, the line off the floor
