"""The engine's build moves a model only where it read a part off the device: a model already there is not
walked by model.to; a module that moves itself its own way (an overridden _apply) is always asked."""
import torch
from torch import nn

from nbtrain import Engine, TrainConfig
from nbtrain.engine import toggles
from nbtrain.engine.toggles import moves_nothing

from helpers import regression_recipe


def _count_moves(monkeypatch):
    moves = []
    real = nn.Module.to
    monkeypatch.setattr(nn.Module, "to", lambda self, *a, **k: moves.append(self) or real(self, *a, **k))
    return moves


def test_a_model_already_on_the_device_is_not_moved_again(monkeypatch):
    recipe = regression_recipe()
    moves = _count_moves(monkeypatch)
    engine = Engine(recipe, TrainConfig(max_steps=1, accelerator="cpu"))
    assert recipe.model not in moves and moves_nothing(recipe.model, device=engine.device)


class _MovesItsOwnWay(nn.Linear):
    def _apply(self, fn, recurse=True):
        self.applied = True
        return super()._apply(fn, recurse)


def test_a_module_with_its_own_apply_and_a_part_off_the_device_are_moved():
    cpu = torch.device("cpu")
    assert not moves_nothing(nn.Sequential(_MovesItsOwnWay(2, 2)), device=cpu)
    assert not moves_nothing(nn.Linear(2, 2, device="meta"), device=cpu)
    grad_elsewhere = nn.Linear(2, 2, device="meta")
    grad_elsewhere.weight.grad = torch.zeros(2, 2, device="meta")
    assert not moves_nothing(grad_elsewhere, device=torch.device("cpu"))
    buffer_elsewhere = nn.BatchNorm1d(2)
    buffer_elsewhere.register_buffer("moved", torch.zeros(1, device="meta"))
    assert not moves_nothing(buffer_elsewhere, device=cpu) and moves_nothing(nn.BatchNorm1d(2), device=cpu)


def test_a_memory_format_is_set_wherever_a_4d_tensor_is_and_skipped_only_where_none_is(monkeypatch):
    moves = _count_moves(monkeypatch)
    flat, conv = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Conv2d(1, 2, 3))
    assert moves_nothing(flat, memory_format=torch.contiguous_format)
    assert not moves_nothing(conv, memory_format=torch.contiguous_format)
    toggles.set_memory_format(flat, False)
    toggles.set_memory_format(conv, True)
    assert moves == [conv] and conv[0].weight.is_contiguous(memory_format=torch.channels_last)
    toggles.set_memory_format(conv, False)
    assert moves == [conv, conv] and conv[0].weight.is_contiguous()


class _ShowsNoChildren(nn.Sequential):
    """A module whose children() hides its layers: model.to walks what children() gives."""

    def named_children(self):
        return iter(())


def test_a_module_walking_its_children_its_own_way_is_moved_and_a_cycle_ends():
    cpu = torch.device("cpu")
    assert not moves_nothing(_ShowsNoChildren(nn.Linear(2, 2)), device=cpu)
    shared = nn.Linear(2, 2)
    assert moves_nothing(nn.Sequential(shared, nn.Sequential(shared)), device=cpu)
    looped = nn.Sequential(nn.Linear(2, 2))
    looped[0].back = looped  # a module under itself: read once, not forever
    assert moves_nothing(looped, device=cpu)
    looped[0].register_buffer("elsewhere", torch.zeros(1, device="meta"))
    assert not moves_nothing(looped, device=cpu)
