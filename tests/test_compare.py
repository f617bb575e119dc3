"""nbtrain.runs.compare: runs side by side, from results or from the run store, without Jupyter."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import nbtrain
from nbtrain import TrainConfig
from nbtrain.runs.compare import smoothed, time_to_loss
from nbtrain.demo import DigitsDataset, digits_recipe
from nbtrain.format import number
from nbtrain.runs.store import RunStore, StoreError

from helpers import regression_data


@pytest.fixture(scope="module")
def runs():
    # 5 steps: fewer than 6 steady steps make one block, so no interval whatever the warm-up found
    # (with 8, a 2-step warm-up left 6 steady steps: 3 blocks of 2, enough for an interval).
    small = nbtrain.fit(recipe=digits_recipe(), name="b16",
                        config=TrainConfig(max_steps=5, batch_size=16, log_every_n_steps=2, accelerator="cpu"))
    large = nbtrain.fit(recipe=digits_recipe(), name="b128",
                        config=TrainConfig(max_steps=5, batch_size=128, log_every_n_steps=2, accelerator="cpu"))
    return small, large


def test_smoothed_is_a_trailing_mean():
    assert smoothed([4.0, 2.0, 0.0, 2.0], 2) == [4.0, 3.0, 1.0, 1.0]


def test_compare_measures_each_run_against_the_first(runs, tmp_path):
    small, large = runs
    result = nbtrain.compare(small, large, path=tmp_path / "cmp.png")
    assert result.labels == ["b16", "b128"]
    assert [row["run"] for row in result.rows] == ["b16", "b128"]
    assert result.rows[0]["vs first"] == "-"
    assert result.rows[1]["vs first"].endswith("too few steps to tell")  # 5 steps give no interval
    assert result.rows[1]["changed from first"] == "batch_size=128"
    # By default the target is the lowest loss every run reached, so every run has a time.
    assert all(time_to_loss(r, result.target_loss) is not None for r in runs)
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    titles = [ax.get_title() for ax in result.figure.axes]
    assert titles == ["loss against time", f"time to loss {result.target_loss:.3g}", "throughput", "peak memory"]
    bundle = result._repr_mimebundle_()
    assert "b128" in bundle["text/plain"] and "data:image/png;base64," in bundle["text/html"]


def test_a_loss_never_reached_says_so(runs):
    result = nbtrain.compare(*runs, loss=1e-6)
    assert all(row["time to loss 1e-06"] == "not reached" for row in result.rows)


def test_compare_reads_runs_by_name_from_the_store(runs, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    for run in runs:
        store.record(run)
    result = nbtrain.compare("b16", "b128", store=store)
    assert [r.history["loss"] for r in result.runs] == [r.history["loss"] for r in runs]
    with pytest.raises(StoreError, match="no run named 'b64'.*stored runs: b128, b16"):
        nbtrain.compare("b16", "b64", store=store)
    with pytest.raises(TypeError, match="compare: got float; allowed: a RunResult, a run name or a run id"):
        nbtrain.compare(1.5, store=store)


@pytest.mark.slow
def test_compare_module_imports_no_jupyter():
    code = "import sys, nbtrain.runs.compare, nbtrain.runs.store; print(sorted(m for m in sys.modules if m.split('.')[0] in {'IPython', 'ipywidgets', 'ipykernel'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_vs_first_states_the_ratio_with_its_interval_or_no_measurable_difference():
    import re
    data = regression_data(n=2048)
    runs = []
    for batch in (8, 256):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        runs.append(nbtrain.fit(model, data, loss_fn=nn.MSELoss(), batch_size=batch, max_steps=120,
                                name=f"b{batch}"))
    cell = nbtrain.compare(*runs).rows[1]["vs first"]
    found = re.fullmatch(r"x([\d.]+) \(([\d.]+)-([\d.]+)\)|(?:no measurable difference|too noisy to tell) \(([\d.]+)-([\d.]+)\)", cell)
    assert found, cell
    if found.group(1):  # a measured difference: the interval holds the ratio and excludes 1
        ratio, low, high = map(float, found.group(1, 2, 3))
        assert low <= ratio <= high and not low <= 1 <= high
    else:
        low, high = map(float, found.group(4, 5))
        assert low <= 1.02 and high >= 0.98


def test_compare_rows_carry_each_runs_last_held_out_numbers(runs):
    result = nbtrain.compare(*runs)
    for row, run in zip(result.rows, runs):
        assert row["held-out"] == f"loss {number(run.summary['val_loss'])}, acc {100 * run.summary['val_acc']:.1f}%"
    labels = result.figure.axes[0].get_legend_handles_labels()[1]
    assert "b16 held-out" in labels  # the validation points on the loss-against-time panel


def test_no_held_out_column_when_no_run_validated():
    run = nbtrain.fit(nn.Linear(8, 1), regression_data(), loss_fn=nn.MSELoss(), max_steps=3)
    assert "held-out" not in nbtrain.compare(run).rows[0]


def _validated_run(steps=40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return nbtrain.fit(model, DigitsDataset(), val_data=DigitsDataset(train=False), loss_fn=nn.CrossEntropyLoss(),
                       metrics={"top1": lambda out, y: (out.argmax(1) == y).float().mean()}, lr=0.05, warmup_steps=5,
                       scheduler=lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, steps),
                       scheduler_interval="step", val_every_n_steps=10, max_steps=steps, batch_size=32, name="seen")


def test_the_run_plot_shows_smoothed_and_raw_loss_held_out_points_and_the_learning_rate(tmp_path):
    result = _validated_run()
    figure = result.plot(tmp_path / "run.png")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_label = {ax.get_ylabel(): ax for ax in figure.axes}
    assert set(by_label) == {"loss", "samples/s", "learning rate", "held-out metric"}
    loss_lines = {line.get_label(): line for line in by_label["loss"].get_lines()}
    assert loss_lines["training loss"].get_alpha() < 1 and "smoothed" in loss_lines  # raw faint, trend solid
    held = [e for e in result.log.of_type("epoch") if "val_loss" in e]
    assert list(loss_lines["held-out loss"].get_xdata()) == [e["step"] for e in held] == [10, 20, 30, 40]
    assert {line.get_label() for line in by_label["held-out metric"].get_lines()} == {"held-out acc", "held-out top1"}
    lr = by_label["learning rate"].get_lines()[0]
    assert list(lr.get_ydata()) == pytest.approx(list(result.history["lr"]))  # warm-up, then the cosine
    ticks = by_label["learning rate"].get_xticks()
    assert all(float(t).is_integer() for t in ticks)  # whole steps


def test_a_long_history_is_drawn_with_at_most_max_points_a_line():
    from matplotlib.figure import Figure

    from nbtrain import plotting
    from nbtrain.metrics import MetricsLog
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 100}, "info": {"samples_start": 0}})
    for first in range(1, 20_001, 100):
        steps = list(range(first, first + 100))
        log.emit({"type": "steps", "rows": {"step": steps, "samples": steps, "time": [s / 1e3 for s in steps],
                                            "loss": [1 / s for s in steps], "lr": [0.1] * 100}})
        log.emit({"type": "epoch", "epoch": 0, "step": first + 99, "partial": True, "val_loss": 1.0, "val_acc": 0.5})
    figure = Figure()
    plotting.draw(log, *plotting.history_axes(figure), max_points=50)
    assert all(len(line.get_xdata()) <= 50 for ax in figure.axes for line in ax.get_lines())
    held = {line.get_label(): line for ax in figure.axes for line in ax.get_lines()}["held-out loss"]
    assert held.get_xdata()[-1] == 20_000  # the latest validation is always drawn
