"""nbtrain.runs.compare: runs side by side, from results or from the run store, without Jupyter."""
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import nbtrain
from nbtrain import TrainConfig
from nbtrain.runs.apart import versus
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
    if cell.startswith("the machine was"):  # a speed verdict the machine's load could explain is withheld
        assert re.fullmatch(r"the machine was (busier|full) during b(8|256) \(other processes took [\d.]+ of \d+ "
                            r"cores.*\): the difference may be the machine's", cell), cell
        assert versus(*runs).measurable
        return
    if cell.startswith("too short to compare"):  # runs of a fraction of a second: a difference is withheld
        assert re.fullmatch(r"too short to compare \(b(8|256): [\d.]+ (ms|s) of steady steps\)", cell), cell
        assert versus(*runs).measurable
        return
    found = re.fullmatch(r"([\d.]+)x \(([\d.]+)-([\d.]+)\)†|(?:no measurable difference|too noisy to tell) \(([\d.]+)-([\d.]+)\)", cell)
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
        assert row["held-out"] == f"loss {number(run.summary.val_loss)}, acc {100 * run.summary.val_acc:.1f}%"
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


def _run_of(durations, batch=64, name=None):
    """A run whose steps took `durations` seconds (its summary made the way a real run's is)."""
    from nbtrain.metrics import MetricsLog
    from nbtrain.runs.result import RunResult, summarize
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 1}, "info": {"samples_start": 0}})
    times = np.cumsum(durations).tolist()
    steps = list(range(1, len(times) + 1))
    log.emit({"type": "steps", "rows": {"step": steps, "samples": [batch * s for s in steps], "time": times,
                                        "loss": [1.0] * len(steps), "lr": [0.1] * len(steps)}})
    return RunResult(TrainConfig(batch_size=batch), log, summarize(log, {}), name=name)


def _bursty_run(rng, rate, every, name):
    """A run at `rate` samples/s whose load came in bursts: 20 steps 3x slower every `every` steps."""
    durations = 64 / rate * (1 + 0.02 * rng.standard_normal(400))
    for start in range(0, 400, every):
        durations[start:start + 20] *= 3
    return _run_of(durations, name=name)


def test_vs_first_is_the_ratio_of_the_samples_per_s_shown_and_its_interval_holds_it():
    # The case: the second run's load came in bursts (a third of its blocks 3x slower), so the
    # median of its block rates (what the column divided before) sits far above its steady rate (the
    # samples/s shown beside it): 8,554 vs 5,524 on screen was called x0.80.
    rng = np.random.default_rng(0)
    first = _run_of(64 / 8554 * (1 + 0.02 * rng.standard_normal(400)), name="first")
    second = _bursty_run(rng, 8554, 60, "second")
    rows = nbtrain.compare(first, second).rows
    shown = [float(row["samples/s"].split(" ")[0].replace(",", "")) for row in rows]
    found = re.fullmatch(r"([\d.]+)x \(([\d.]+)-([\d.]+)\)†", rows[1]["vs first"])
    assert found, rows[1]["vs first"]
    ratio, low, high = map(float, found.groups())
    assert ratio == pytest.approx(shown[1] / shown[0], abs=0.006), (rows[0]["samples/s"], rows[1]["samples/s"], ratio)
    assert low <= ratio <= high
    # The verdict is the ratio of the two summaries' own rates, exactly.
    verdict = versus(first, second)
    assert verdict.ratio == pytest.approx(second.steady().rate / first.steady().rate, rel=1e-12)
    assert verdict.low <= verdict.ratio <= verdict.high and not verdict.paired


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_compare_figure_writes_numbers_as_the_tables_do_and_its_legend_covers_no_panel():
    rng = np.random.default_rng(1)
    runs = [_run_of(64 / rate * (1 + 0.02 * rng.standard_normal(60)), name=f"run {i}")
            for i, rate in enumerate((8554, 5524, 12000, 950, 20000))]
    figure = nbtrain.compare(*runs).figure
    loss_ax, _, rate_ax, mem_ax = figure.axes
    assert [t.get_text() for t in rate_ax.texts] == [number(r.summary.samples_per_s) for r in runs]
    assert all("e+" not in t.get_text() for ax in figure.axes for t in ax.texts)  # 8,554, never 8.55e+03
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    assert any("," in t.get_text() for t in rate_ax.get_yticklabels())  # the axis too: 10,000
    renderer = canvas.get_renderer()
    legends = [legend.get_window_extent(renderer) for legend in figure.legends]
    assert loss_ax.get_legend() is None and len(legends) == 1
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [f"run {i}" for i in range(5)]
    assert not any(_overlaps(legends[0], ax.get_window_extent(renderer)) for ax in figure.axes)


def test_a_ddp_runs_peak_memory_is_every_process_summed_and_says_so():
    # One rank's RSS beside the kernel's made two processes look like half the memory of one.
    config = dict(max_steps=4, batch_size=32, accelerator="cpu", log_every_n_steps=2)
    alone = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(**config), name="one")
    ddp = nbtrain.fit(recipe=digits_recipe(), config=TrainConfig(devices=2, **config), name="ddp")
    per_rank = ddp.summary.peak_mem_mb_per_rank
    assert len(per_rank) == 2 and all(mb > 0 for mb in per_rank)
    result = nbtrain.compare(alone, ddp)
    mem_ax = result.figure.axes[3]
    assert [bar.get_height() for bar in mem_ax.patches] == pytest.approx([alone.summary.peak_mem_mb, sum(per_rank)])
    assert mem_ax.texts[1].get_text() == f"{number(sum(per_rank))}\n2 processes" and "all processes" in mem_ax.get_title()
    assert result.rows[1]["peak memory"] == f"{number(sum(per_rank), ' MB')} in 2 processes"
    assert dict(ddp.rows())["peak memory"].startswith(f"{number(sum(per_rank), ' MB')} in 2 processes (process RSS)")
    from nbtrain.runs.table import Row, RunsTable  # the runs table reads the same summary
    assert RunsTable([Row(1, "ddp", "completed", ddp.config.to_dict(), ddp.summary)]).rows[0][-1] == \
        f"{number(sum(per_rank), ' MB')} in 2 processes"


def test_the_learning_rate_gets_a_panel_only_when_it_changes():
    constant = _run_of(np.full(30, 0.01))  # lr 0.1 at every step
    figure = constant.plot()
    panels = {ax.get_ylabel(): ax for ax in figure.axes if ax.get_visible()}
    assert set(panels) == {"loss", "samples/s"}
    rate = panels["samples/s"]
    assert rate.get_subplotspec().rowspan == range(0, 2)  # samples/s takes the column
    assert rate.get_xlabel() == "optimizer step"
    changing = _validated_run(steps=20)  # a warm-up, then the cosine
    shown = {ax.get_ylabel() for ax in changing.plot().axes if ax.get_visible()}
    assert "learning rate" in shown


def test_held_out_accuracy_is_drawn_in_percent_with_the_summarys_latest_figure():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    run = nbtrain.fit(model, DigitsDataset(), val_data=DigitsDataset(train=False), loss_fn=nn.CrossEntropyLoss(),
                      lr=0.05, val_every_n_steps=10, max_steps=20, batch_size=32)
    figure = run.plot()
    figure.canvas.draw()  # (pyplot's Agg canvas: the tick labels are made)
    metric = next(ax for ax in figure.axes if ax.get_ylabel() == "held-out accuracy")
    shown = dict(run.rows())["held-out loss / accuracy"].split(" / ")[1]  # '96.94%'
    assert [line.get_label() for line in metric.get_lines()] == [f"held-out accuracy, latest {shown}"]
    assert all(t.get_text().endswith("%") for t in metric.get_yticklabels() if t.get_text())
    assert metric.get_lines()[0].get_ydata()[-1] == pytest.approx(100 * run.summary.val_acc)


def test_a_noisy_rate_is_a_mark_in_its_cell_and_a_footnote_below_the_table():
    # The words "spread 122% between blocks: too noisy to trust" in each cell wrapped it into three lines.
    rng = np.random.default_rng(1)
    steady = _run_of(64 / 8000 * (1 + 0.01 * rng.standard_normal(400)), name="steady")
    noisy = _bursty_run(rng, 8000, 40, "noisy")
    result = nbtrain.compare(steady, noisy)
    cells = [row["samples/s"] for row in result.rows]
    assert not steady.steady().wide and noisy.steady().wide
    assert not cells[0].endswith("*") and cells[1].endswith(")*") and "noisy" not in cells[1], cells
    assert all(len(cell) <= 24 for cell in cells), cells  # a number and its interval: one line
    spread = f"noisy {100 * noisy.steady().spread:.0f}%"
    footnote = next(line for line in result.table().splitlines() if line.startswith("*"))
    assert footnote.startswith("* too noisy to trust") and spread in footnote and "steady" not in footnote
    assert footnote in result.html_table()


def test_runs_too_short_to_read_the_load_beside_them_get_no_speed_verdict_and_longer_ones_do():
    # Identical runs of 30 ms read 1.35x apart with tight intervals beside a bursty load: each fits in one
    # burst or one lull, and the load is read every 0.2 s. Under a second of steady steps, no verdict.
    rng = np.random.default_rng(0)
    noise = lambda n: 1 + 0.01 * rng.standard_normal(n)  # noqa: E731
    short = [_run_of(0.001 * noise(30), name="a"), _run_of(0.00135 * noise(30), name="b")]
    assert versus(*short).measurable  # the two intervals alone would call it
    comparison = nbtrain.compare(*short)
    cell = comparison.rows[1]["vs first"]
    assert re.fullmatch(r"too short to compare \(a: [\d.]+ ms of steady steps\)", cell), cell
    assert comparison.notes[-1] == ("too short to compare: runs taken at different times need 1 s of steady steps "
                                    "each, for the machine's load to be read beside them (every 0.2 s); run more "
                                    "steps, or nbtrain.ab, which alternates the two")
    long = [_run_of(0.01 * noise(300), name="a"), _run_of(0.0135 * noise(300), name="b")]  # 3 and 4 s
    cell = nbtrain.compare(*long).rows[1]["vs first"]
    assert re.fullmatch(r"0\.7\dx \(0\.7\d-0\.7\d\)†", cell), cell
    # where the runs are alike, the words say so whatever their length
    same = [_run_of(0.001 * noise(30), name="a"), _run_of(0.001 * noise(30), name="b")]
    assert nbtrain.compare(*same).rows[1]["vs first"].startswith("no measurable difference")


def _settings_run(durations, name, workload="w1", batch=64):
    """A run of `durations` whose workload digest is `workload` (two equal: the same code and data)."""
    run = _run_of(durations, batch=batch, name=name)
    return run.__class__(run.config, run.log, run.summary.replace(workload=workload), run.status, name=name)


def test_a_difference_within_how_far_repeats_of_one_settings_read_apart_is_the_machines():
    # Identical runs of a small CNN read 0.81x-1.21x apart on a quiet 2-core VM, each interval narrow: their
    # intervals cannot see how far the machine moves between runs; repeats of one settings can.
    rng = np.random.default_rng(2)
    steps = lambda seconds: seconds * (1 + 0.01 * rng.standard_normal(300))  # noqa: E731  (3 s runs)
    a, b = _settings_run(steps(0.010), "a"), _settings_run(steps(0.0115), "b", workload="w2")
    alone = nbtrain.compare(a, b)  # nothing repeated: the verdict, marked, and the footnote says why
    assert re.fullmatch(r"0\.8\dx \(0\.8\d-0\.8\d\)†", alone.rows[1]["vs first"]), alone.rows
    assert any(note.startswith("† no run of either's settings was repeated here") for note in alone.notes)
    # a's settings run again, 1.2x faster: b's 1.15x slower is within how far a's own runs read apart
    again = _settings_run(steps(0.010 / 1.2), "a again")
    assert nbtrain.compare(a, b, again).rows[1]["vs first"] == \
        "within the machine's own spread (2 runs of one's settings read up to 1.20x apart)"
    # ... and a difference beyond that spread keeps its verdict, unmarked: the spread is known
    slow = _settings_run(steps(0.020), "slow", workload="w3")
    cell = nbtrain.compare(a, slow, again).rows[1]["vs first"]
    assert re.fullmatch(r"0\.\d\dx \(0\.\d\d-0\.\d\d\)", cell), cell


def test_repeats_in_the_store_count_and_a_run_loaded_from_it_is_not_counted_twice(tmp_path):
    from nbtrain.runs.repeats import evidence, spread
    from nbtrain.runs.store import RunStore
    store = RunStore(tmp_path / "runs.sqlite")
    rng = np.random.default_rng(3)
    steps = lambda seconds: seconds * (1 + 0.01 * rng.standard_normal(300))  # noqa: E731
    a, b = _settings_run(steps(0.010), "a"), _settings_run(steps(0.0115), "b", workload="w2")
    for run in (a, b):
        store.record(run)
    loaded = store.load("a")
    assert spread(loaded, evidence([loaded, store.load("b")], store)) is None  # a itself, once: no repeat
    store.record(_settings_run(steps(0.010 / 1.2), "a again"))
    assert spread(loaded, evidence([loaded], store)).runs == 2
    cell = nbtrain.compare("a", "b", store=store).rows[1]["vs first"]
    assert cell.startswith("within the machine's own spread (2 runs"), cell


def test_a_repeat_beside_a_load_says_nothing_of_how_far_a_quiet_machine_moves_a_run():
    from nbtrain.measure.load import Load
    rng = np.random.default_rng(4)
    steps = lambda seconds: seconds * (1 + 0.01 * rng.standard_normal(300))  # noqa: E731
    a, b = _settings_run(steps(0.010), "a"), _settings_run(steps(0.0115), "b", workload="w2")
    loaded = _settings_run(steps(0.010 * 1.5), "a beside a load")
    busy = Load(1.0, 2, 4.5, own_cores=1.0, waited_cores=0.9)
    loaded = loaded.__class__(loaded.config, loaded.log, loaded.summary.replace(load=busy), name="a beside a load")
    cell = nbtrain.compare(a, b, loaded).rows[1]["vs first"]
    assert re.fullmatch(r"0\.8\dx \(0\.8\d-0\.8\d\)†", cell), cell  # no quiet repeat: still unknown
