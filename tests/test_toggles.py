"""Every speed toggle trains on its canonical recipe, or says why it does not apply here."""
import pytest
import torch
from torch import nn

from nbtrain import ConfigError, Engine, TrainConfig
from nbtrain.config import options
from nbtrain.toggles import TOGGLES, _conv_recipe, _mlp_recipe

from helpers import same_weights, weights

TOGGLE_OPTIONS = {"compile", "channels_last", "matmul_precision", "cudnn_benchmark", "optimizer_impl",
                  "activation_checkpointing", "persistent_workers", "prefetch_factor"}


def test_every_toggle_option_has_a_canonical_recipe():
    assert TOGGLE_OPTIONS <= set(options())
    assert {t.option for t in TOGGLES} == TOGGLE_OPTIONS


@pytest.mark.parametrize("toggle", TOGGLES, ids=lambda t: f"{t.option}={t.value}")
def test_each_toggle_trains_two_steps_or_reports_why_not(toggle):
    recipe = toggle.recipe()
    before = weights(recipe.model)
    config = TrainConfig(max_steps=2, batch_size=32, **dict(toggle.with_options), **{toggle.option: toggle.value})
    result = Engine(recipe, config).run()
    assert result.status == "completed"
    assert not same_weights(before, weights(recipe.model))
    if toggle.needs == "cuda" and not torch.cuda.is_available():
        assert any(note.startswith(f"{toggle.option}=") and "not applicable on cpu" in note
                   for note in result.summary["notes"])


@pytest.mark.parametrize("option, value", [("channels_last", True), ("optimizer_impl", "foreach"),
                                           ("optimizer_impl", "fused"), ("activation_checkpointing", "auto")])
def test_toggles_that_must_not_change_the_math_give_the_same_weights(option, value):
    factory = _conv_recipe if option == "channels_last" else _mlp_recipe
    plain, toggled = factory(), factory()
    Engine(plain, TrainConfig(max_steps=4, batch_size=32)).run()
    Engine(toggled, TrainConfig(max_steps=4, batch_size=32, **{option: value})).run()
    assert same_weights(weights(plain.model), weights(toggled.model), atol=1e-5)


def test_channels_last_on_a_model_without_convolutions_is_reported_not_applicable():
    result = Engine(_mlp_recipe(), TrainConfig(max_steps=2, channels_last=True)).run()
    assert any("channels_last: not applicable, the model has no 2-D convolutions" in n for n in result.summary["notes"])
    assert "not applicable" in result.table()


def test_activation_checkpointing_recomputes_and_can_be_switched_off_live():
    recipe = _mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=1, activation_checkpointing="net.1,net.3"))
    assert getattr(recipe.model.net[1], "_nbtrain_checkpointed", False)
    engine.run()
    engine.reconfigure(engine.config.replace(activation_checkpointing=None))
    assert not getattr(recipe.model.net[1], "_nbtrain_checkpointed", False)
    assert set(recipe.model.state_dict()) == set(_mlp_recipe().model.state_dict())


def test_an_unknown_submodule_for_checkpointing_is_named_with_what_exists():
    with pytest.raises(ConfigError, match="no submodule 'decoder'; its top-level submodules: net"):
        Engine(_mlp_recipe(), TrainConfig(activation_checkpointing="decoder"))


def test_an_optimizer_without_fused_kernels_is_reported_not_applicable():
    recipe = _mlp_recipe()
    recipe.optimizer = lambda p: torch.optim.Rprop(p)
    result = Engine(recipe, TrainConfig(max_steps=2, optimizer_impl="fused")).run()
    assert any("optimizer_impl=fused" in n for n in result.summary["notes"])


def test_the_optimizer_implementation_switch_keeps_optimizer_state():
    recipe = _mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=2))
    engine.run()
    moments = engine.optimizer.state[next(recipe.model.parameters())]["exp_avg"].clone()
    engine.reconfigure(engine.config.replace(optimizer_impl="foreach"))
    assert engine.optimizer.defaults["foreach"] is True and engine.optimizer.param_groups[0]["foreach"] is True
    assert torch.equal(engine.optimizer.state[next(recipe.model.parameters())]["exp_avg"], moments)


@pytest.mark.slow
def test_compile_time_is_measured_apart_and_the_break_even_is_stated():
    recipe = _mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=6, batch_size=64, drop_last=True))
    engine.run()  # eager baseline on this model
    engine.reconfigure(engine.config.replace(compile="default"))
    result = engine.run()
    steady = sorted(result.history["step_s"])[len(result.history["step_s"]) // 2]
    assert result.summary["compile_s"] > 10 * steady  # compilation dwarfs a step, even from a warm cache
    note = next(n for n in result.summary["notes"] if n.startswith("compile cost"))
    assert "eager" in note and ("pays off after" in note or "never pays off" in note)
