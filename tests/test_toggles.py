"""Every speed toggle trains on its canonical recipe, or says why it does not apply here; the
torchvision image recipe trains with each setting an image notebook changes, DDP included."""
import math

import pytest
import torch

from nbtrain import ConfigError, Engine, TrainConfig
from nbtrain.config import options

from helpers import same_weights, weights
from toggle_recipes import TOGGLES, conv_recipe, image_recipe, mlp_recipe

TOGGLE_OPTIONS = {"compile", "channels_last", "matmul_precision", "cudnn_benchmark", "optimizer_impl",
                  "activation_checkpointing", "persistent_workers", "prefetch_factor"}


def test_every_toggle_option_has_a_canonical_recipe():
    assert TOGGLE_OPTIONS <= set(options())
    assert {t.option for t in TOGGLES} == TOGGLE_OPTIONS


# torch.compile takes seconds on the CPU: slow, like the compile tests below.
@pytest.mark.parametrize("toggle", [pytest.param(t, marks=pytest.mark.slow) if t.option == "compile" else t
                                    for t in TOGGLES], ids=lambda t: f"{t.option}={t.value}")
def test_each_toggle_trains_two_steps_or_reports_why_not(toggle):
    recipe = toggle.recipe()
    before = weights(recipe.model)
    config = TrainConfig(max_steps=2, batch_size=32, **dict(toggle.with_options), **{toggle.option: toggle.value})
    result = Engine(recipe, config).run()
    assert result.status == "completed"
    assert not same_weights(before, weights(recipe.model))
    if toggle.needs == "cuda" and not torch.cuda.is_available():
        assert any(note.startswith(f"{toggle.option}=") and "not applicable on cpu" in note
                   for note in result.summary.notes)


@pytest.mark.parametrize("option, value", [("channels_last", True), ("optimizer_impl", "foreach"),
                                           ("optimizer_impl", "fused"), ("activation_checkpointing", "auto")])
def test_toggles_that_must_not_change_the_math_give_the_same_weights(option, value):
    factory = conv_recipe if option == "channels_last" else mlp_recipe
    plain, toggled = factory(), factory()
    Engine(plain, TrainConfig(max_steps=4, batch_size=32)).run()
    Engine(toggled, TrainConfig(max_steps=4, batch_size=32, **{option: value})).run()
    assert same_weights(weights(plain.model), weights(toggled.model), atol=1e-5)


def test_channels_last_on_a_model_without_convolutions_is_reported_not_applicable():
    result = Engine(mlp_recipe(), TrainConfig(max_steps=2, channels_last=True)).run()
    assert any("channels_last: not applicable, the model has no 2-D convolutions" in n for n in result.summary.notes)
    assert "not applicable" in result.table()


def test_activation_checkpointing_recomputes_and_can_be_switched_off_live():
    recipe = mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=1, activation_checkpointing="net.1,net.3"))
    assert getattr(recipe.model.net[1], "_nbtrain_checkpointed", False)
    engine.run()
    engine.reconfigure(engine.config.replace(activation_checkpointing=None))
    assert not getattr(recipe.model.net[1], "_nbtrain_checkpointed", False)
    assert set(recipe.model.state_dict()) == set(mlp_recipe().model.state_dict())


def test_an_unknown_submodule_for_checkpointing_is_named_with_what_exists():
    with pytest.raises(ConfigError, match="no submodule 'decoder'; its top-level submodules: net"):
        Engine(mlp_recipe(), TrainConfig(activation_checkpointing="decoder"))


def test_an_optimizer_without_fused_kernels_is_reported_not_applicable():
    recipe = mlp_recipe()
    recipe.optimizer = lambda p: torch.optim.Rprop(p)
    result = Engine(recipe, TrainConfig(max_steps=2, optimizer_impl="fused")).run()
    assert any("optimizer_impl=fused" in n for n in result.summary.notes)


def test_the_optimizer_implementation_switch_keeps_optimizer_state():
    recipe = mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=2))
    engine.run()
    moments = engine.optimizer.state[next(recipe.model.parameters())]["exp_avg"].clone()
    engine.reconfigure(engine.config.replace(optimizer_impl="foreach"))
    assert engine.optimizer.defaults["foreach"] is True and engine.optimizer.param_groups[0]["foreach"] is True
    assert torch.equal(engine.optimizer.state[next(recipe.model.parameters())]["exp_avg"], moments)


@pytest.mark.slow
def test_compile_time_is_measured_apart_and_the_break_even_is_stated():
    recipe = mlp_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=6, batch_size=64, drop_last=True))
    engine.run()  # eager baseline on this model
    engine.reconfigure(engine.config.replace(compile="default"))
    result = engine.run()
    steady = sorted(result.history["step_s"])[len(result.history["step_s"]) // 2]
    assert result.summary.compile_s > 10 * steady  # compilation dwarfs a step, even from a warm cache
    note = next(n for n in result.summary.notes if n.startswith("compile cost"))
    assert "eager" in note and ("pays off after" in note or "never pays off" in note)


IMAGE_SETTINGS = {"workers": {"num_workers": 2}, "channels_last": {"channels_last": True},
                  "bf16": {"precision": "bf16-mixed"}, "batch size": {"batch_size": 8}}


@pytest.mark.parametrize("settings", IMAGE_SETTINGS.values(), ids=IMAGE_SETTINGS.keys())
def test_the_torchvision_image_recipe_trains_with_each_setting_an_image_notebook_changes(settings):
    recipe = image_recipe()
    before = weights(recipe.model)
    result = Engine(recipe, TrainConfig(**{"max_steps": 2, "batch_size": 16, "accelerator": "cpu", **settings})).run()
    assert result.status == "completed" and not same_weights(before, weights(recipe.model))
    assert not any("not applicable" in note for note in result.summary.notes)
    assert math.isfinite(result.summary.val_loss) and result.summary.val_acc is not None
    if "channels_last" in settings:
        assert recipe.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_live_batch_size_and_workers_change_rebuilds_the_image_loader_and_keeps_training():
    recipe = image_recipe()
    engine = Engine(recipe, TrainConfig(max_steps=2, batch_size=16, accelerator="cpu"))
    engine.run()
    after_first = weights(recipe.model)
    engine.reconfigure(engine.config.replace(batch_size=8, num_workers=1))
    assert engine.loader.batch_size == 8 and engine.loader.num_workers == 1
    result = engine.run()
    assert result.summary.global_batch == 8 and engine.step == 4
    assert not same_weights(after_first, weights(recipe.model))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_image_recipe_trains_with_devices_2_from_the_magic_and_its_weights_come_back(ip):
    ip.user_ns["image_recipe"] = image_recipe
    result = ip.run_cell("%%nbtrain --devices 2 --accelerator cpu --max-steps 2 --batch-size 8 --num-workers 1 "
                         "--channels-last --no-plot --no-progress --name images\n"
                         "recipe = image_recipe()\n"
                         "model, train_data, val_data = recipe.model, recipe.train_data, recipe.val_data\n"
                         "loss_fn, optimizer = recipe.loss_fn, recipe.optimizer\n"
                         "before = [p.clone() for p in model.parameters()]")
    result.raise_error()
    result, model = ip.user_ns.pop("images"), ip.user_ns["model"]
    assert result.status == "completed" and result.summary.world_size == 2 and result.summary.global_batch == 16
    assert all(not torch.equal(a, b) for a, b in zip(ip.user_ns["before"], model.parameters()))  # back here
    assert math.isfinite(result.summary.val_loss)
