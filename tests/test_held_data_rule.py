"""The held-data rule (engine/data.py, above `hold`): when nbtrain may hold the training data, and when
the checklist walk may choose to; and what holding a custom Dataset really costs."""
from __future__ import annotations

import gc
import threading
import time

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

import nbtrain
from nbtrain import Recipe, TrainConfig
from nbtrain.engine import data
from nbtrain.engine.dist import World
from nbtrain.engine.engine import Engine
from helpers import regression_data
from test_in_memory_data import CountedReads, DictSamples, _scripted


class SometimesAugmented(DictSamples):
    """Like RandomGrayscale(p=0.1): one read in ten comes back changed; sample 0 read twice rarely shows it."""
    reads = 0

    def __init__(self, n=600):
        super().__init__(n)

    def __getitem__(self, i):
        type(self).reads += 1
        sample = super().__getitem__(i)
        if torch.rand(()) < 0.1:
            sample["x"] = sample["x"].flip(0)
        return sample


class DeclaredFixed(CountedReads):
    nbtrain_fixed_samples = True  # the dataset's word: every read of a sample is the same


def _never(dataset):
    return dataset


RULE = [  # (case, dataset, config options, a user's DataLoader kwargs or None, held?, why not)
    ("tensor-dataset-auto", lambda: regression_data(n=64), {}, None, True, None),
    ("subset-auto", lambda: Subset(regression_data(n=64), range(40)), {}, None, True, None),
    ("custom-auto", lambda: DictSamples(), {}, None, False, "preload_data=auto holds only a TensorDataset"),
    ("custom-fixed-reads", lambda: DictSamples(), dict(preload_data=True), None, True, None),
    ("declared-fixed", lambda: DeclaredFixed(), dict(preload_data=True), None, True, None),
    ("augmented-one-read-in-ten", lambda: SometimesAugmented(), dict(preload_data=True), None, False,
     "samples twice gave different values"),
    ("own-sampler-auto", lambda: regression_data(n=64), {}, dict(sampler=torch.utils.data.WeightedRandomSampler(
        [1.0] * 64, 10)), False, "the DataLoader's own sampler (WeightedRandomSampler) decides its batches"),
    ("own-sampler-preload", lambda: regression_data(n=64), dict(preload_data=True), dict(
        sampler=torch.utils.data.WeightedRandomSampler([1.0] * 64, 10)), False, "own sampler (WeightedRandomSampler)"),
    ("split-sampler-auto", lambda: regression_data(n=64), {}, dict(sampler=torch.utils.data.SubsetRandomSampler(
        range(10))), True, None),
    ("workers", lambda: regression_data(n=64), dict(preload_data=True, num_workers=1), None, False,
     "num_workers=1 asks for the DataLoader"),
    ("preload-off", lambda: regression_data(n=64), dict(preload_data=False), None, False, None),
]


@pytest.mark.parametrize("make, options, loader, held, why", [r[1:] for r in RULE], ids=[r[0] for r in RULE])
def test_the_held_data_rule(make, options, loader, held, why):
    dataset = make()
    train_data = torch.utils.data.DataLoader(dataset, batch_size=4, **loader) if loader else dataset
    engine = Engine(Recipe(model=nn.Linear(5 if isinstance(dataset, DictSamples) else 8, 1), train_data=train_data,
                           training_step=lambda model, batch: torch.zeros((), requires_grad=True)),
                    TrainConfig(batch_size=4, **options))
    assert isinstance(engine.loader, data.HeldBatches) == held
    if why is None:
        assert held or "preload_data" not in engine.notes
    else:
        assert why in engine.notes["preload_data"]


def test_a_dataset_that_declares_its_samples_fixed_is_read_once_to_be_held():
    dataset = DeclaredFixed()
    before = DeclaredFixed.reads
    held, _ = data.hold(dataset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    assert held is not None and DeclaredFixed.reads - before == len(dataset) + 1  # (+1: its first sample's shape)


@pytest.mark.slow
def test_the_walk_never_keeps_a_frozen_read_of_an_augmentation_that_changes_one_read_in_ten():
    from nbtrain.walk.tool import checklist
    dataset = SometimesAugmented()
    recipe = Recipe(model=nn.Linear(5, 1), train_data=dataset, training_step=_scripted(nn.MSELoss(), {}))
    walk = checklist(recipe, config=TrainConfig(batch_size=32, accelerator="cpu"), budget_s=10, clock=lambda: 0.0,
                     trial_s=0.2, items=("preload_data",), keep_best=True)
    assert not walk.items and walk.best_config.preload_data is not True, walk.table()
    ((name, why),) = walk.skipped
    assert name == "preload_data" and "samples twice gave different values" in why and "augmentation" in why
    assert why in walk.table()  # the walk says why it did not try held data
    engine = nbtrain.api.live_engine(recipe.model)
    assert engine.config.preload_data is not True and not isinstance(engine.loader, data.HeldBatches)
    before = SometimesAugmented.reads
    nbtrain.fit(recipe=recipe, max_steps=3)
    assert SometimesAugmented.reads - before == 3 * 32  # every later step reads its samples afresh


class ManySmallSamples(Dataset):
    """Many samples of a few bytes each (a tensor row and a Python int): where a per-sample list costs most."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 2, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_holding_a_custom_dataset_grows_the_process_by_about_its_tensors_not_a_list_of_samples():
    dataset = ManySmallSamples(300_000)  # 4.6 MB of tensors held (x and y as int64); a list of samples: ~150 MB
    process = psutil.Process()
    gc.collect()
    start = peak = process.memory_info().rss
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        held, _ = data.hold(dataset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    finally:
        done.set()
        watcher.join()
    assert held is not None and held.copied == 300_000 * (2 * 4 + 8)
    assert peak - start < 4 * held.copied + 16 * 2**20, f"grew by {(peak - start) / 2**20:.1f} MB"
    batches = data.HeldBatches(held, TrainConfig(batch_size=1000, shuffle=False), World(), seed=0)
    x, y = next(iter(batches))
    assert torch.equal(x, dataset.x[:1000]) and torch.equal(y, dataset.y[:1000])


def test_the_fits_check_sizes_what_holding_a_custom_dataset_allocates(monkeypatch):
    dataset = ManySmallSamples(50_000)
    held_bytes = 50_000 * (2 * 4 + 8)
    monkeypatch.setattr(data, "_free", lambda device: 4 * held_bytes + 4)  # the tensors fit; with a chunk they do not
    held, why = data.hold(dataset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    assert held is None and "more than a quarter of the free memory" in why


def test_a_subset_too_big_to_gather_is_refused_before_its_rows_are_copied(monkeypatch):
    subset = Subset(regression_data(n=4000), range(0, 4000, 2))  # gathered: 2000 rows of 9 floats, 72,000 bytes
    monkeypatch.setattr(data, "_free", lambda device: 4 * 72_000 - 4)
    held, why = data.hold(subset, TrainConfig(preload_data=True), World(), torch.device("cpu"))
    assert held is None and "the data (70.3 KB) is more than a quarter of the free memory on cpu" in why
