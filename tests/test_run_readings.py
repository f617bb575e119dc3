"""A run's numbers say one thing everywhere and account for themselves: the samples/s panel draws the
summary's steady rate and interval; the summary splits the call's whole wall time into parts that sum to
it; every reading records how much of the machine other processes took, and a comparison whose
difference that load could explain gives no speed verdict."""
import math
import os
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import torch
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from torch import nn

import nbtrain
from nbtrain.demo import DigitsDataset, digits_recipe
from nbtrain.measure.load import Load, Meter, descendants, windows
from nbtrain.measure.withheld import explains, explains_by_windows
from nbtrain.runs.store import RunStore
from nbtrain import plotting
from nbtrain.plotting import draw, history_axes
from nbtrain.recipe import Recipe
from nbtrain.runs.compare import compare


@pytest.fixture(scope="module")
def validated_run():
    """A run that validates and checkpoints, with its call's wall time measured from outside."""
    recipe = digits_recipe()
    cross_entropy = recipe.loss_fn

    def slow_loss(output, target):  # 40 steps of at least 10 ms: longer than two of the load's windows (WINDOW_S)
        time.sleep(0.01)
        return cross_entropy(output, target)

    recipe.loss_fn = slow_loss
    started = time.perf_counter()
    result = nbtrain.fit(recipe=recipe, max_steps=40, accelerator="cpu", val_every_n_steps=15, checkpoint_every=20,
                         checkpoint_dir=tempfile.mkdtemp(), log_every_n_steps=5)
    return result, time.perf_counter() - started


def test_the_samples_per_s_panel_draws_the_summarys_steady_rate_and_interval(validated_run):
    result, _ = validated_run
    figure = Figure()
    loss_ax, rate_ax, lr_ax = history_axes(figure)
    draw(result.log, loss_ax, rate_ax, lr_ax=lr_ax)
    steady = result.steady()
    lines = [c for c in rate_ax.collections if isinstance(c, LineCollection)]
    assert [seg[0][1] for c in lines for seg in c.get_segments()] == [pytest.approx(steady.rate)]
    bands = [c for c in rate_ax.collections if isinstance(c, PolyCollection)]
    (band,) = bands
    ys = band.get_paths()[0].vertices[:, 1]
    assert (ys.min(), ys.max()) == (pytest.approx(steady.low), pytest.approx(steady.high))
    assert steady.text("").split(";")[0] in " ".join(t.get_text() for t in rate_ax.get_legend().get_texts())


def test_a_live_frame_measures_the_steps_so_far_as_the_summary_does(validated_run):
    """Before the run's end, the panel's rate is measure.steady's estimate of the steps so far, the same
    function the summary calls: the finished log gives the summary's own."""
    result, _ = validated_run
    live = nbtrain.MetricsLog()
    for event in result.log.events:
        if event["type"] != "end":
            live.emit(event)
    assert plotting.steady_of(live) == result.steady() == plotting.steady_of(result.log)


def test_the_summary_splits_the_calls_whole_wall_time(validated_run):
    result, wall = validated_run
    split, s = result.summary.time_split, result.summary
    assert list(split) == ["start-up", "warm-up", "training", "validation", "checkpointing", "other"]
    assert all(v >= 0 for v in split.values()), split
    assert split["validation"] > 0 and split["checkpointing"] > 0  # it validated twice and saved twice
    assert split["warm-up"] + split["training"] == pytest.approx(s.train_time_s)
    assert sum(split.values()) == pytest.approx(s.call_s)
    # the parts sum to the call's wall time as measured from outside, and "other" holds little of it
    assert abs(sum(split.values()) - wall) < max(0.05 * wall, 0.1), (split, wall)
    assert split["other"] < 0.1 * wall, split
    row = dict(result.rows())["where the time went"]
    assert row.startswith(f"{nbtrain.format.duration(s.call_s)} in the call: start-up") and "validation" in row


def test_a_runs_log_carries_the_machines_load_block_by_block_and_keeps_it_when_stored(validated_run, tmp_path):
    result, _ = validated_run
    blocks = windows(result.history)
    assert blocks and blocks[0].first == 0 and all(a.end == b.first for a, b in zip(blocks, blocks[1:]))
    assert blocks[-1].end <= len(result.log) and all(0 <= b.load.other_cores <= b.load.cores for b in blocks)
    assert all(b.load.own_cores >= 0 and b.load.wall_s > 0 for b in blocks)
    store = RunStore(tmp_path / "runs.sqlite")
    stored = store.load(store.record(result, name="stored"))
    assert windows(stored.history) == blocks


def _burn(seconds: float, own: bool, report: str):
    """A CPU-bound Python process spinning for `seconds`, writing the CPU time it got to `report`: our child
    (`own`), or another process's (started through a parent that exits at once, so it is no descendant)."""
    spin = (f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
            f"open({report!r}, 'w').write(str(time.process_time()))\n")
    if own:
        return psutil.Process(subprocess.Popen([sys.executable, "-c", spin]).pid)
    return _another(spin)


def _another(code: str) -> psutil.Process:
    """`python -c code` started by a parent that exits at once: a process of the machine's, not ours."""
    launcher = ("import subprocess, sys\n"
                f"print(subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True,"
                " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    return psutil.Process(int(subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True,
                                             check=True).stdout))


@pytest.mark.parametrize("own", [True, False], ids=["our child", "another process"])
def test_a_reading_counts_another_processes_cpu_as_others_and_its_own_childrens_as_its_own(own, tmp_path):
    report = tmp_path / "cpu"
    with Meter() as meter:
        burner = _burn(1.0, own, str(report))
        burner.wait(10) if own else psutil.wait_procs([burner], timeout=10)
    load, burned = meter.last, float(report.read_text())
    assert load.cores == psutil.cpu_count() and load.wall_s > 1.0 and burned > 0.1
    # the CPU the spinning process got lands on its owner's side (others' side also holds the machine's
    # other users: at least the burner's)
    assert (load.own_cores if own else load.other_cores) * load.wall_s > 0.9 * burned, (load, burned)
    assert ("other processes took" in load.beside()) == (not load.small)


def test_the_processes_below_are_found_without_a_look_at_every_process_where_there_is_no_child():
    """A reading looks for the processes below it (its own side of the CPU time); a process with no child
    skips psutil's look at every process on the machine, and one with a child still finds it, grandchild too."""
    read, write = os.pipe()
    forked = os.fork()
    if forked == 0:  # a process with no child: psutil's look would fail, so it must not be taken
        psutil.Process.children = None
        os.write(write, repr(descendants(psutil.Process())).encode())
        os._exit(0)
    os.close(write)
    assert os.read(read, 100) == b"[]" and os.waitpid(forked, 0)[1] == 0
    os.close(read)
    child = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"])
    try:
        deadline = time.time() + 10
        while not psutil.Process(child.pid).children() and time.time() < deadline:
            time.sleep(0.02)
        grandchildren = {p.pid for p in psutil.Process(child.pid).children()}
        assert grandchildren and {child.pid} | grandchildren <= {p.pid for p in descendants(psutil.Process())}
    finally:
        for p in psutil.Process(child.pid).children() + [psutil.Process(child.pid)]:
            p.kill()
        child.wait()


@pytest.mark.parametrize("other_busy, other_own, slowdown, explained", [
    (0.9, 1.8, 1.3, True),    # 0.9 of 2 cores taken from a run wanting 1.8: 0.9 of what it wants against 1.8
    (0.9, 1.8, 2.5, False),   # ... cannot explain a 2.5x slowdown
    (0.9, 0.3, 1.3, False),   # a run wanting 0.3 of a core still had it
    (0.02, 1.8, 1.3, False),  # a quiet machine both times
])
def test_a_load_explains_a_slowdown_only_within_the_cores_it_took(other_busy, other_own, slowdown, explained):
    quiet, busy = Load(0.05, 2, 5.0, own_cores=other_own), Load(other_busy, 2, 5.0, own_cores=other_own / 2)
    assert explains(busy, quiet, slowdown) == explained
    assert not explains(quiet, busy, slowdown)  # the quieter run being slower is no load's doing


def test_a_run_whose_threads_waited_for_a_cpu_may_owe_any_slowdown_to_the_machine():
    """On a full machine two identical runs under the same measured load differed up to 4x (threads that wait
    on each other for a CPU): a run whose threads waited a second a second says so, whatever the other's load."""
    full, quiet = Load(1.6, 2, 5.0, own_cores=0.4, waited_cores=1.6), Load(1.6, 2, 5.0, own_cores=0.4, waited_cores=0.0)
    assert explains(full, full, 4.0) and explains(full, quiet, 4.0) and not explains(quiet, quiet, 1.3)
    assert "waited 1.6 s a second for a free CPU" in full.beside() and quiet.beside() != ""


def test_a_burst_over_a_few_blocks_explains_a_slowdown_the_whole_runs_mean_load_does_not():
    """Two blocks of ten beside a burst that took a core from a run wanting 1.8: the run's mean load (0.24
    cores, 1.7 left) explains no 1.15x slowdown, its blocks do (1.0 left against 1.8)."""
    quiet = [Load(0.05, 2, 0.3, own_cores=1.8)] * 10
    burst = quiet[:8] + [Load(1.0, 2, 0.3, own_cores=1.0)] * 2
    whole = Load(0.24, 2, 3.0, own_cores=1.64)
    assert not explains(whole, Load(0.05, 2, 3.0, own_cores=1.8), 1.15)
    assert explains_by_windows(burst, quiet, 1.15, wants=1.8) and not explains_by_windows(quiet, burst, 1.15, 1.8)
    # a run wanting a tenth of a core: a full machine's blocks leave it what it used, within the ticks
    sleeper = [Load(1.95, 2, 0.3, own_cores=0.05)] * 10
    assert not explains_by_windows(sleeper, [Load(0.3, 2, 0.3, own_cores=0.1)], 1.2, wants=0.1)


def test_a_runs_waits_for_a_cpu_explain_as_much_time_as_it_could_have_trained_no_more():
    """Blocks whose threads waited 0.1 s a second: up to 1/0.9 = 1.11x; a whole second a second: anything."""
    waited = [Load(0.2, 2, 0.3, own_cores=0.1, waited_cores=0.1)] * 10
    quiet = [Load(0.2, 2, 0.3, own_cores=0.1, waited_cores=0.0)] * 10
    assert explains_by_windows(waited, quiet, 1.1, 0.1) and not explains_by_windows(waited, quiet, 1.3, 0.1)
    full = [Load(1.0, 2, 0.3, own_cores=1.0, waited_cores=1.2)] * 10  # several threads waiting at once
    assert explains_by_windows(full, quiet, 5.0, 0.1)
    assert not explains_by_windows(quiet, waited, 1.05, 0.1)


class Sleeper(nn.Module):
    """A tiny model whose step waits `wait_s` (as on a slow disk): a rate set by the workload, not the CPU."""

    def __init__(self, wait_s: float):
        super().__init__()
        self.wait_s, self.net = wait_s, nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        time.sleep(self.wait_s)
        return self.net(x)


def _pair(make, name: str, store) -> tuple:
    runs = []
    for side, recipe in zip("ab", make()):
        runs.append(nbtrain.fit(recipe=recipe, max_steps=25, batch_size=32, accelerator="cpu", log_every_n_steps=5,
                                name=f"{name}_{side}"))
    return runs


def _speed_verdict(verdict: str) -> bool:
    return "faster" in verdict or "slower" in verdict or "x (" in verdict


def _verdict(runs) -> str:
    return compare(*runs).rows[1]["vs first"]


@pytest.mark.slow
def test_a_real_difference_between_two_runs_still_gets_its_speed_verdict():
    # The other half of issue 39's rule, eight identical pairs beside a bursty load with no speed verdict, is
    # not held here: on a quiet clean clone one pair in eight still read 1.32x (1.18-1.50). It is a rate over
    # repeated runs, a benchmark's target, not an assertion one run can keep.
    def slower_b():  # B's step waits 1.3x as long as A's (as on a slower disk): a difference of the workload
        data = DigitsDataset(train=True)
        return [Recipe(model=Sleeper(wait_s), train_data=data, loss_fn=nn.CrossEntropyLoss(),
                       optimizer=lambda p: torch.optim.SGD(p, lr=0.01)) for wait_s in (0.100, 0.130)]
    threads = torch.get_num_threads()
    # One thread that mostly sleeps: it waits for a CPU only as it wakes, a few ms a step on a full machine,
    # which explains a few percent of its rate (a 40 ms step woke so often that it waited a fifth of the time).
    torch.set_num_threads(1)
    try:
        real = [_verdict(_pair(slower_b, f"ab{i}", None)) for i in range(2)]
    finally:
        torch.set_num_threads(threads)
    for v in real:  # a speed verdict, the run's own 1.3x, not the machine's
        assert "machine" not in v and _speed_verdict(v), real
        assert 1 / 1.45 < float(v.split("x")[0]) < 1 / 1.15, real


def test_an_ab_verdict_line_says_how_busy_the_machine_was_beside_it(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    burner = _burn(10.0, own=False, report=str(tmp_path / "cpu"))  # another process, spinning throughout
    try:
        result = nbtrain.ab(model, DigitsDataset(), loss_fn=nn.CrossEntropyLoss(), a={"batch_size": 16},
                            b={"batch_size": 32}, block_steps=4, min_pairs=2, max_pairs=2, budget_s=5,
                            learn_s=0)  # the blocks' load is the point, not what each batch learns
    finally:
        burner.kill()
        psutil.wait_procs([burner], timeout=10)
    assert isinstance(result.load, Load) and result.load.wall_s == pytest.approx(result.seconds, rel=0.2, abs=0.05)
    assert not result.load.small and result.text().endswith(result.load.beside() + "]")
    assert "other processes took" in result.text()


def test_an_ab_pair_whose_slower_block_ran_beside_a_burst_is_set_aside_and_the_line_says_so():
    from nbtrain.config import TrainConfig
    from nbtrain.measure.ab import ABResult
    from nbtrain.measure.verdict import UNMEASURED
    quiet, burst = Load(0.05, 2, 0.25, own_cores=1.8), Load(1.0, 2, 0.25, own_cores=1.0)
    result = ABResult(TrainConfig(), TrainConfig(batch_size=64), UNMEASURED, rates_a=[100, 101, 99, 100],
                      rates_b=[120, 121, 119, 60], loads_a=[quiet] * 4, loads_b=[quiet] * 3 + [burst])
    assert result.comparable() == [True, True, True, False]
    result.verdict = result.judged()
    assert result.verdict.pairs == 3 and result.verdict.ratio == pytest.approx(1.2, rel=0.01) and result.verdict.faster
    assert "1 of 4 pairs set aside: other processes took more of the machine" in result.text()
    # a pair whose blocks ran under alike loads stays, however far apart its rates
    assert ABResult(TrainConfig(), TrainConfig(batch_size=64), UNMEASURED, rates_a=[100], rates_b=[40],
                    loads_a=[burst], loads_b=[burst]).comparable() == [True]
