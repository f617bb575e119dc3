"""The machine's ceilings on the live model: loader alone, model alone, FLOPs utilisation, the verdict."""
import pytest
import torch

import nbtrain
from nbtrain import TrainConfig
from nbtrain.api import engine_for
from nbtrain.measure.ceilings import peak_flops

from checklist_recipes import compute_bound_recipe, data_bound_recipe, same_state, state


@pytest.mark.slow
def test_a_heavy_per_sample_transform_is_data_bound_and_says_by_how_much():
    c = nbtrain.ceilings(data_bound_recipe(), config=TrainConfig(batch_size=32))
    assert c.kind == "data-bound", c.table()
    assert c.loader.rate < c.model.rate and c.ratio.low > 1
    assert c.verdict.startswith(f"the loader can deliver {c.loader.rate:,.0f} samples/s, the model could take "
                                f"{c.model.rate:,.0f}: data-bound (the model could go ")
    assert "95% interval" in c.verdict and "verdict: the loader can deliver" in c.table()


def test_a_big_model_on_ready_tensors_is_compute_bound():
    c = nbtrain.ceilings(compute_bound_recipe(), config=TrainConfig(batch_size=128))
    assert c.kind == "compute-bound", c.table()
    assert c.model.rate < c.loader.rate and c.ratio.high < 1
    assert c.verdict.startswith(f"the model can take {c.model.rate:,.0f} samples/s, the loader could deliver")
    assert "compute-bound (the loader has" in c.verdict


def test_utilisation_of_a_matmul_heavy_mlp_lies_between_0_and_1_and_counts_its_flops():
    width, batch = 512, 128
    c = nbtrain.ceilings(compute_bound_recipe(n=512, width=width), config=TrainConfig(batch_size=batch))
    # forward: 2 multiply-adds per weight per sample; backward: twice that (the first layer's input
    # gradient is not needed, so slightly less)
    weights = 256 * width + width * width + width * 4
    assert 0.6 * 6 * weights * batch < c.step_flops <= 6 * weights * batch
    assert 0 < c.utilisation() < 1, c.table()
    assert c.peak_dtype == "float32" and c.peak_flops > 0
    assert "model FLOPs utilisation" in c.table() and "FLOP/s (float32" in c.table()


def test_the_peak_is_measured_in_the_steps_dtype():
    flops, size = peak_flops(torch.device("cpu"), torch.bfloat16, seconds=0.05)
    assert flops > 0 and size >= 256


def test_measuring_the_ceilings_leaves_model_optimizer_rng_and_config_exactly_as_they_were():
    recipe = compute_bound_recipe(n=256, width=64)
    recipe.optimizer = lambda p: torch.optim.Adam(p, lr=1e-3)
    config = TrainConfig(batch_size=32, max_steps=3)
    engine = engine_for(recipe, config)
    engine.run()  # moved weights and Adam moments: a restore has something to get wrong
    before = state(recipe.model, engine.optimizer)
    lrs = [g["lr"] for g in engine.optimizer.param_groups]
    counters, rng = (engine.step, engine.samples, engine.epoch_offset), torch.get_rng_state()
    nbtrain.ceilings(recipe, config=config, steps=10, seconds=0.5)
    assert same_state(before, state(recipe.model, engine.optimizer))
    assert [g["lr"] for g in engine.optimizer.param_groups] == lrs  # measured at rate 0, put back
    assert (engine.step, engine.samples, engine.epoch_offset) == counters and engine.config == config
    assert torch.equal(rng, torch.get_rng_state())


def test_bad_ceiling_options_name_the_option():
    with pytest.raises(ValueError, match=r"steps=3: a whole number >= 10"):
        nbtrain.ceilings(compute_bound_recipe(n=64, width=8), steps=3)
