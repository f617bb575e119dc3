"""preload_data: batches cut from data held in memory are the DataLoader's batches, bit for bit.

The differential test runs every generated case both ways on a TensorDataset; these tests add a
custom Dataset (held only when asked), every rank of a DDP split, live batch-size changes,
crashes and resumes, and the reasons given where holding the data does not apply.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

import nbtrain
from nbtrain import Recipe, TrainConfig
from nbtrain.engine import data
from nbtrain.engine.dist import World
from nbtrain.engine.engine import Engine
from helpers import regression_data, regression_recipe


class DictSamples(Dataset):
    """A custom map-style Dataset: dict samples with a tensor and a Python number."""

    def __init__(self, n=90):
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(n, 5, generator=g), torch.randn(n, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": float(self.y[i]), "i": i}


class Augmented(DictSamples):
    def __getitem__(self, i):
        sample = super().__getitem__(i)
        sample["x"] = sample["x"] + torch.randn(5)  # a new sample at each read
        return sample


def _same_batch(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same_batch(a[k], b[k]) for k in a)
    return type(a) is type(b) and len(a) == len(b) and all(_same_batch(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dataset", [regression_data(n=50), DictSamples(47),
                                     Subset(regression_data(n=60), range(5, 52))],
                         ids=["tensor-dataset", "dict-samples", "subset"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_held_batches_are_the_dataloaders_batches_on_every_rank_from_any_position(dataset, world_size):
    config = TrainConfig(batch_size=8, drop_last=True, preload_data=True)
    for rank in range(world_size):
        world = World(rank=rank, size=world_size)
        held, note = data.hold(dataset, config, world, torch.device("cpu"))
        assert held is not None and held.shard == (world_size > 1), note
        for epoch, start, size, drop_last in ((0, 0, 8, True), (1, 5, 3, False), (2, 13, 16, False)):
            c = config.replace(batch_size=size, drop_last=drop_last)
            loader, cut = data.build_loader(dataset, c, world, seed=5), data.HeldBatches(held, c, world, seed=5)
            loader.sampler.set_position(epoch, start)
            cut.sampler.set_position(epoch, start)
            expected, got = list(loader), list(cut)
            assert len(expected) == len(got) > 0
            assert all(_same_batch(a, b) for a, b in zip(expected, got))


@pytest.mark.parametrize("samples", [1, 2, 50])
@pytest.mark.parametrize("ranks", [1, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_held_batches_draw_their_order_as_the_dataloaders_sampler_does(samples, ranks, shuffle):
    """Held batches take the order as one tensor; fewer samples than ranks pad it more than once over."""
    dataset = regression_data(n=samples)
    for rank in range(ranks):
        sampler = data.EpochSampler(dataset, World(rank=rank, size=ranks), shuffle, seed=3)
        for epoch, start in ((0, 0), (1, 1), (4, 0)):
            sampler.set_position(epoch, start)
            assert sampler.order().tolist() == list(sampler)


@pytest.mark.parametrize("samples, batch_size, batches", [(60, 5, 12), (95, 30, 4)],
                         ids=["batches-copied-one-by-one", "batches-padded-in-the-gather"])
def test_a_held_batch_gives_the_gradients_of_the_dataloaders_batch_at_any_offset(samples, batch_size, batches):
    # 5 features of 4 bytes: a batch of 5 rows starts 100 bytes further each time, off the 64-byte alignment
    # every fresh (collated) tensor has; a matmul on a misaligned slice can differ in the last bit. A batch
    # of 5 rows would need 11 rows of padding to start aligned (copied instead); one of 30 needs 2.
    g = torch.Generator().manual_seed(7)
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 5, generator=g),
                                             torch.randn(samples, 3, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 10), nn.Tanh(), nn.Linear(10, 3))
    config = TrainConfig(batch_size=batch_size, shuffle=False, preload_data=True)
    held, _ = data.hold(dataset, config, World(), torch.device("cpu"))
    pairs = list(zip(data.HeldBatches(held, config, World(), 0), data.build_loader(dataset, config, World(), 0)))
    assert len(pairs) == batches
    assert all(t.data_ptr() % 64 == 0 for held_batch, _ in pairs for t in held_batch)
    for held_batch, loader_batch in pairs:
        grads = []
        for x, y in (held_batch, loader_batch):
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads))


def _scripted(loss_fn, plan):
    """A loss that, at given calls, asks the live engine for a change or raises (a crash)."""
    calls = {"n": 0}

    def step(model, batch):
        calls["n"] += 1
        action = plan.get(calls["n"])
        if action == "crash":
            raise RuntimeError("simulated crash")
        if action:
            nbtrain.api.live_engine(model).request(**action)
        return loss_fn(model(batch["x"]).squeeze(1), batch["y"].float())
    return step


def _train(preload_data, folder):
    """Two runs on a custom Dataset, as a notebook makes them: live batch-size and accumulation changes
    mid-epoch, a crash after checkpoints, then a resume (into a fresh model) with another batch size."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 12), nn.Dropout(0.2), nn.Tanh(), nn.Linear(12, 1))
    dataset = DictSamples()
    options = dict(seed=7, accelerator="cpu", preload_data=preload_data, checkpoint_every="2",
                   checkpoint_dir=str(folder))
    first = model()
    plan = {3: {"batch_size": 5}, 7: {"accumulate_grad_batches": 2}, 12: {"batch_size": 16}, 17: "crash"}
    with pytest.raises(RuntimeError, match="simulated crash"):
        nbtrain.fit(first, dataset, training_step=_scripted(nn.MSELoss(), plan),
                    optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), batch_size=8, max_steps=30, **options)
    second = model()
    nbtrain.fit(second, dataset, training_step=_scripted(nn.MSELoss(), {4: {"batch_size": 7}}),
                optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), batch_size=6, max_steps=30, resume="last",
                **options)
    engine = nbtrain.api.live_engine(second)
    assert isinstance(engine.loader, data.HeldBatches) == preload_data
    return [p.detach().clone() for p in second.parameters()], engine.position()


@pytest.mark.slow
def test_both_paths_train_bit_identical_weights_through_live_changes_and_a_resume(tmp_path):
    loaded, loaded_at = _train(False, tmp_path / "loader")
    held, held_at = _train(True, tmp_path / "held")
    assert loaded_at == held_at and loaded_at["epoch"] >= 2
    assert all(torch.equal(a, b) for a, b in zip(loaded, held))


def test_auto_holds_a_tensor_dataset_and_states_what_it_costs():
    engine = Engine(regression_recipe(), TrainConfig(batch_size=16, max_steps=3))
    assert isinstance(engine.loader, data.HeldBatches)
    result = engine.run()
    assert any("TensorDataset's own tensors (no copy)" in n for n in result.summary.notes)
    engine.request(preload_data=False)
    assert isinstance(engine.loader, torch.utils.data.DataLoader) and "preload_data" not in engine.notes


@pytest.mark.parametrize("parts, options, why", [
    (dict(train_data=DictSamples()), {}, "preload_data=auto holds only a TensorDataset"),
    (dict(collate_fn=lambda samples: torch.utils.data.default_collate(samples)), {}, "a custom collate_fn"),
    (dict(), dict(num_workers=1, preload_data=True), "num_workers=1 asks for the DataLoader"),
    (dict(train_data=Augmented()), dict(preload_data=True), "samples twice gave different values"),
    (dict(train_data=[(torch.zeros(2), "a")] * 8), dict(preload_data=True), "its samples hold str"),
    (dict(train_data=[torch.zeros(2), torch.zeros(3)]), dict(preload_data=True), "cannot be stacked"),
], ids=["auto-custom-dataset", "collate-fn", "workers", "augmentation", "strings", "ragged"])
def test_where_holding_does_not_apply_the_engine_says_why_and_uses_the_dataloader(parts, options, why):
    recipe = regression_recipe()
    for name, value in parts.items():
        setattr(recipe, name, value)
    engine = Engine(recipe, TrainConfig(batch_size=2, **options))
    assert isinstance(engine.loader, torch.utils.data.DataLoader)
    assert why in engine.notes["preload_data"]


def test_reading_samples_to_see_whether_they_can_be_held_draws_no_random_numbers():
    def draws():
        return torch.rand(1).item(), random.random(), np.random.rand()

    for seeded in (torch.manual_seed, random.seed, np.random.seed):
        seeded(1)
    expected = draws()
    for seeded in (torch.manual_seed, random.seed, np.random.seed):
        seeded(1)
    held, why = data.hold(Augmented(), TrainConfig(preload_data=True), World(), torch.device("cpu"))
    assert held is None and "random augmentation" in why
    assert draws() == expected


def test_data_too_big_for_a_quarter_of_free_memory_stays_on_the_dataloader(monkeypatch):
    monkeypatch.setattr(data, "_free", lambda device: 1000)
    engine = Engine(Recipe(model=nn.Linear(8, 1), train_data=DictSamples(), loss_fn=nn.MSELoss()),
                    TrainConfig(batch_size=4, preload_data=True))
    assert "more than a quarter of the free memory" in engine.notes["preload_data"]
    assert isinstance(engine.loader, torch.utils.data.DataLoader)


def test_a_ddp_rank_holds_only_its_share_of_each_epoch():
    dataset = regression_data(n=300)
    whole, _ = data.hold(dataset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    share, note = data.hold(dataset, TrainConfig(preload_data=True), World(rank=1, size=4), torch.device("cpu"))
    assert whole.copied == 0 and share.copied == sum(t.nbytes for t in dataset.tensors) // 4
    assert "this rank's share of each epoch" in note


def test_an_in_place_change_to_the_source_tensors_reaches_the_held_copy():
    base = regression_data(n=40)
    subset = Subset(base, range(0, 40, 2))  # held as a copy (the subset's rows gathered once)
    held, _ = data.hold(subset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    base.tensors[0].mul_(0)
    batches = data.HeldBatches(held, TrainConfig(batch_size=20), World(), seed=0)
    assert torch.count_nonzero(next(iter(batches))[0]) == 0


@pytest.mark.slow
def test_the_checklist_item_measures_holding_the_data_and_states_its_memory():
    from nbtrain.walk.tool import checklist
    from nbtrain.demo import digits_recipe
    recipe = digits_recipe()
    before = [p.detach().clone() for p in recipe.model.parameters()]
    walk = checklist(recipe, config=TrainConfig(batch_size=32, accelerator="cpu"), budget_s=10,
                     clock=lambda: 0.0, trial_s=0.2, items=("preload_data",))
    # One race; a second, from the same config, only where the first ended too noisy to tell (the walk's
    # second look: a loaded machine's blocks can vary that much)
    first, *second_look = walk.items
    assert len(second_look) <= 1 and all(item.name == "preload_data" for item in walk.items), walk.table()
    assert not second_look or "too noisy to tell" in first.verdict_text(), walk.table()
    for item in walk.items:
        assert len(item.tried) == 1, walk.table()
        assert item.tried[0].label.startswith("preload_data=True (0.4 MB held on cpu)"), walk.table()
    assert all(torch.equal(a, b) for a, b in zip(before, recipe.model.parameters()))
    held = checklist(regression_recipe(), config=TrainConfig(batch_size=32, accelerator="cpu"), budget_s=10,
                     clock=lambda: 0.0, trial_s=0.2, items=("preload_data",))
    assert held.items[0].tried[0].label == "preload_data=False (held now: no copy: the TensorDataset's own tensors)"


def test_switching_a_custom_dataset_back_to_auto_returns_it_to_the_dataloader():
    engine = Engine(Recipe(model=nn.Linear(5, 1), train_data=DictSamples(), training_step=_scripted(nn.MSELoss(), {})),
                    TrainConfig(batch_size=4, preload_data=True))
    assert isinstance(engine.loader, data.HeldBatches) and engine.held_data.copied > 0
    engine.request(preload_data=None)
    assert isinstance(engine.loader, torch.utils.data.DataLoader)
    assert "preload_data=auto holds only a TensorDataset" in engine.notes["preload_data"]


class CountedReads(DictSamples):
    reads = 0

    def __getitem__(self, i):
        type(self).reads += 1
        return super().__getitem__(i)


def test_a_tool_alternating_held_and_loader_configs_reads_the_data_set_once_while_its_snapshot_lives():
    from nbtrain.engine.state import Snapshot
    engine = Engine(Recipe(model=nn.Linear(5, 1), train_data=CountedReads(), training_step=_scripted(nn.MSELoss(), {})),
                    TrainConfig(batch_size=4))  # auto: a custom Dataset stays on the DataLoader
    snapshot = Snapshot(engine)
    reads = []
    for _ in range(3):  # A B A B ...: what a head-to-head comparison does
        before = CountedReads.reads
        engine.reconfigure(engine.config.replace(preload_data=True))
        assert isinstance(engine.loader, data.HeldBatches)
        reads.append(CountedReads.reads - before)
        snapshot.restore()
        assert isinstance(engine.loader, torch.utils.data.DataLoader)
    assert reads[0] >= len(engine.recipe.train_data) and reads[1:] == [0, 0]
    del snapshot  # the spare copy goes with the tool's snapshot: a later hold reads the data again
    before = CountedReads.reads
    engine.reconfigure(engine.config.replace(preload_data=True))
    assert CountedReads.reads - before >= len(engine.recipe.train_data)
