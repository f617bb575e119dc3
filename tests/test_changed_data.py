"""A data set changed between two calls is trained on as it is now: held data is reused only while nbtrain
can show it is what it held (the tensors themselves and their versions, a Subset's indices, the lengths, part
by part; a Dataset of the user's own class is read again), and a data set whose length changed starts a new
epoch from its start (its sampler is the length's), said in the summary.

The generated cases: a TensorDataset, a Subset of one, a ConcatDataset of two, or a Dataset of the user's
own class, changed between calls (tensors replaced, changed in place, a Subset's indices changed or grown,
a field the Dataset reads), held or not (preload_data auto, True, False), in order or shuffled, each against
a plain loop reading the data set as it is at each batch, in the order nbtrain promises (DistributedSampler's
permutation seeded by seed + epoch). Weights bit for bit at fp32 on the CPU.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset
from torch.utils.data.dataloader import default_collate

import nbtrain
from nbtrain.api import live_engine
from nbtrain.engine.data import HeldBatches

from helpers import weights_differ

ROWS, FEATURES, CLASSES, BATCH, SEED = 96, 5, 3, 8, 123


def tensors(scale: float = 1.0):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(ROWS, FEATURES, generator=g) * scale
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long()


class Scaled(Dataset):
    """The user's own Dataset: its samples read a field the user may change."""

    def __init__(self, x, y, scale: float = 1.0):
        self.x, self.y, self.scale = x, y, scale

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] * self.scale, self.y[i]


def make_model() -> nn.Module:
    torch.manual_seed(6)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def fit(model, dataset, steps: int, preload, shuffle: bool):
    options = {} if preload == "auto" else {"preload_data": preload}
    result = nbtrain.fit(model, dataset, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                         max_steps=steps, batch_size=BATCH, shuffle=shuffle, seed=SEED, accelerator="cpu", **options)
    assert result.status == "completed", result.message
    return result


class PlainLoop:
    """SGD over the data set as it is at each batch, in DistributedSampler's order: the epoch goes on across
    calls while the length stays; a new length starts the epoch again from its start."""

    def __init__(self, model, shuffle: bool):
        self.model, self.shuffle = model, shuffle
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.epoch = self.offset = 0
        self.length = None

    def train(self, dataset, steps: int) -> None:
        if self.length is not None and len(dataset) != self.length:
            self.offset = 0
        self.length = n = len(dataset)
        for _ in range(steps):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(SEED + self.epoch)) if self.shuffle \
                else torch.arange(n)
            x, y = default_collate([dataset[int(i)] for i in order[self.offset:self.offset + BATCH]])
            nn.functional.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.offset += BATCH
            if self.offset >= n:
                self.epoch, self.offset = self.epoch + 1, 0


# --- the cases ----------------------------------------------------------------------


def test_replaced_tensors_are_trained_on_not_the_held_copy():
    x, y = tensors()
    d = TensorDataset(x, y)
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle=True)
    fit(model, d, 12, "auto", True)
    plain.train(d, 12)
    assert isinstance(live_engine(model).loader, HeldBatches)  # held: the case that went stale
    d.tensors = (x * 2, y)
    result = fit(model, d, 12, "auto", True)
    plain.train(d, 12)
    assert "training data: read again, its tensors were replaced" in result.summary.notes, result.summary.notes
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


@pytest.mark.parametrize("preload", ["auto", True])
def test_a_subset_whose_indices_change_trains_the_new_rows(preload):
    d = Subset(TensorDataset(*tensors()), list(range(0, 40)))
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle=False)
    fit(model, d, 3, preload, False)
    plain.train(d, 3)
    d.indices = list(range(50, 90))
    result = fit(model, d, 3, preload, False)
    plain.train(d, 3)
    assert "training data: read again, its indices changed" in result.summary.notes, result.summary.notes
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


def test_a_held_dataset_of_the_users_own_class_is_read_again_after_the_user_changes_it():
    d = Scaled(*tensors())
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle=True)
    fit(model, d, 5, True, True)
    plain.train(d, 5)
    d.scale = 3.0
    result = fit(model, d, 5, True, True)
    plain.train(d, 5)
    assert any("cannot tell whether a Dataset of its own class changed" in n for n in result.summary.notes)
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


@pytest.mark.parametrize("preload", ["auto", True, False])
def test_a_subset_that_grows_between_calls_starts_a_new_epoch_over_all_its_rows(preload):
    d = Subset(TensorDataset(*tensors()), list(range(32)))
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle=True)
    fit(model, d, 2, preload, True)  # stopped mid-epoch
    plain.train(d, 2)
    d.indices = list(range(96))  # DistributedSampler of the old length: "Number of indices ... total_size"
    result = fit(model, d, 5, preload, True)
    plain.train(d, 5)
    assert "training data: its length changed (32 -> 96): a new epoch from its start" in result.summary.notes
    assert weights_differ(model, twin) is None, weights_differ(model, twin)


# --- generated: data set kind x change x held or not x order -------------------------------


KINDS = {"tensors": ("replaced", "in place"), "subset": ("indices changed", "indices grown", "in place"),
         "concat": ("part replaced", "in place"), "own class": ("field changed",)}


@dataclass
class Case:
    kind: str
    change: str
    preload: object
    shuffle: bool
    steps: list = field(default_factory=list)

    def __str__(self):
        return f"{self.kind} {self.change} preload={self.preload} {'shuffled' if self.shuffle else 'in order'} " \
               f"steps:{self.steps}"


def make(kind: str):
    x, y = tensors()
    if kind == "tensors":
        return TensorDataset(x, y)
    if kind == "subset":
        return Subset(TensorDataset(x, y), list(range(10, 50)))
    if kind == "concat":
        return ConcatDataset([TensorDataset(x[:40], y[:40]), TensorDataset(x[40:], y[40:])])
    return Scaled(x, y)


def change(dataset, kind: str, what: str) -> None:
    if what == "replaced":
        dataset.tensors = (dataset.tensors[0] * -1, dataset.tensors[1])
    elif what == "in place":
        inner = dataset.datasets[0] if kind == "concat" else dataset.dataset if kind == "subset" else dataset
        inner.tensors[0].mul_(2)
    elif what == "indices changed":
        dataset.indices = list(range(40, 80))
    elif what == "indices grown":
        dataset.indices = list(range(10, 90))
    elif what == "part replaced":
        x, y = tensors(0.5)
        dataset.datasets[1].tensors = (x[40:], y[40:])
    else:
        dataset.scale = 2.5


def cases() -> list[Case]:
    rng = random.Random(3705)
    return [Case(kind, what, preload, rng.random() < 0.5, [rng.randint(2, 7) for _ in range(rng.randint(2, 3))])
            for kind, changes in KINDS.items() for what in changes for preload in ("auto", True, False)]


@pytest.mark.parametrize("case", cases(), ids=str)
def test_a_data_set_changed_between_calls_trains_as_the_plain_loop_reading_it_as_it_is(case):
    dataset = make(case.kind)
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, case.shuffle)
    for call, steps in enumerate(case.steps):
        if call:
            change(dataset, case.kind, case.change)
        result = fit(model, dataset, steps, case.preload, case.shuffle)
        plain.train(dataset, steps)
        problem = weights_differ(model, twin)
        assert problem is None, f"{problem} after call {call + 1} of {case}; notes: {result.summary.notes}"


def test_the_generated_cases_hold_the_data_where_the_rule_allows_and_cover_every_change():
    made = cases()
    assert {c.change for c in made} == {w for changes in KINDS.values() for w in changes}
    model = make_model()
    fit(model, make("concat"), 2, True, False)
    assert isinstance(live_engine(model).loader, HeldBatches)  # a ConcatDataset held, then shown unchanged or not
