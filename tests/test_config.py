import re
import subprocess
import sys

import pytest

from nbtrain import ConfigError, TrainConfig
from nbtrain.config import check_runnable, option_names
from nbtrain.hardware import Inventory, assume

CPU_ONLY = Inventory(cuda_devices=0, cuda_bf16=False, mps=False, cpu_cores=2)
TWO_GPUS = Inventory(cuda_devices=2, cuda_bf16=True, mps=False, cpu_cores=16)


def error_text(**values) -> str:
    with pytest.raises(ConfigError) as info:
        TrainConfig(**values)
    return str(info.value)


@pytest.mark.parametrize("values, fragments", [
    ({"batch_size": 0}, ["batch_size=0", "a whole number from 1 to"]),
    ({"batch_size": -4}, ["batch_size=-4", "from 1 to"]),
    ({"batch_size": 10**12}, ["batch_size=1000000000000", "from 1 to 16777216"]),
    ({"batch_size": "abc"}, ["batch_size='abc'", "whole number"]),
    ({"batch_size": 2.5}, ["batch_size=2.5"]),
    ({"batch_size": True}, ["batch_size=True"]),
    ({"num_workers": -1}, ["num_workers=-1", "from 0 to 256"]),
    ({"precision": "fp8"}, ["precision='fp8'", "32-true, 16-mixed, bf16-mixed"]),
    ({"accelerator": "tpu"}, ["accelerator='tpu'", "auto, cpu, cuda"]),
    ({"accumulate_grad_batches": 0}, ["accumulate_grad_batches=0", ">= 1"]),
    ({"max_epochs": 0}, ["max_epochs=0", ">= 1, or None"]),
    ({"max_steps": 0}, ["max_steps=0", "None / -1"]),
    ({"lr": -0.1}, ["lr=-0.1", "a number > 0"]),
    ({"lr": float("nan")}, ["lr=nan"]),
    ({"scale_lr": "cubic"}, ["scale_lr='cubic'", "none, linear, sqrt"]),
    ({"scale_lr": "linear"}, ["scale_lr='linear'", "needs base_batch_size"]),
    ({"persistent_workers": True}, ["persistent_workers=True", "needs num_workers >= 1"]),
    ({"prefetch_factor": 4}, ["prefetch_factor=4", "needs num_workers >= 1"]),
    ({"pin_memory": "maybe"}, ["pin_memory='maybe'", "true, false or auto"]),
    ({"seed": -1}, ["seed=-1"]),
    ({"log_every_n_steps": 0}, ["log_every_n_steps=0"]),
    ({"devices": 0}, ["devices=0", ">= 1"]),
    ({"num_nodes": 0}, ["num_nodes=0"]),
])
def test_each_bad_value_names_option_value_and_what_is_allowed(values, fragments):
    with assume(CPU_ONLY):
        text = error_text(**values)
    for fragment in fragments:
        assert fragment in text


@pytest.mark.parametrize("values, fragment", [
    ({"accelerator": "cuda"}, "accelerator='cuda': not available on this machine; available: cpu"),
    ({"precision": "16-mixed"}, "16-mixed needs a CUDA GPU"),
    ({"precision": "16", "accelerator": "cpu"}, "precision='16-mixed': 16-mixed needs a CUDA GPU"),
    ({"devices": 3}, "at most 2 CPU processes"),
    ({"strategy": "dp"}, "DataParallel needs at least 2 CUDA devices; this machine has 0"),
])
def test_hardware_problems_on_a_cpu_only_machine(values, fragment):
    config = TrainConfig(**values)  # a valid config: only this machine cannot run it
    with assume(CPU_ONLY), pytest.raises(ConfigError) as info:
        check_runnable(config)
    assert fragment in str(info.value)


def test_hardware_problems_on_a_two_gpu_machine():
    with assume(TWO_GPUS):
        config = TrainConfig(accelerator="gpu", devices=2, precision="16")
        check_runnable(config)
        assert config.device_type == "cuda"
        with pytest.raises(ConfigError, match="at most 2 \\(CUDA devices"):
            check_runnable(TrainConfig(accelerator="cuda", devices=3))
        check_runnable(TrainConfig(strategy="dp", devices=2))


def test_a_gpu_config_is_valid_on_a_gpu_less_machine_and_refused_only_when_run_here():
    import nbtrain
    from torch import nn
    from torch.utils.data import TensorDataset
    import torch
    config = TrainConfig(accelerator="cuda", devices=4, num_nodes=2, precision="16-mixed")  # for GPU nodes
    assert config.world_size == 8
    with assume(CPU_ONLY), pytest.raises(ConfigError, match="accelerator='cuda': not available on this machine"):
        nbtrain.fit(nn.Linear(2, 1), TensorDataset(torch.zeros(4, 2), torch.zeros(4, 1)), loss_fn=nn.MSELoss(),
                    config=config)


def test_all_problems_are_reported_together():
    with assume(CPU_ONLY), pytest.raises(ConfigError) as info:
        TrainConfig(batch_size=0, num_workers=-2, precision="fp8")
    assert [p.option for p in info.value.problems] == ["precision", "batch_size", "num_workers"]


def test_aliases_and_strings_are_normalised():
    with assume(CPU_ONLY):
        config = TrainConfig(precision="bf16", accelerator="CPU", batch_size="64", pin_memory="false",
                             max_steps=-1, lr="3e-4", seed="none")
    assert config.precision == "bf16-mixed" and config.accelerator == "cpu"
    assert config.batch_size == 64 and config.pin_memory is False
    assert config.max_steps is None and config.lr == 3e-4 and config.seed is None
    assert TrainConfig(precision=32).precision == "32-true"


def test_replace_validates_again_and_names_unknown_options():
    config = TrainConfig()
    assert config.replace(batch_size=8).batch_size == 8
    with pytest.raises(ConfigError, match="batch_size=0"):
        config.replace(batch_size=0)
    with pytest.raises(ConfigError, match="batchsize.*did you mean 'batch_size'"):
        config.replace(batchsize=8)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        TrainConfig().batch_size = 4


def test_global_batch_and_learning_rate_rules():
    with assume(CPU_ONLY):
        config = TrainConfig(batch_size=64, accumulate_grad_batches=2, devices=2, scale_lr="linear",
                             base_batch_size=64)
    assert config.global_batch_size == 256
    assert config.lr_factor() == 4.0
    assert config.replace(scale_lr="sqrt").lr_factor() == 2.0
    assert config.replace(scale_lr="none").lr_factor() == 1.0


def test_epoch_budget_defaults_to_one_epoch_only_without_a_step_limit():
    assert TrainConfig().epochs_budget == 1
    assert TrainConfig(max_steps=5).epochs_budget is None
    assert TrainConfig(max_steps=5, max_epochs=2).epochs_budget == 2


def test_round_trip_through_a_dict():
    config = TrainConfig(batch_size=16, precision="bf16-mixed")
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert set(config.to_dict()) == set(option_names())


def test_error_can_be_rendered_with_flag_names():
    with pytest.raises(ConfigError) as info:
        TrainConfig(batch_size=0)
    assert info.value.render(lambda o: "--" + o.replace("_", "-")).endswith(
        "--batch-size=0: a whole number from 1 to 16777216")


def test_a_checkpoint_interval_is_read_once_into_a_typed_value():
    import json
    by_time, by_steps = TrainConfig(checkpoint_every="10m"), TrainConfig(checkpoint_every=500)
    assert (by_time.checkpoint_every.seconds, by_time.checkpoint_every.steps) == (600.0, 0)
    assert (by_steps.checkpoint_every.steps, by_steps.checkpoint_every.seconds) == (500, 0.0)
    # Its canonical text is what is printed, stored and read back.
    assert by_time.checkpoint_every == "600s" and json.loads(json.dumps(by_time.to_dict()))["checkpoint_every"] == "600s"
    assert TrainConfig.from_dict(by_time.to_dict()).checkpoint_every.seconds == 600.0


def test_the_demos_help_says_each_flags_meaning_once():
    # `--devices INT  processes per node; more than 1 launches DDP workers; a whole number >= 1 (processes
    # per node; > 1 runs DDP)`: an option's help said what it does and its allowed values said it again.
    text = subprocess.run([sys.executable, "-m", "nbtrain", "demo", "--help"], capture_output=True, text=True,
                          check=True).stdout
    paragraphs = re.split(r"\n(?=  --)", text.split("training configuration", 1)[1])
    assert len(paragraphs) > 40, paragraphs[:3]
    for paragraph in paragraphs:
        words = re.findall(r"[a-z0-9_<>=$]+", paragraph.split(None, 2)[-1].lower())
        phrases = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
        repeated = {" ".join(p) for p in phrases if phrases.count(p) > 1}
        assert not repeated, f"said twice in {paragraph.split()[0]}: {repeated}\n{paragraph}"


_SOME_OPTIONS = [{}, {"batch_size": 8}, {"max_epochs": 2, "lr": 0.3, "precision": "bf16-mixed"},
                 {"checkpoint_every": "10m"}, {"checkpoint_every": 500, "seed": None}, {"max_steps": -1},
                 {"num_workers": 2, "log_every_n_steps": 3, "shuffle": False}]


@pytest.mark.parametrize("given", _SOME_OPTIONS)
def test_a_config_made_from_options_at_once_is_the_default_config_replaced(given):
    import dataclasses
    made, replaced = TrainConfig.with_options(**given), TrainConfig().replace(**given)
    assert made == replaced and made.given == replaced.given == frozenset(given)
    # to_dict's own reading of the values is asdict's: the same dict, the same kinds (an Interval stays one)
    assert made.to_dict() == dataclasses.asdict(made)
    assert [type(v) for v in made.to_dict().values()] == [type(v) for v in dataclasses.asdict(made).values()]


def test_a_config_made_from_options_at_once_refuses_an_unknown_name_as_replace_does():
    with pytest.raises(ConfigError) as at_once:
        TrainConfig.with_options(batch_sise=8)
    with pytest.raises(ConfigError) as replaced:
        TrainConfig().replace(batch_sise=8)
    assert str(at_once.value) == str(replaced.value) and "did you mean 'batch_size'" in str(at_once.value)
