"""A run's workload digest (engine/workload.py): equal for the same code, data and shapes, different where
any of them changes what a step does; None where a part cannot be read. Runs with equal digests and configs
are compared as an A/A check, never with a speed verdict (runs/compare.py)."""
import functools
import re

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import nbtrain
from nbtrain import Recipe
from nbtrain.engine.workload import digest
from nbtrain.measure.withheld import SAME_SETTINGS
from nbtrain.runs.repeats import same_settings


class Twice(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.net = nn.Linear(width, 1)

    def forward(self, x):
        return self.net(x) * 2


class Thrice(nn.Module):  # the same modules and shapes as Twice: only its forward's code differs
    def __init__(self, width=8):
        super().__init__()
        self.net = nn.Linear(width, 1)

    def forward(self, x):
        return self.net(x) * 3


class Pairs(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 8), torch.randn(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _recipe(model=None, data=None, lr=0.1, loss=None, step=None):
    torch.manual_seed(0)
    return Recipe(model=model if model is not None else Twice(), train_data=data if data is not None else Pairs(64),
                  loss_fn=loss if loss is not None else (None if step else nn.MSELoss()), training_step=step,
                  optimizer=lambda p: torch.optim.SGD(p, lr=lr))


def test_the_same_code_data_and_shapes_give_one_digest_built_afresh():
    assert digest(_recipe()) == digest(_recipe()) is not None  # new objects, new weights: the same work
    assert digest(_recipe(data=TensorDataset(torch.randn(64, 8), torch.randn(64, 1)))) == \
        digest(_recipe(data=TensorDataset(torch.zeros(64, 8), torch.zeros(64, 1))))  # values are not work


class Waits(nn.Module):
    def __init__(self, wait_s):
        super().__init__()
        self.wait_s, self.net = wait_s, nn.Linear(8, 1)

    def forward(self, x):
        return self.net(x) + self.wait_s


@pytest.mark.parametrize("change", ["forward's code", "a module's own setting", "a partial's argument", "width", "data length", "data type", "optimizer's lr",
                                    "loss", "training_step", "a DataLoader's batch"])
def test_anything_that_changes_a_step_changes_the_digest(change):
    def step_a(model, batch):
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    def step_b(model, batch):
        return nn.functional.l1_loss(model(batch[0]), batch[1])
    base, other = {
        "forward's code": (_recipe(), _recipe(model=Thrice())),
        "a partial's argument": (_recipe(loss=functools.partial(nn.functional.huber_loss, delta=1.0)),
                                 _recipe(loss=functools.partial(nn.functional.huber_loss, delta=2.0))),
        "a module's own setting": (_recipe(model=Waits(0.1)), _recipe(model=Waits(0.13))),
        "width": (_recipe(data=TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), model=Twice(4)),
                  _recipe(data=TensorDataset(torch.randn(64, 6), torch.randn(64, 1)), model=Twice(6))),
        "data length": (_recipe(), _recipe(data=Pairs(65))),
        "data type": (_recipe(), _recipe(data=TensorDataset(torch.randn(64, 8), torch.randn(64, 1)))),
        "optimizer's lr": (_recipe(), _recipe(lr=0.2)),
        "loss": (_recipe(), _recipe(loss=nn.L1Loss())),
        "training_step": (_recipe(step=step_a), _recipe(step=step_b)),
        "a DataLoader's batch": (_recipe(data=DataLoader(Pairs(64), batch_size=8)),
                                 _recipe(data=DataLoader(Pairs(64), batch_size=16))),
    }[change]
    assert None not in (digest(base), digest(other)) and digest(base) != digest(other)


def test_a_model_trained_again_with_the_same_settings_keeps_its_digest():
    # nbtrain keeps its live engine on the user's module (a Slot): the engine's steps, log and notes are
    # nbtrain's state, not the user's work, and must not make a later call's digest another one
    recipe = _recipe()
    first, later = _fit(recipe, 4, "first"), _fit(recipe, 4, "later")
    assert first.summary.workload == later.summary.workload is not None


def test_a_part_it_cannot_read_gives_no_digest():
    class Opaque:  # neither a dataset nor anything with items: nbtrain cannot tell what it holds
        pass
    recipe = _recipe()
    object.__setattr__(recipe, "train_data", Opaque())
    assert digest(recipe) is None


def _fit(recipe, steps, name, **options):
    return nbtrain.fit(recipe=recipe, max_steps=steps, batch_size=8, accelerator="cpu", name=name, **options)


def test_runs_of_the_same_settings_are_an_a_a_check_and_a_changed_one_gets_its_verdict():
    a, b = _fit(_recipe(), 40, "a"), _fit(_recipe(), 40, "b")
    assert a.summary.workload == b.summary.workload is not None and same_settings(a, b)
    comparison = nbtrain.compare(a, b)
    assert re.fullmatch(r"same settings \(A/A\): .*", comparison.rows[1]["vs first"]), comparison.rows
    assert SAME_SETTINGS in comparison.notes
    # another config (the seed), the same code: a comparison of settings, with its own rules
    c = _fit(_recipe(), 40, "c", seed=1)
    assert not same_settings(a, c)
    assert not nbtrain.compare(a, c).rows[1]["vs first"].startswith("same settings")
    # another forward: not the same settings either, though every config option is
    d = _fit(_recipe(model=Thrice()), 40, "d")
    assert not same_settings(a, d) and not d.config.changed_from(a.config)


def test_a_stored_run_keeps_its_digest_and_one_from_before_digests_has_none(tmp_path):
    from nbtrain.runs.store import RunStore
    store = RunStore(tmp_path / "runs.sqlite")
    a = _fit(_recipe(), 10, "a")
    store.record(a)
    assert store.load("a").summary.workload == a.summary.workload
    old = a.summary.replace(workload=None)  # a store written before the digest: never "the same settings"
    assert not same_settings(a.__class__(a.config, a.log, old), a)


class _Hides(nn.Module):
    """A module whose class walks its own way: it shows only its first layer's parameters."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(2, 2), nn.Linear(2, 2)

    def named_parameters(self, *args, **kwargs):
        return self.first.named_parameters(prefix="first")


def _generated_models():
    """Modules with what nn.Module's walks step around: a submodule held twice, a weight tied between two
    layers, a parameter and a buffer set to None, a buffer shared by two modules, nesting, and a class
    walking its own way."""
    for seed in range(24):
        g = torch.Generator().manual_seed(seed)
        draw = lambda n: int(torch.randint(0, n, (), generator=g))  # noqa: E731
        layers = [nn.Linear(3, 3, bias=bool(draw(2))) for _ in range(1 + draw(3))]
        if draw(2):
            layers.append(layers[0])  # the same submodule at a second place
        if draw(2) and len(layers) > 1:
            layers[-1].weight = layers[0].weight  # tied
        model = nn.Sequential(*layers, nn.Sequential(nn.BatchNorm1d(3), nn.Sequential(nn.Linear(3, 3))))
        if draw(2):
            model.register_buffer("nothing", None)
        if draw(2):
            shared = torch.zeros(2)
            model[0].register_buffer("shared", shared)
            model[-1].register_buffer("shared_too", shared)
        if draw(2):
            model[0].register_parameter("absent", None)
        yield model
    yield _Hides()
    yield nn.Sequential(_Hides(), nn.Linear(2, 2))


@pytest.mark.parametrize("model", list(_generated_models()), ids=lambda m: type(m).__name__)
def test_the_one_walk_of_a_model_reads_what_its_three_walks_read(model):
    from nbtrain.engine import walks
    modules, parameters, buffers = walks.walked(model)
    assert [id(p) for p in walks.parameters(model)] == [id(p) for p in model.parameters()]
    assert [(n, id(m)) for n, m in modules] == [(n, id(m)) for n, m in model.named_modules()]
    assert [(n, id(p)) for n, p in parameters] == [(n, id(p)) for n, p in model.named_parameters()]
    assert [(n, id(b)) for n, b in buffers] == [(n, id(b)) for n, b in model.named_buffers()]
