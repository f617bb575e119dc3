"""The observation wins over the digest (runs/repeats.py, runs/apart.py): two runs whose settings read the same
but whose rates read further apart than the machine moves a run are never "same settings (A/A)", and never
count as repeats, so they cannot widen the spread that later verdicts are held against."""
import os
import re

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import Recipe, TrainConfig
from nbtrain.measure.load import Load
from nbtrain.metrics import MetricsLog
from nbtrain.measure.withheld import BEYOND_LOADED, UNREAD
from nbtrain.runs.repeats import evidence, same_settings, spread
from nbtrain.runs.result import RunResult, summarize
from nbtrain.runs.store import RunStore


def _run(seconds_a_step, name, workload="w1", seed=0):
    """A 3 s run of steps lasting about `seconds_a_step` whose workload digest is `workload` (its summary
    made the way a real run's is)."""
    durations = seconds_a_step * (1 + 0.01 * np.random.default_rng(seed).standard_normal(300))
    log = MetricsLog()
    log.emit({"type": "start", "config": {"log_every_n_steps": 1}, "info": {"samples_start": 0}})
    steps = list(range(1, 301))
    log.emit({"type": "steps", "rows": {"step": steps, "samples": [64 * s for s in steps],
                                        "time": np.cumsum(durations).tolist(), "loss": [1.0] * 300,
                                        "lr": [0.1] * 300}})
    summary = summarize(log, {}).replace(workload=workload)
    return RunResult(TrainConfig(batch_size=64), log, summary, name=name)


@pytest.mark.parametrize("factor", [2.5, 7, 46])
def test_runs_of_the_same_settings_far_apart_are_not_a_a_and_not_repeats(factor):
    a, b = _run(0.01, "a"), _run(0.01 * factor, "b", seed=1)
    comparison = nbtrain.compare(a, b)
    cell = comparison.rows[1]["vs first"]
    assert re.fullmatch(r"the same settings as far as nbtrain can read, yet ([\d.]+)x apart: something it cannot "
                        r"read differs", cell), cell
    assert abs(float(re.search(r"([\d.]+)x", cell).group(1)) / factor - 1) < 0.05, cell
    assert UNREAD in comparison.notes and "A/A" not in comparison.table()
    assert not same_settings(a, b)
    assert spread(a, evidence([a, b])) is None and spread(b, evidence([a, b])) is None


@pytest.mark.parametrize("factor", [1.0, 1.2, 1.5])
def test_runs_of_the_same_settings_within_the_machines_reach_stay_a_a_and_count_as_repeats(factor):
    a, b = _run(0.01, "a"), _run(0.01 * factor, "b", seed=1)
    assert nbtrain.compare(a, b).rows[1]["vs first"].startswith("same settings (A/A): ")
    assert same_settings(a, b) and spread(a, evidence([a, b])).runs == 2


def test_a_pair_apart_beyond_the_machine_never_swallows_a_later_verdict():
    # a and its hidden twin read 7x apart: were they repeats, c's 1.6x would be "within the machine's spread"
    a, twin, c = _run(0.01, "a"), _run(0.07, "twin", seed=1), _run(0.016, "c", workload="w2", seed=2)
    cell = nbtrain.compare(a, c, twin).rows[1]["vs first"]
    assert re.fullmatch(r"0\.6\dx \(0\.6\d-0\.6\d\)†", cell), cell
    # a real repeat of a beside the pair still counts, and only it: 2 runs, 1.1x
    again = _run(0.011, "a again", seed=3)
    assert spread(a, evidence([a, twin, again])).runs == 2
    cell = nbtrain.compare(a, c, twin, again).rows[1]["vs first"]
    assert re.fullmatch(r"0\.6\dx \(0\.6\d-0\.6\d\)", cell), cell  # beyond the 1.1x measured: unmarked


def test_a_stored_pair_apart_beyond_the_machine_is_no_repeat(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    for run in (_run(0.01, "a"), _run(0.07, "twin", seed=1), _run(0.016, "c", workload="w2", seed=2)):
        store.record(run)
    loaded = store.load("a")
    assert spread(loaded, evidence([loaded], store)) is None
    cell = nbtrain.compare("a", "c", store=store).rows[1]["vs first"]
    assert not cell.startswith("within"), cell


class Hidden(nn.Module):
    """A step that does as many extra matmuls as an environment variable says: nothing nbtrain reads tells
    two runs apart (CPU work, not a sleep: on a full machine the CPU time a sample took shows it too)."""

    def __init__(self):
        super().__init__()
        self.net, self.mix, self.square = nn.Linear(256, 1), nn.Linear(64, 256), nn.Linear(256, 256)

    def forward(self, x):
        h = self.mix(x)
        for _ in range(int(os.environ.get("NBTRAIN_TEST_EXTRA", "0"))):
            h = h + 0 * self.square(h)
        return self.net(h)


@pytest.mark.slow
def test_real_runs_apart_for_a_reason_nbtrain_cannot_read_say_so(monkeypatch):
    runs = []  # a first run in a process is slower (its one-time costs): one before the pair, not compared
    for extra, name in ((0, "first in the process"), (0, "quick"), (100, "hidden work")):
        monkeypatch.setenv("NBTRAIN_TEST_EXTRA", str(extra))
        torch.manual_seed(0)
        recipe = Recipe(model=Hidden(), train_data=TensorDataset(torch.randn(256, 64), torch.randn(256, 1)),
                        loss_fn=nn.MSELoss())
        runs.append(nbtrain.fit(recipe=recipe, max_steps=24, batch_size=32, accelerator="cpu", name=name))
    quick, slow = runs[1:]
    assert quick.summary.workload == slow.summary.workload is not None  # alike, as far as nbtrain can read
    assert quick.steady().rate > BEYOND_LOADED * slow.steady().rate, (quick.steady(), slow.steady())
    cell = nbtrain.compare(quick, slow).rows[1]["vs first"]
    assert cell.startswith("the same settings as far as nbtrain can read, yet ") and "A/A" not in cell, cell


def _beside_a_full_machine(run, own_cores):
    """`run` as if its threads waited 1.2 s a second for a CPU (a full machine), its process tree using
    `own_cores` cores meanwhile."""
    wall_s = run.summary.train_time_s
    load = Load(1.7, 2, wall_s, own_cores=own_cores, waited_cores=1.2)
    return RunResult(run.config, run.log, run.summary.replace(load=load), name=run.name)


@pytest.mark.parametrize("same_work", [True, False])
def test_on_a_full_machine_the_cpu_time_a_sample_took_decides(same_work):
    # 7x apart on a full machine: the load can explain any wall clock. Where each sample took the same CPU
    # time, it may (A/A); where the slower one's samples took 7x the CPU time too, the work differs.
    quick = _beside_a_full_machine(_run(0.01, "a"), own_cores=0.3)
    slow = _beside_a_full_machine(_run(0.07, "b", seed=1), own_cores=0.3 / 7 if same_work else 0.3)
    cell = nbtrain.compare(quick, slow).rows[1]["vs first"]
    if same_work:
        assert cell.startswith("same settings (A/A): ") and same_settings(quick, slow), cell
    else:
        assert cell.startswith("the same settings as far as nbtrain can read, yet 7.0x apart"), cell
        assert not same_settings(quick, slow)
