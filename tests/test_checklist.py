import os
import subprocess
import sys

import pytest
import torch

from nbtrain import TrainConfig
from nbtrain.api import engine_for
from nbtrain.checklist import batch_candidates, checklist
from nbtrain.demo import digits_recipe

from checklist_recipes import same_state, state


class StepClock:
    """A fake clock that moves `tick` seconds each time it is read. The walk's budget decisions then
    depend only on how often it looks at its clock, never on how busy the test machine is (real
    time overruns are measured in benchmarks/budgets.py instead)."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


WALK = dict(config=TrainConfig(batch_size=8, accelerator="cpu"), trial_s=0.2, target_global_batch=256,
            items=("batch_size", "precision", "accumulation"))


def test_walk_stops_when_its_own_clock_says_the_budget_is_spent_and_says_so():
    recipe = digits_recipe()
    before = state(recipe.model)
    # A clock that never moves: the budget is never spent, so every item's candidates are tried.
    unlimited = checklist(recipe, budget_s=10, clock=lambda: 0.0, **WALK)
    assert not [reason for _, reason in unlimited.skipped if "time budget" in reason], unlimited.table()
    # Each look at the clock costs a second: the same walk runs out of budget after a few trials,
    # although its trials take a fraction of those seconds in real time.
    walk = checklist(recipe, budget_s=10, clock=StepClock(tick=1.0), **WALK)
    assert 1 <= walk.trials < unlimited.trials, walk.table()
    assert walk.elapsed_s >= walk.budget_s == 10, walk.table()
    assert dict(walk.skipped)["accumulation"] == "time budget: 0.0 s left", walk.table()
    assert f"{walk.trials} trials in {walk.elapsed_s:.1f} s of a 10 s budget" in walk.table()
    assert same_state(before, state(recipe.model))


def test_a_budget_its_clock_says_is_gone_before_the_start_is_measured_is_refused():
    recipe = digits_recipe()
    before = state(recipe.model)
    # 30 s is ample in real time; this clock jumps 30 s per read, so nothing fits.
    with pytest.raises(RuntimeError, match=r"budget_s=30 left no time to measure the starting config"):
        checklist(recipe, budget_s=30, clock=StepClock(tick=30.0), **WALK)
    assert same_state(before, state(recipe.model))


def test_walk_measures_items_reports_skips_and_restores_model_and_config(tmp_path):
    recipe = digits_recipe()
    start = TrainConfig(batch_size=16)
    before = state(recipe.model)
    walk = checklist(recipe, config=start, budget_s=8, target_global_batch=256, items=(
        "workers", "batch_size", "accumulation", "device", "ddp"))
    assert same_state(before, state(recipe.model))
    assert engine_for(recipe, start).config == start
    names = [item.name for item in walk.items]
    assert names[:2] == ["workers", "batch_size"], walk.table()
    for item in walk.items:
        assert all(t.samples_per_s is None or t.samples_per_s > 0 for t in item.tried)
    skipped = dict(walk.skipped)
    if not torch.cuda.is_available():
        assert skipped["device"] == "no GPU (CUDA is not available on this machine)"
    assert walk.best_config.global_batch_size <= 256 or "accumulation" not in names
    walk.plot(path=tmp_path / "waterfall.png")
    assert (tmp_path / "waterfall.png").stat().st_size > 1000


def test_keep_best_leaves_the_live_engine_on_the_best_config():
    recipe = digits_recipe()
    before = state(recipe.model)
    walk = checklist(recipe, config=TrainConfig(batch_size=16), budget_s=6, items=("batch_size",), keep_best=True)
    assert walk.kept_on_engine and "the live engine now uses the best config" in walk.table()
    assert engine_for(recipe, walk.best_config).config == walk.best_config
    assert same_state(before, state(recipe.model))


def test_larger_batches_come_with_the_linear_rule_stated():
    walk = checklist(digits_recipe(), config=TrainConfig(batch_size=8), budget_s=6, items=("batch_size",),
                     min_gain=0.0)
    if walk.best_config.batch_size > 8:
        assert walk.best_config.scale_lr == "linear" and walk.best_config.base_batch_size == 8
        assert walk.lr_note.startswith("linear rule:")


def test_batch_candidates_double_within_the_data_and_the_target():
    assert batch_candidates(TrainConfig(batch_size=16), samples=1000) == [16, 32, 64]
    assert batch_candidates(TrainConfig(batch_size=16), samples=10_000, target_global_batch=64) == [16, 32, 64]


@pytest.mark.parametrize("kwargs, message", [
    ({"budget_s": 0}, "budget_s=0: a number of seconds > 0"),
    ({"items": ("workers", "magic")}, "items=['workers', 'magic']: each one of workers, batch_size"),
    ({"target_global_batch": 0}, "target_global_batch=0: a whole number >= 1, or None"),
    ({"clock": 5.0}, "clock=5.0: a function returning seconds, like time.monotonic"),
])
def test_bad_input_names_option_value_and_allowed(kwargs, message):
    with pytest.raises(ValueError) as error:
        checklist(digits_recipe(), **kwargs)
    assert message in str(error.value)


def test_tour_runs_the_walk_on_the_demo_from_the_command_line(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "nbtrain", "tour", "--budget-s", "6", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "nbtrain checklist walk on cpu" in done.stdout or "nbtrain checklist walk on cuda" in done.stdout
    assert (tmp_path / "nbtrain-tour-waterfall.png").exists()


def test_trial_throughput_ignores_a_passing_load_spike():
    from nbtrain.trial import robust_rate
    points = [(0.1 * i, 100 * i) for i in range(16)]  # 1,000 samples/s ...
    points = points[:6] + [(t + 1.0, s) for t, s in points[6:]]  # ... with one step stalled by 1 s
    assert robust_rate(points) == pytest.approx(1000)
    assert robust_rate([(0.0, 0), (2.0, 500)]) == pytest.approx(250)


@pytest.mark.cuda
def test_walk_tries_the_gpu_from_a_cpu_config():
    walk = checklist(digits_recipe(), config=TrainConfig(batch_size=64, accelerator="cpu"), budget_s=20,
                     items=("device", "precision"))
    device = next(item for item in walk.items if item.name == "device")
    assert device.tried[0].label == "accelerator='cuda'" and device.tried[0].samples_per_s > 0


def test_a_budget_too_small_to_measure_the_start_says_so():
    with pytest.raises(RuntimeError, match=r"budget_s=0.5 left no time to measure the starting config"):
        checklist(digits_recipe(), budget_s=0.5)


def test_the_modern_toggles_are_walked_or_skipped_with_a_reason():
    walk = checklist(digits_recipe(), config=TrainConfig(batch_size=32), budget_s=15,
                     items=("optimizer_impl", "channels_last", "matmul_precision", "compile",
                            "activation_checkpointing"))
    skipped = dict(walk.skipped)
    assert "no 2-D convolutions" in skipped["channels_last"]
    assert "compiling does not fit" in skipped["compile"] and "pays off" in skipped["compile"]
    assert "trades speed for memory" in skipped["activation_checkpointing"]
    if not torch.cuda.is_available():
        assert "CUDA feature" in skipped["matmul_precision"]
    measured = {item.name: item for item in walk.items}
    assert "optimizer_impl" in measured or "time budget" in skipped.get("optimizer_impl", "")
    for item in measured.values():
        assert all(t.samples_per_s is None or t.samples_per_s > 0 for t in item.tried)
    assert "compiling does not fit" in walk.table()
