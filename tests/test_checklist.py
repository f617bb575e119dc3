import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

from nbtrain import TrainConfig
from nbtrain.api import engine_for
from nbtrain.measure.withheld import FEWEST_PAIRS
from nbtrain.walk import items as walk_items
from nbtrain.walk.items import ITEMS, REGISTRY, batch_candidates, ddp_candidate
from nbtrain.walk.tool import checklist
from nbtrain.demo import digits_recipe
from nbtrain.tools.tool_options import ToolOptionError, ToolRefusal

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


@pytest.mark.slow
def test_walk_stops_when_its_own_clock_says_the_budget_is_spent_and_says_so():
    recipe = digits_recipe()
    before = state(recipe.model)
    # A clock that never moves: the budget is never spent, so every item's candidates race the current
    # config until each race has its answer.
    unlimited = checklist(recipe, budget_s=10, clock=lambda: 0.0, **WALK)
    assert not [reason for _, reason in unlimited.skipped if "time budget" in reason], unlimited.table()
    # (a note only where a kept change that alters what is learned says what it learned: walk/quality.py)
    assert all(math.isfinite(item.verdict.low) and (not item.note or " in the same time (" in item.note)
               for item in unlimited.items), unlimited.table()
    assert all(item.verdict.paired and item.verdict.pairs >= 3 for item in unlimited.items
               if item.kept and item.name != "accumulation"), unlimited.table()
    # Each look at the clock costs a second: the same walk runs out of budget after its first round,
    # although its blocks take a fraction of those seconds in real time: the race stops there, keeps
    # nothing on one round's screen, and the items after it are skipped with the reason.
    walk = checklist(recipe, budget_s=10, clock=StepClock(tick=1.0), **WALK)
    assert 1 <= walk.rounds < unlimited.rounds and walk.blocks < unlimited.blocks, walk.table()
    assert walk.elapsed_s >= walk.budget_s == 10, walk.table()
    assert dict(walk.skipped)["accumulation"] == "time budget: 0.0 s left", walk.table()
    assert walk.items and not any(item.kept for item in walk.items), walk.table()
    assert "out of time after 1 round" in walk.table() and "screened on 1 block each" in walk.table()
    assert f"{walk.blocks} blocks in {walk.rounds} rounds in {walk.elapsed_s:.1f} s of a 10 s budget" in walk.table()
    assert same_state(before, state(recipe.model))


@pytest.mark.slow
def test_an_item_is_kept_only_when_its_head_to_head_interval_lies_above_the_threshold():
    recipe = digits_recipe()
    walk = checklist(recipe, budget_s=10, clock=lambda: 0.0, min_gain=0.03, **WALK)
    table = walk.table()
    for item in walk.items:
        assert item.verdict_text() in table, table
        if item.verdict.pairs >= FEWEST_PAIRS:  # fewer: the cell says "too few pairs to tell (2 of 4)" (withheld.py)
            assert item.verdict.interval_text() in table, table
        if item.name != "accumulation":  # asked for by target_global_batch: kept for its own sake
            assert item.kept == (item.verdict.low > 1.03), table
    total = walk.overall()
    assert total.low <= walk.final / walk.baseline <= total.high


def test_an_a_a_item_is_not_kept_and_its_row_shows_the_interval(monkeypatch):
    # An item whose one candidate is the current config itself: nothing to gain, only noise to mistake for it.
    same = dataclasses.replace(REGISTRY["precision"], candidates=lambda walk, current: [("the same config", current)])
    monkeypatch.setitem(REGISTRY, "precision", same)
    recipe = digits_recipe()
    before = state(recipe.model)
    walk = checklist(recipe, config=TrainConfig(batch_size=32, accelerator="cpu"), budget_s=10, clock=lambda: 0.0,
                     trial_s=0.3, items=("precision",))
    item, *second_look = walk.items  # a race too noisy to tell may be looked at once more
    assert len(second_look) <= 1 and not any(i.kept for i in walk.items), walk.table()
    assert walk.best_config == walk.start_config, walk.table()
    # Its row says it is one config against itself, with the spread of its blocks: never a speed-up (issue 39).
    assert "A/A check" in walk.table() and item.verdict.interval_text() in walk.table(), walk.table()
    assert not item.verdict.above(0.03)
    assert same_state(before, state(recipe.model))


def test_ddp_is_tried_with_the_same_total_of_dataloader_workers():
    label, config = ddp_candidate(TrainConfig(num_workers=2, persistent_workers=True))
    assert (config.world_size, config.num_workers) == (2, 1) and "2 in all as before" in label
    label, config = ddp_candidate(TrainConfig(num_workers=4))
    assert config.num_workers * config.world_size == 4
    label, config = ddp_candidate(TrainConfig(num_workers=1))
    assert config.num_workers == 0 and "1 cannot be split evenly over 2 processes" in label


def test_a_budget_its_clock_says_is_gone_before_the_start_is_measured_is_refused():
    recipe = digits_recipe()
    before = state(recipe.model)
    # 30 s is ample in real time; this clock jumps 30 s per read, so nothing fits.
    with pytest.raises(ToolRefusal, match=r"budget_s=30 left no time to measure the starting config"):
        checklist(recipe, budget_s=30, clock=StepClock(tick=30.0), **WALK)
    assert same_state(before, state(recipe.model))


@pytest.mark.slow
def test_walk_measures_items_reports_skips_and_restores_model_and_config(tmp_path):
    recipe = digits_recipe()
    start = TrainConfig(batch_size=16)
    before = state(recipe.model)
    # A clock that never moves: every item is measured however busy the machine (budgets: tests below).
    walk = checklist(recipe, config=start, budget_s=8, target_global_batch=256, items=(
        "workers", "batch_size", "accumulation", "device", "ddp"), clock=lambda: 0.0)
    assert same_state(before, state(recipe.model))
    assert engine_for(recipe, start).config == start
    names = [item.name for item in walk.items]
    # the order is the bottleneck's (host-bound at batch 16: the batch first); accumulation once at the end
    assert {"workers", "batch_size"} <= set(names) and names[-1] == "accumulation", walk.table()
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


@pytest.mark.slow
def test_larger_batches_come_with_the_linear_rule_stated():
    # A clock that never moves: a batch kept also races what it learns (walk/quality.py), which a loaded 6 s budget
    # left no room for; and that race is on the real engine here, scored on the recipe's val_data
    walk = checklist(digits_recipe(), config=TrainConfig(batch_size=8), budget_s=12, items=("batch_size",),
                     min_gain=0.0, clock=lambda: 0.0)
    batch = next(i for i in walk.items if i.name == "batch_size")
    assert " in the same time " in batch.note and "(held-out (val_data) " in batch.note, walk.table()
    # batches of 8 leave this CPU idle between steps: a larger one wins the race (min_gain 0 keeps any gain)
    assert walk.best_config.batch_size > 8, walk.table()
    assert walk.best_config.scale_lr == "linear" and walk.best_config.base_batch_size == 8
    assert walk.lr_note.startswith("linear rule:")


def test_batch_candidates_double_within_the_data_and_the_target():
    assert batch_candidates(TrainConfig(batch_size=16), samples=1000) == [16, 32, 64]
    assert batch_candidates(TrainConfig(batch_size=16), samples=10_000, target_global_batch=64) == [16, 32, 64]


@pytest.mark.parametrize("kwargs, message", [
    ({"budget_s": 0}, "budget_s=0: allowed: a number of seconds > 0"),
    ({"items": ("workers", "magic")}, "items=('workers', 'magic'): allowed: each one of " + ", ".join(ITEMS)),
    ({"target_global_batch": 0}, "target_global_batch=0: allowed: a whole number >= 1, or None"),
    ({"clock": 5.0}, "clock=5.0: allowed: a function returning seconds, like time.monotonic"),
])
def test_bad_input_names_option_value_and_allowed(kwargs, message):
    with pytest.raises(ToolOptionError) as error:
        checklist(digits_recipe(), **kwargs)
    assert message in str(error.value)


@pytest.mark.slow
def test_tour_runs_the_walk_on_the_demo_from_the_command_line(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "nbtrain", "tour", "--budget-s", "6", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "nbtrain checklist walk on cpu" in done.stdout or "nbtrain checklist walk on cuda" in done.stdout
    assert (tmp_path / "nbtrain-tour-waterfall.png").exists()


def test_trial_throughput_ignores_a_passing_load_spike():
    from nbtrain.tools.trial import robust_rate
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
    with pytest.raises(ToolRefusal, match=r"budget_s=0.5 left no time to measure the starting config"):
        checklist(digits_recipe(), budget_s=0.5)


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_walk_never_hands_over_a_scaled_learning_rate_that_diverges():
    """Accumulating up to a target global batch scales the rate by the linear rule (64x here, far past
    this problem's stable rate): the walk checks it in a short trial and keeps a gentler rule, saying why."""
    from helpers import edge_of_stability_recipe
    walk = checklist(recipe=edge_of_stability_recipe(), config=TrainConfig(batch_size=4, accelerator="cpu"),
                     items=("accumulation",),
                     target_global_batch=256, budget_s=30, clock=lambda: 0.0, trial_s=0.2)
    assert walk.items[0].kept and walk.best_config.accumulate_grad_batches == 64
    assert walk.best_config.scale_lr != "linear", walk.table()
    assert "made the loss diverge" in walk.lr_note and "made the loss diverge" in walk.table()


@pytest.mark.slow
def test_the_walk_table_keeps_its_columns_in_line_for_long_item_names():
    walk = checklist(digits_recipe(), config=TrainConfig(batch_size=64, accelerator="cpu"),
                     items=("activation_checkpointing", "matmul_precision"), budget_s=10, clock=lambda: 0.0,
                     trial_s=0.2)
    rows = walk.table().splitlines()[1:3 + len(walk.items) + len(walk.skipped)]
    header = rows[0]
    column = header.index("head to head")
    for row in rows[1:]:
        name = row.split()[0]
        assert row[column - 1] == " " and row[column] != " ", (name, walk.table())


@pytest.mark.slow
def test_the_ddp_item_runs_two_processes_and_compares_them_measured_apart():
    recipe = digits_recipe()
    before = state(recipe.model)
    walk = checklist(recipe, config=TrainConfig(batch_size=32), budget_s=60, items=("ddp",), clock=lambda: 0.0,
                     trial_s=0.5)
    (item,) = walk.items
    (tried,) = item.tried
    assert tried.config.world_size == 2 and tried.samples_per_s > 0 and tried.apart, walk.table()
    assert not item.verdict.paired and math.isfinite(item.verdict.low), walk.table()
    assert ", measured apart" in item.verdict_text() or item.kept, walk.table()
    # the starting config (no race measured it), the ranks' run, the current config right after it
    assert walk.trials == 3 and "and 3 separate trials" in walk.table()
    assert same_state(before, state(recipe.model))


def test_workers_are_also_tried_at_the_batch_items_batch_to_retry():
    from nbtrain.measure.verdict import Verdict
    from nbtrain.walk.result import ItemResult

    class Here:
        cores, samples = 2, 4096  # counts 0, 1, 2: the most workers is 2

    class Walk:  # what the workers item reads of the walk; the race itself is tested in test_race.py
        here, target, raced = Here(), None, {}

        def outcome(self, name):  # the result an item's race returned, read by the items after it
            return self.raced.get(name)

    def race(walk, current):
        candidates = walk_items.workers(walk, current)
        walk.labels = [label for label, _ in candidates]
        walk.configs = [config for _, config in candidates]

    def batch_item(verdict):  # the batch item raced batch 256 against the start: `verdict` its ratio
        tried = [walk_items.Tried("batch_size=256", walk_items.with_batch(current, 256, current), 1000.0 * verdict.ratio,
                                  verdict=verdict)]
        return ItemResult("batch_size", tried, 1000.0, 1000.0, False, "", verdict)

    walk, current = Walk(), TrainConfig(batch_size=16)
    walk.start = current
    race(walk, current)  # before the batch item raced: the largest batch it would try (4096 // 8)
    assert "num_workers=2, batch_size=512" in walk.labels, walk.labels
    walk.raced = {"batch_size": batch_item(Verdict(1.02, 0.95, 1.1, 4))}  # not shown slower: its batch to retry
    race(walk, current)
    assert "num_workers=2" in walk.labels and "num_workers=2, batch_size=256" in walk.labels, walk.labels
    together = walk.configs[walk.labels.index("num_workers=2, batch_size=256")]
    assert (together.batch_size, together.num_workers, together.scale_lr) == (256, 2, "linear")
    walk.raced = {"batch_size": batch_item(Verdict(0.8, 0.7, 0.9, 4))}  # shown slower: no batch to retry
    race(walk, current)
    assert not any("batch_size" in label for label in walk.labels), walk.labels


def test_the_batch_to_retry_with_workers_is_the_largest_batch_not_shown_slower():
    from nbtrain.measure.verdict import UNMEASURED, Verdict
    from nbtrain.walk.result import ItemResult

    start = TrainConfig(batch_size=16)

    def outcome(*rows):  # (batch, verdict over the start config, why it left)
        return [walk_items.Tried(f"batch_size={b}", walk_items.with_batch(start, b, start),
                                      1000.0 * v.ratio, verdict=v, left=left) for b, v, left in rows]

    faster = outcome((32, Verdict(0.7, 0.6, 0.8, 3), "left after round 1: slower than batch_size=64"),
                     (64, Verdict(1.3, 1.1, 1.5, 3), ""), (128, Verdict(1.29, 1.1, 1.5, 3), ""),
                     (256, Verdict(1.28, 1.05, 1.5, 3), ""),
                     (512, Verdict(0.7, 0.6, 0.8, 2), "left after round 2: below a gain worth keeping"))
    kept = ItemResult("batch_size", faster, 1000.0, 1300.0, True, "batch_size=64", Verdict(1.3, 1.1, 1.5, 3))
    assert walk_items.batch_to_retry(kept) == 256
    # Loading bounds the speed: every batch at one speed, the leader (64) is noise, and 256 left the
    # race as "slower" than it by noise too; neither is shown slower than the start, 512 is.
    bound = outcome((32, Verdict(1.0, 0.9, 1.1, 4), ""), (64, Verdict(1.02, 0.95, 1.1, 4), ""),
                    (128, Verdict(0.99, 0.92, 1.06, 4), ""),
                    (256, Verdict(0.97, 0.9, 1.04, 3), "left after round 3: slower than batch_size=64"),
                    (512, Verdict(0.8, 0.7, 0.9, 2), "left after round 2: below a gain worth keeping"),
                    (1024, UNMEASURED, "out of time after 1 round"))
    unkept = ItemResult("batch_size", bound, 1000.0, 1000.0, False, "", Verdict(1.02, 0.95, 1.1, 4),
                        compared="batch_size=64")
    assert walk_items.batch_to_retry(unkept) == 256
    slower = outcome((32, Verdict(0.9, 0.8, 0.97, 3), ""), (64, Verdict(0.8, 0.7, 0.9, 3), ""))
    assert walk_items.batch_to_retry(ItemResult("batch_size", slower, 1000.0, 1000.0, False, "",
                                                Verdict(0.9, 0.8, 0.97, 3))) is None
    largest_slower = faster[:2] + [walk_items.Tried(t.label, t.config, 500.0, verdict=Verdict(0.5, 0.4, 0.6, 3))
                                   for t in faster[2:]]
    assert walk_items.batch_to_retry(dataclasses.replace(kept, tried=largest_slower)) is None  # each larger slower


@pytest.mark.slow
def test_the_walk_drops_a_candidate_whose_loss_diverges_and_refuses_when_the_current_config_does():
    """A block whose loss became NaN/inf timed NaN arithmetic: never a speed-up of the config. Batch 16 and
    up with the linear rule scale this recipe's rate 4x and more, where its loss overflows within ~20 steps."""
    from helpers import unstable_at_four_times_its_rate_recipe as edge_of_stability_recipe
    walk = checklist(recipe=edge_of_stability_recipe(), config=TrainConfig(batch_size=4, accelerator="cpu"),
                     items=("batch_size",), budget_s=30, clock=lambda: 0.0, trial_s=0.2)
    tried = {t.label: t for t in walk.items[0].tried}
    assert tried["batch_size=16"].note.startswith("the loss became") and tried["batch_size=16"].samples_per_s is None
    assert walk.best_config.batch_size < 16, walk.table()
    recipe = edge_of_stability_recipe()
    before = state(recipe.model)
    with pytest.raises(ToolRefusal, match=r"nbtrain.checklist: the current config: the loss became (inf|nan) at "
                                          r"step \d+ in a timed block, so no speed is compared"):
        checklist(recipe=recipe, config=TrainConfig(batch_size=4, accelerator="cpu", lr=5.0),
                  items=("batch_size",), budget_s=30, clock=lambda: 0.0, trial_s=0.2)
    assert same_state(before, state(recipe.model))


@pytest.mark.slow
def test_the_walk_measures_the_devices_peaks_and_bandwidth_once_not_at_every_reading(monkeypatch):
    # They belong to the machine, not the config: 5.8 s of a 6 s first reading here, 0.3 s each reading after.
    from nbtrain.measure import device_rates
    from nbtrain.walk.bench import EngineBench
    live = engine_for(digits_recipe(), TrainConfig(batch_size=32))
    bench = EngineBench(lent := live.trial())
    first = bench.bottleneck(bench.start, 0.05)
    assert {torch.float32, "bandwidth"} <= set(bench.device_rates), bench.device_rates

    def measured_again(*args, **kwargs):
        raise AssertionError("a device rate measured again")
    monkeypatch.setattr(device_rates, "peak_flops", measured_again)
    monkeypatch.setattr(device_rates, "bandwidth", measured_again)
    again = bench.bottleneck(bench.start.replace(batch_size=64), 0.05)
    assert again.rates["compute"] > 0 and first.binding in ("host", "data", "compute", "memory")
    assert lent.engine.config.batch_size == 32  # each reading puts the trial's engine back
    lent.close()
    assert live.config.batch_size == 32
