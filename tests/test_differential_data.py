"""nbtrain against a plain hand-written loop for the data a user brings, on generated cases.

Each case is a sequence of `nbtrain.fit` calls on one live model, as notebook cells make them, each
call stopping mid-epoch or past it (max_steps):
- a DataLoader whose own sampler or batch_sampler decides its batches (a WeightedRandomSampler,
  sampling with replacement, a custom batch_sampler), its random order drawn
  from the sampler's own generator or from torch's: the plain loop keeps one iterator over the same
  loader, so a call that stops mid-epoch is continued by the next with the rest of that epoch's order;
- a plain DataLoader (torch's BatchSampler, given as batch_size= or as batch_sampler=, or a train split by
  SubsetRandomSampler, which nbtrain trains as a Subset of those rows in its own order), its settings
  taken unless the call gives an option, at nbtrain's default value too (batch_size=32, shuffle=True,
  drop_last=False, num_workers=0 win over the loader's), batches through the DataLoader or held;
- a stream (an IterableDataset) whose batch size changes between calls: it continues at the next item.
The plain loop trains on the order nbtrain promises: the user's loader's, or (for a loader nbtrain
rebuilds) DistributedSampler's permutation seeded by seed + epoch. Weights must be bit-identical at fp32.

NBTRAIN_DIFFERENTIAL_DATA_CASES (default 36) sets how many cases are generated;
NBTRAIN_DIFFERENTIAL_SEED picks another set.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, TensorDataset, WeightedRandomSampler)

import nbtrain
from nbtrain.engine import data as engine_data

N, FEATURES, CLASSES = 60, 5, 3
CASES = int(os.environ.get("NBTRAIN_DIFFERENTIAL_DATA_CASES", "36"))
SEED = int(os.environ.get("NBTRAIN_DIFFERENTIAL_SEED", "2026"))
OWN_ORDERS = ("weighted-sampler", "with-replacement", "custom-batch-sampler")
REBUILT = ("plain-loader", "torch-batch-sampler", "split-sampler")  # nbtrain cuts the batches, any option given
KINDS = OWN_ORDERS + REBUILT + ("stream",)
SPLIT = range(5, 45)  # the rows a SubsetRandomSampler trains on
DEFAULTS = {"batch_size": 32, "shuffle": True, "drop_last": False, "num_workers": 0}


@dataclass
class Call:
    steps: int
    given: dict = field(default_factory=dict)  # options given to this fit call, nbtrain's defaults among them


@dataclass
class Case:
    kind: str
    dropout: bool
    own_generator: bool = False  # the sampler draws from its own generator (else from torch's)
    loader: dict = field(default_factory=dict)  # the plain loader's settings
    preload_data: bool | None = None
    calls: list = field(default_factory=list)

    def __str__(self):
        words = [self.kind] + (["dropout"] if self.dropout else []) + (["own-generator"] if self.own_generator else [])
        words += [f"loader:{k}={v}" for k, v in self.loader.items()]
        words += [] if self.preload_data is None else [f"preload={self.preload_data}"]
        for call in self.calls:
            words.append(f"{call.steps}steps" + "".join(f"/{k}={v}" for k, v in call.given.items()))
        return " ".join(words)


def generate(rng: random.Random) -> Case:
    kind = rng.choice(KINDS)
    case = Case(kind, dropout=rng.random() < 0.4, own_generator=rng.random() < 0.5)
    calls = rng.randint(2, 3)
    if kind in OWN_ORDERS:  # the loader's own order: no batching option can be given
        case.preload_data = rng.choice((None, True))
        case.calls = [Call(rng.randint(2, 9)) for _ in range(calls)]
    elif kind == "stream":
        drop_last = rng.random() < 0.3
        case.calls = [Call(rng.randint(2, 6), {"batch_size": rng.choice((4, 7, 10, 16, 32)),
                                               **({"drop_last": True} if drop_last else {})}) for _ in range(calls)]
    else:
        case.loader = {"batch_size": rng.choice((8, 12, 64)), "shuffle": kind == "split-sampler" or rng.random() < 0.5,
                       "drop_last": rng.random() < 0.3, "num_workers": 1 if rng.random() < 0.1 else 0}
        case.preload_data = rng.choice((None, True, False))
        for _ in range(calls):
            given = {}
            for name, values in (("batch_size", (32, 5, 8)), ("shuffle", (True, False)),
                                 ("drop_last", (False, True)), ("num_workers", (0,))):
                if rng.random() < 0.35:
                    given[name] = rng.choice(values)
            if rng.random() < 0.5:  # an option given at nbtrain's default value, against the loader's other one
                name = rng.choice(list(DEFAULTS))
                given[name] = DEFAULTS[name]
            case.calls.append(Call(rng.randint(2, 7), given))
            if settings(case, case.calls[-1])["drop_last"] and settings(case, case.calls[-1])["batch_size"] > \
                    (len(SPLIT) if kind == "split-sampler" else N):
                given["drop_last"] = False  # an epoch with no full batch is refused (tests/test_bad_input.py)
    return case


# --- the data, built the same way for both sides ------------------------------------------


def rows() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, FEATURES, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


class Stream(IterableDataset):
    def __init__(self):
        self.rows = rows()

    def __iter__(self):
        for i in range(N):
            yield self.rows[i]


def user_loader(case: Case, dataset):
    """The DataLoader the user wrote (each side builds its own, identically)."""
    g = torch.Generator().manual_seed(99) if case.own_generator else None
    if case.kind == "split-sampler":
        return DataLoader(dataset, batch_size=case.loader["batch_size"], drop_last=case.loader["drop_last"],
                          num_workers=case.loader["num_workers"], sampler=SubsetRandomSampler(SPLIT, generator=g))
    if case.kind == "weighted-sampler":
        weights = [1.0 + (i % 4) for i in range(N)]
        return DataLoader(dataset, batch_size=6, sampler=WeightedRandomSampler(weights, 30, generator=g))
    if case.kind == "with-replacement":
        return DataLoader(dataset, batch_size=8, sampler=RandomSampler(dataset, replacement=True, num_samples=40,
                                                                       generator=g))
    if case.kind == "custom-batch-sampler":
        class Buckets(BatchSampler):  # the user's own batching (e.g. by length)
            pass
        return DataLoader(dataset, batch_sampler=Buckets(RandomSampler(dataset, generator=g), 9, False))
    if case.kind == "torch-batch-sampler":
        inner = RandomSampler(dataset, generator=g) if case.loader["shuffle"] else SequentialSampler(dataset)
        return DataLoader(dataset, batch_sampler=BatchSampler(inner, case.loader["batch_size"],
                                                              case.loader["drop_last"]),
                          num_workers=case.loader["num_workers"])
    return DataLoader(dataset, generator=g, **case.loader)


def make_model(case: Case) -> nn.Module:
    torch.manual_seed(11)
    layers = [nn.Linear(FEATURES, 10), nn.Tanh()] + ([nn.Dropout(0.25)] if case.dropout else [])
    return nn.Sequential(*layers, nn.Linear(10, CLASSES))


def make_optimizer(model: nn.Module):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


# --- the plain loops ------------------------------------------------------------------


def step(model, optimizer, x, y) -> None:
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def plain_over_the_loader(case: Case, seed: int) -> nn.Module:
    """One iterator over the user's loader, kept across cells; a new epoch when it runs out."""
    model = make_model(case)
    optimizer = make_optimizer(model)
    torch.manual_seed(seed)  # nbtrain.fit(seed=...) seeds torch's generator when it starts
    loader = user_loader(case, rows())
    batches = iter(loader)
    for call in case.calls:
        done = 0
        while done < call.steps:
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                continue
            step(model, optimizer, x, y)
            done += 1
    return model


def settings(case: Case, call: Call) -> dict:
    """What this call trains with: each option given wins, else the loader's (a stream: its items in order)."""
    if case.kind == "stream":
        return {"batch_size": call.given["batch_size"], "shuffle": False,
                "drop_last": call.given.get("drop_last", False), "num_workers": 0}
    return {name: call.given.get(name, case.loader[name]) for name in DEFAULTS}


def plain_in_order(case: Case, seed: int) -> nn.Module:
    """The loop over the order nbtrain promises: for a loader it rebuilds, DistributedSampler's permutation
    seeded by seed + epoch (or the data set's order) of its rows (a split's: its own); for a stream, its
    items pass after pass. Each call's batch size continues from where the last call left off."""
    model = make_model(case)
    optimizer = make_optimizer(model)
    torch.manual_seed(seed)
    dataset = rows()
    own_rows = torch.as_tensor(list(SPLIT)) if case.kind == "split-sampler" else torch.arange(N)
    n = len(own_rows)
    epoch = offset = 0

    def next_size(now) -> int:  # 0: the epoch (the pass) is over, a short last batch dropped
        size = min(now["batch_size"], n - offset)
        return 0 if now["drop_last"] and size < now["batch_size"] else size

    for call in case.calls:
        now, done = settings(case, call), 0
        while done < call.steps:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)) if now["shuffle"] \
                else torch.arange(n)
            size = next_size(now)
            if not size:
                epoch, offset = epoch + 1, 0
                continue
            # gathered: a fresh batch, as a collate makes (a view into the data set's tensors at an unaligned
            # offset can take another matmul kernel: last-bit changes)
            if offset == 0:  # a pass of the loader starts: iter(DataLoader) draws its base seed
                torch.empty((), dtype=torch.int64).random_()
            x, y = dataset[own_rows[order[offset:offset + size]]]
            step(model, optimizer, x, y)
            offset += size
            done += 1
            if case.kind != "stream" and not next_size(now):  # a loader's epoch ends with its last batch (a
                epoch, offset = epoch + 1, 0                    # stream's only when the next read finds none)
    return model


# --- nbtrain, as a notebook user drives it ---------------------------------------------


def play_nbtrain(case: Case, seed: int) -> nn.Module:
    model = make_model(case)
    optimizer = make_optimizer(model)
    dataset = rows()
    train_data = Stream() if case.kind == "stream" else user_loader(case, dataset)  # one cell above the others
    for call in case.calls:
        options = dict(call.given, max_steps=call.steps, seed=seed, accelerator="cpu")
        if case.preload_data is not None:
            options["preload_data"] = case.preload_data
        result = nbtrain.fit(model, train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, **options)
        assert result.status == "completed", result.message
        if case.kind in REBUILT:
            for name, value in settings(case, call).items():
                assert getattr(result.config, name) == value, f"{name}: {getattr(result.config, name)} in {case}"
    engine = nbtrain.api.live_engine(model)
    if case.kind in OWN_ORDERS:
        assert not isinstance(engine.loader, engine_data.HeldBatches), f"held data replaced the loader in {case}"
    return model


def _cases():
    rng = random.Random(SEED + 1)
    return [generate(rng) for _ in range(CASES)]


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_nbtrain_trains_on_the_users_data_exactly_as_the_plain_loop(case):
    seed = 1000 + sum(map(ord, str(case))) % 1000
    reference = (plain_over_the_loader if case.kind in OWN_ORDERS else plain_in_order)(case, seed)
    trained = play_nbtrain(case, seed)
    for (name, a), b in zip(trained.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} in {case}"


def test_the_generated_cases_cover_every_kind_and_every_default_given():
    cases = _cases()
    assert {c.kind for c in cases} == set(KINDS)
    given = {(k, v) for c in cases for call in c.calls for k, v in call.given.items()}
    assert set(DEFAULTS.items()) <= given
