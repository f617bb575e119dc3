"""A user's DataLoader: its own sampler is kept, its settings start the config unless one is given.

nbtrain rebuilds a loader only where its order is plain (every sample once an epoch, in sequence or a
fresh permutation, batched by torch's own BatchSampler); any other sampler or batch_sampler decides
its batches itself and is read as it is, never replaced by a plain shuffle or cut from held data.
"""
import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, RandomSampler, SequentialSampler, SubsetRandomSampler,
                              TensorDataset, WeightedRandomSampler)

import nbtrain
from nbtrain import TrainConfig
from nbtrain.config import ConfigError
from nbtrain.engine import data

from helpers import same_weights, weights


def _rows(n=512):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g), torch.arange(n))


def _net():
    torch.manual_seed(3)
    return nn.Linear(8, 3)


def _recording(seen):
    def step(model, batch):
        x, y, index = batch
        seen.extend(index.tolist())
        return nn.functional.cross_entropy(model(x), y)
    return step


ROWS = _rows()
OWN_ORDERS = {  # a DataLoader whose own sampler decides which rows an epoch trains on, and how often
    "subset-split": lambda: DataLoader(ROWS, batch_size=10, sampler=SubsetRandomSampler(range(100))),
    "weighted": lambda: DataLoader(ROWS, batch_size=10, sampler=WeightedRandomSampler(
        [1.0] * 100 + [0.0] * 412, num_samples=100)),
    "with-replacement": lambda: DataLoader(ROWS, batch_size=10, sampler=RandomSampler(
        range(100), replacement=True, num_samples=100)),
    "fewer-samples": lambda: DataLoader(ROWS, batch_size=10, sampler=RandomSampler(ROWS, num_samples=100)),
    "batch-sampler-over-a-split": lambda: DataLoader(ROWS, batch_sampler=BatchSampler(
        SubsetRandomSampler(range(100)), 10, False)),
}


@pytest.mark.parametrize("preload_data", [None, True], ids=["auto", "preload"])
@pytest.mark.parametrize("order", OWN_ORDERS)
def test_a_dataloaders_own_sampler_decides_the_batches_and_nothing_is_held(order, preload_data):
    seen = []
    model = _net()
    result = nbtrain.fit(model, OWN_ORDERS[order](), training_step=_recording(seen), max_epochs=1, preload_data=preload_data,
                         accelerator="cpu")
    engine = nbtrain.api.live_engine(model)
    assert not isinstance(engine.loader, data.HeldBatches)
    assert result.summary["steps"] == 10 and len(seen) == 100
    assert order == "fewer-samples" or set(seen) <= set(range(100))  # held-out rows never leak in
    assert any("preload_data: not used, the DataLoader's own" in n and "decides its batches" in n
               for n in result.summary["notes"]), result.summary["notes"]


def test_a_dataloader_with_a_split_sampler_trains_as_a_plain_loop_over_it():
    def loader():
        return DataLoader(ROWS, batch_size=10, sampler=SubsetRandomSampler(range(100)))
    model, reference = _net(), _net()
    nbtrain.fit(model, loader(), training_step=_recording([]), max_epochs=2, seed=4, accelerator="cpu")
    torch.manual_seed(4)  # the run's seed: the sampler draws its order from torch's random numbers, as here
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    plain = loader()
    for _ in range(2):
        for batch in plain:
            _recording([])(reference, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert same_weights(weights(model), weights(reference))


@pytest.mark.parametrize("inner, shuffle", [(SequentialSampler, False), (RandomSampler, True)])
def test_torchs_own_batch_sampler_is_a_plain_loader_nbtrain_rebuilds(inner, shuffle):
    loader = DataLoader(ROWS, batch_sampler=BatchSampler(inner(ROWS), 16, True))
    model = _net()
    result = nbtrain.fit(model, loader, training_step=_recording([]), max_epochs=1, accelerator="cpu")
    config = result.config
    assert (config.batch_size, config.drop_last, config.shuffle) == (16, True, shuffle)
    assert result.summary["steps"] == 32 and isinstance(nbtrain.api.live_engine(model).loader, data.HeldBatches)


EXPLICIT = [  # an option given at nbtrain's default value, against a DataLoader that says otherwise
    (dict(batch_size=64), dict(batch_size=32)),
    (dict(batch_size=16, shuffle=False), dict(shuffle=True)),
    (dict(batch_size=16, num_workers=1), dict(num_workers=0)),
    (dict(batch_size=20, drop_last=True), dict(drop_last=False)),
]


@pytest.mark.parametrize("as_config", [False, True], ids=["keyword", "TrainConfig"])
@pytest.mark.parametrize("loader_options, given", EXPLICIT, ids=[next(iter(g)) for _, g in EXPLICIT])
def test_an_option_given_at_its_default_value_wins_over_the_dataloaders(loader_options, given, as_config):
    loader = DataLoader(ROWS, **loader_options)
    options = dict(config=TrainConfig(**given)) if as_config else given
    result = nbtrain.fit(_net(), loader, training_step=_recording([]), max_steps=1, accelerator="cpu", **options)
    for name, value in given.items():
        assert getattr(result.config, name) == value
    for name, value in loader_options.items():  # what was not given comes from the loader
        if name not in given:
            assert getattr(result.config, name) == value


def test_the_magics_batch_size_32_wins_over_the_dataloaders_64(shell, tmp_path, monkeypatch):
    monkeypatch.setenv("NBTRAIN_STORE", str(tmp_path / "runs.sqlite"))
    shell.reset(new_session=False)
    shell.run_line_magic("nbtrain", "--reset")
    shell.user_ns["rows"] = ROWS
    setup = ("\nimport torch\nfrom torch.utils.data import DataLoader\nmodel = torch.nn.Linear(8, 3)\n"
             "train_data = DataLoader(rows, batch_size=64)\n"
             "def training_step(model, batch):\n    x, y, _ = batch\n"
             "    return torch.nn.functional.cross_entropy(model(x), y)\n")
    shell.run_cell("%%nbtrain --batch-size 32 --max-steps 1 --no-plot --no-progress" + setup)
    assert shell.user_ns["_nbtrain"].config.batch_size == 32
    shell.user_ns["cfg"] = TrainConfig(max_steps=1)  # a TrainConfig that names no batch size leaves the loader's
    shell.run_cell("%%nbtrain --config cfg --no-plot --no-progress" + setup)
    assert shell.user_ns["_nbtrain"].config.batch_size == 64


def test_a_given_batch_size_a_loader_read_as_it_is_cannot_follow_is_refused_before_training():
    loader = OWN_ORDERS["subset-split"]()
    model = _net()
    before = weights(model)
    with pytest.raises(ConfigError, match=r"batch_size=32: the DataLoader's own sampler \(SubsetRandomSampler\) "
                                          r"decides its batches.*\(its batch_size is 10\)"):
        nbtrain.fit(model, loader, training_step=_recording([]), max_steps=1, batch_size=32)
    assert same_weights(before, weights(model))
    result = nbtrain.fit(model, loader, training_step=_recording([]), max_steps=1, batch_size=10)
    assert result.status == "completed"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_continuing_a_pass_says_so_where_the_loader_is_read_again(workers):
    loader = DataLoader(ROWS, batch_size=10, sampler=SubsetRandomSampler(range(100)), num_workers=workers)
    model = _net()
    notes = [nbtrain.fit(model, loader, training_step=_recording([]), max_steps=steps, accelerator="cpu")
             .summary["notes"] for steps in (3, 2, 5)]
    said = [[n.split(" into")[0] for n in run if "read again" in n] for run in notes]
    # without workers the pass a run left open is continued (its order kept); with workers, whose processes
    # stop at each run's end, the loader is read again, and the run says its sampler may give a new order
    again = ["the DataLoader was read again 30 samples", "the DataLoader was read again 50 samples"]
    assert said == ([[]] + [[text] for text in again] if workers else [[], [], []])
