import math

import pytest
import torch

from nbtrain.demo import digits_recipe
from nbtrain import TrainConfig
from nbtrain.engine.memory import current_rss
from nbtrain.tools.lr_finder import find_lr
from nbtrain.tools.tune import find_batch_size
from nbtrain.tools.tune_workers import find_workers
from nbtrain.tools.tool_options import ToolOptionError

from checklist_recipes import compute_bound_recipe, data_bound_recipe, memory_heavy_recipe, same_state, state


def _trained(recipe):
    """A recipe whose model and Adam state have moved, so a restore has something to get wrong."""
    recipe.optimizer = lambda p: torch.optim.Adam(p, lr=1e-3)
    from nbtrain.api import engine_for
    engine = engine_for(recipe, TrainConfig(batch_size=16, max_steps=3))
    engine.run()
    return engine


@pytest.mark.slow
def test_batch_search_restores_weights_and_optimizer_state_exactly():
    recipe = compute_bound_recipe(n=512, width=128)
    engine = _trained(recipe)
    before = state(recipe.model, engine.optimizer)
    counters = (engine.step, engine.samples)
    search = find_batch_size(recipe, config=TrainConfig(batch_size=16), max_batch=128,
                             memory_budget=current_rss() + 64 * 2**20)
    assert same_state(before, state(recipe.model, engine.optimizer))
    assert (engine.step, engine.samples) == counters and engine.config.batch_size == 16
    assert search.batch_size >= 16


@pytest.mark.slow
def test_batch_search_stays_under_a_cpu_memory_budget_within_the_trial_bound():
    recipe = memory_heavy_recipe(n=1024)
    from nbtrain.api import engine_for
    engine_for(recipe, TrainConfig(batch_size=8, max_steps=1)).run()  # one-off allocations happen here
    limit = current_rss() + 64 * 2**20
    search = find_batch_size(recipe, config=TrainConfig(batch_size=8), memory_budget=limit, max_batch=1024)
    assert len(search.trials) <= math.ceil(math.log2(1024)) + 4 == search.max_trials
    found = next(t for t in search.trials if t.batch_size == search.batch_size)
    assert found.fits and found.peak_bytes <= limit
    assert any(not t.fits and t.reason == "over budget" for t in search.trials), search.table()
    smallest_too_big = min(t.batch_size for t in search.trials if not t.fits)
    assert smallest_too_big > search.batch_size
    assert smallest_too_big - search.batch_size <= max(1, 0.05 * search.batch_size)


@pytest.mark.slow
def test_batch_search_summary_states_the_lr_rule_and_warm_up():
    recipe = compute_bound_recipe(n=256, width=32)
    search = find_batch_size(recipe, config=TrainConfig(batch_size=8, lr=0.01), max_batch=64,
                             memory_budget=0.5)
    assert search.batch_size == 64  # a tiny model: everything up to the cap fits
    c = search.config
    assert (c.batch_size, c.scale_lr, c.base_batch_size) == (64, "linear", 8)
    assert search.lr_scaled == pytest.approx(0.08) and c.warmup_steps == 4  # one epoch of 256 / 64
    assert "0.01 -> 0.08 by the linear rule" in search.summary()
    assert "linear warm-up over 4 steps (suggested: one epoch at the new batch)" in search.table()
    # its speed against the starting batch: head to head, with the interval (or no measurable difference)
    v = search.speed.verdict
    assert (search.speed.a.batch_size, search.speed.b.batch_size) == (8, 64) and v.pairs >= 2
    assert "speed, batch 64 against batch 8 head to head: " in search.table() and v.interval_text() in search.table()


def test_batch_search_that_keeps_the_starting_batch_has_no_speed_to_compare():
    search = find_batch_size(compute_bound_recipe(n=64, width=8), config=TrainConfig(batch_size=64), max_batch=64,
                             memory_budget=0.5)
    assert search.batch_size == 64 and search.speed is None
    assert "speed: the starting batch is the largest found; nothing to compare" in search.table()


@pytest.mark.parametrize("kwargs, message", [
    ({"memory_budget": -1}, "memory_budget=-1: allowed: a fraction in (0, 1]"),
    ({"memory_budget": 1.5}, "memory_budget=1.5: allowed: a fraction in (0, 1]"),
    ({"max_batch": 0}, "max_batch=0: allowed: a whole number >= 1"),
    ({"max_batch": 10_000}, "max_batch=10000: allowed: at most 64 (samples per process in train_data)"),
    ({"rule": "cubic"}, "rule='cubic': allowed: one of linear, sqrt, none"),
    ({"speed_s": -1}, "speed_s=-1: allowed: seconds >= 0"),
])
def test_batch_search_bad_input_names_option_value_and_allowed(kwargs, message):
    with pytest.raises(ToolOptionError) as error:
        find_batch_size(compute_bound_recipe(n=64, width=8), **kwargs)
    assert message in str(error.value)


def test_worker_search_measures_each_count_and_restores_the_model():
    recipe = data_bound_recipe(n=192)
    before = state(recipe.model)
    search = find_workers(recipe, config=TrainConfig(batch_size=16), candidates=[0, 1], seconds=0.8)
    assert [m.config.num_workers for m in search.measurements[:2]] == [0, 1]
    assert all(rate.rate > 0 for rate in search.steady)
    assert search.best in [m.config for m in search.measurements]
    assert same_state(before, state(recipe.model))
    table = search.table()
    assert "num_workers=1, persistent_workers=" in table
    # each setting's steady rate with its interval, and each against the starting one
    assert all(rate.text("") in table for rate in search.steady) and table.count("95% interval") >= 2
    assert "start" in table and search.versus[1].short() in table


def test_worker_search_moves_off_the_start_only_when_head_to_head_says_it_is_faster():
    recipe = data_bound_recipe(n=192)
    search = find_workers(recipe, config=TrainConfig(batch_size=16), candidates=[0, 1, 2], seconds=0.5)
    h = search.head_to_head
    if h is None:  # the start was the fastest measured
        assert search.best == search.start and "the starting setting is the fastest" in search.table()
    else:
        assert h.a == search.start and h.verdict.pairs >= 2 and h.verdict.interval_text() in search.table()
        assert search.best == (h.b if h.verdict.faster else search.start)


def test_worker_search_bad_candidates_message():
    with pytest.raises(ToolOptionError, match=r"candidates=\[-1\]: allowed: a list of whole numbers >= 0"):
        find_workers(compute_bound_recipe(n=64, width=8), candidates=[-1])


def test_lr_finder_sweeps_exponentially_suggests_before_divergence_and_restores(tmp_path):
    recipe = digits_recipe()
    before = state(recipe.model)
    found = find_lr(recipe, config=TrainConfig(batch_size=64), start_lr=1e-5, end_lr=10.0, steps=60)
    ratios = [b / a for a, b in zip(found.lrs, found.lrs[1:])]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)  # exponential
    assert found.stopped_early and found.lrs[-1] < 10.0
    best = found.lrs[found.smoothed.index(min(found.smoothed))]
    assert 1e-5 < found.suggestion <= best
    assert same_state(before, state(recipe.model))
    found.plot(path=tmp_path / "lr.png")
    assert (tmp_path / "lr.png").stat().st_size > 1000


def test_lr_finder_bad_range_message():
    with pytest.raises(ToolOptionError, match=r"start_lr=1.0, end_lr=0.1: allowed: numbers with 0 < start_lr < end_lr"):
        find_lr(compute_bound_recipe(n=64, width=8), start_lr=1.0, end_lr=0.1)


@pytest.mark.cuda
def test_batch_search_on_cuda_catches_out_of_memory_and_restores():
    recipe = compute_bound_recipe(n=4096, width=4096)
    before = state(recipe.model)
    free, _ = torch.cuda.mem_get_info()
    search = find_batch_size(recipe, config=TrainConfig(batch_size=64, accelerator="cuda"),
                             memory_budget=int(torch.cuda.memory_allocated() + 0.01 * free))
    assert search.batch_size >= 1 and len(search.trials) <= search.max_trials
    assert same_state({k: v.cpu() for k, v in before.items()}, {k: v.cpu() for k, v in state(recipe.model).items()})


@pytest.mark.slow
def test_a_scaled_learning_rate_that_diverges_is_not_handed_to_the_user():
    """The linear rule on a rate already near the edge: the short check sees the loss blow up and the
    search suggests a gentler rule, saying why."""
    from helpers import edge_of_stability_recipe
    from nbtrain.tools.tune import find_batch_size, worse
    assert worse([1.0, 1.0, 1.0, 1.0, 1.0]) is None and worse([1.0, 0.5, float("nan")]).startswith("loss")
    assert worse([1.0, 1.1, 2.0, 3.0, 4.0]) == "loss 1 -> 4"
    search = find_batch_size(recipe=edge_of_stability_recipe(), config=TrainConfig(batch_size=4, accelerator="cpu"),
                             rule="linear", max_batch=256, speed_s=0)
    if search.batch_size >= 64:  # linear: 0.02 x 16 or more, far past this problem's stable rate
        assert any("made the loss diverge" in note for note in search.notes), search.table()
        assert search.config.scale_lr != "linear"
