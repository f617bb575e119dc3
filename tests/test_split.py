"""A model split across devices, and DataParallel: the checklist's other multi-device strategies."""
import sys

import cloudpickle
import pytest
import torch

from nbtrain.config import check_runnable
from torch import nn

import nbtrain
from nbtrain import ConfigError, Engine, Recipe, TrainConfig
from nbtrain.demo import DigitsDataset
from nbtrain.engine.split import device_map, input_device, unsplit

from helpers import same_weights, weights

cloudpickle.register_pickle_by_value(sys.modules[__name__])

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


class EncoderDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.decoder = nn.Linear(32, 10)

    def forward(self, x):
        return self.decoder(self.encoder(x))


def _recipe(seed=0):
    torch.manual_seed(seed)
    return Recipe(model=EncoderDecoder(), train_data=DigitsDataset(), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1))


def test_split_records_the_map_and_computes_what_the_whole_model_computes():
    model = EncoderDecoder()
    x = torch.randn(5, 64)
    expected = model(x)
    assert nbtrain.split(model, {"encoder": "cpu", "decoder": "cpu"}) is model
    assert device_map(model) == {"encoder": "cpu", "decoder": "cpu"} and input_device(model) == torch.device("cpu")
    assert torch.equal(model(x), expected)
    unsplit(model)
    assert device_map(model) is None and not model._forward_pre_hooks and not model.encoder._forward_pre_hooks


def test_the_engine_trains_a_split_model_like_the_same_model_unsplit():
    whole, parted = _recipe(), _recipe()
    nbtrain.split(parted.model, {"encoder": "cpu", "decoder": "cpu"})
    config = TrainConfig(batch_size=32, max_steps=10, accelerator="cpu")
    engine = Engine(parted, config)
    assert engine.device == torch.device("cpu") and engine.train_model is parted.model
    engine.run()
    Engine(whole, config).run()
    assert same_weights(weights(parted.model), weights(whole.model), atol=1e-6)


@pytest.mark.slow
def test_a_split_model_trains_under_ddp_and_its_weights_come_back():
    whole, parted = _recipe(), _recipe()
    nbtrain.split(parted.model, {"encoder": "cpu", "decoder": "cpu"})
    result = nbtrain.fit(recipe=parted, config=TrainConfig(devices=2, batch_size=16, shuffle=False, max_steps=5,
                                                           accelerator="cpu"))
    Engine(whole, TrainConfig(batch_size=32, shuffle=False, max_steps=5, accelerator="cpu")).run()
    assert result.status == "completed"
    assert same_weights(weights(parted.model), weights(whole.model), atol=1e-5)


def test_a_bad_device_map_names_each_part_its_device_and_what_is_allowed():
    model = EncoderDecoder()
    with pytest.raises(ValueError, match=r"'encodr': no such submodule; did you mean 'encoder'"):
        nbtrain.split(model, {"encodr": "cpu", "decoder": "cpu"})
    with pytest.raises(ValueError, match=r"'decoder': device 'gpu9' is not a device; allowed: 'cpu', 'cuda:N'"):
        nbtrain.split(model, {"encoder": "cpu", "decoder": "gpu9"})
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"'decoder': device 'cuda:{count}' is not available; this machine has "
                                         rf"{count} CUDA device"):
        nbtrain.split(model, {"encoder": "cpu", "decoder": f"cuda:{count}"})
    with pytest.raises(ValueError, match=r"parameters outside every mapped part: decoder.weight, decoder.bias"):
        nbtrain.split(model, {"encoder": "cpu"})
    with pytest.raises(ValueError, match=r"'encoder.0' lies inside 'encoder'"):
        nbtrain.split(model, {"encoder": "cpu", "encoder.0": "cpu", "decoder": "cpu"})
    with pytest.raises(ValueError, match=r"device_map=\{\}: allowed: a dict of submodule name -> device"):
        nbtrain.split(model, {})
    assert device_map(model) is None


@pytest.mark.cuda
def test_on_a_gpu_the_engine_leaves_each_part_where_split_put_it():
    recipe = _recipe()
    nbtrain.split(recipe.model, {"encoder": "cuda:0", "decoder": "cpu"})
    result = Engine(recipe, TrainConfig(accelerator="cuda", batch_size=32, max_steps=5)).run()
    assert result.status == "completed"
    assert {p.device.type for p in recipe.model.encoder.parameters()} == {"cuda"}
    assert {p.device.type for p in recipe.model.decoder.parameters()} == {"cpu"}


@pytest.mark.cuda
@two_gpus
def test_a_model_split_over_two_gpus_trains_with_activations_crossing_between_them():
    recipe = _recipe()
    nbtrain.split(recipe.model, {"encoder": "cuda:0", "decoder": "cuda:1"})
    result = Engine(recipe, TrainConfig(accelerator="cuda", batch_size=32, max_steps=5)).run()
    assert result.summary.last_loss < result.summary.first_loss
    assert next(recipe.model.decoder.parameters()).device == torch.device("cuda", 1)


def test_dataparallel_needs_two_cuda_devices_and_says_so():
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 CUDA devices")
    with pytest.raises(ConfigError, match=r"strategy='dp': DataParallel needs at least 2 CUDA devices; this machine "
                                          r"has \d+; use ddp"):
        check_runnable(TrainConfig(strategy="dp", devices=2))


@pytest.mark.cuda
@two_gpus
def test_dataparallel_trains_in_the_kernel_with_the_batch_spread_over_the_gpus():
    recipe = _recipe()
    result = nbtrain.fit(recipe=recipe, config=TrainConfig(strategy="dp", devices=2, accelerator="cuda",
                                                           batch_size=16, max_steps=5))
    assert result.status == "completed" and result.summary.global_batch == 32
    assert result.history["samples"][-1] == 5 * 32
