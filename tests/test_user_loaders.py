"""A user's DataLoader: its own sampler is kept, its settings start the config unless one is given.

nbtrain rebuilds a loader only where its order is plain (every sample of a known set once an epoch, in
sequence or a fresh permutation, batched by torch's own BatchSampler: a SubsetRandomSampler split is one);
any other sampler or batch_sampler decides its batches itself and is read as it is, never replaced by a
plain shuffle or cut from held data.
"""
import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, RandomSampler, SequentialSampler, Subset,
                              SubsetRandomSampler, TensorDataset, WeightedRandomSampler)

import nbtrain
from nbtrain import TrainConfig
from nbtrain.options import ConfigError
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
    "index-list": lambda: DataLoader(ROWS, batch_size=10, sampler=list(range(100))),
    "weighted": lambda: DataLoader(ROWS, batch_size=10, sampler=WeightedRandomSampler(
        [1.0] * 100 + [0.0] * 412, num_samples=100)),
    "with-replacement": lambda: DataLoader(ROWS, batch_size=10, sampler=RandomSampler(
        range(100), replacement=True, num_samples=100)),
    "fewer-samples": lambda: DataLoader(ROWS, batch_size=10, sampler=RandomSampler(ROWS, num_samples=100)),
    "custom-batch-sampler": lambda: DataLoader(ROWS, batch_sampler=[list(range(i, i + 10)) for i in range(0, 100, 10)]),
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
    assert result.summary.steps == 10 and len(seen) == 100
    assert order == "fewer-samples" or set(seen) <= set(range(100))  # held-out rows never leak in
    assert any("preload_data: not used, the DataLoader's own" in n and "decides its batches" in n
               for n in result.summary.notes), result.summary.notes


TRAIN_ROWS = [i * 5 % 512 for i in range(100)]  # a train split: 100 rows spread over the 512
SPLITS = {  # the usual ways to train on a split: nbtrain stands for each (its rows, shuffled or in sequence)
    "subset-random-sampler": (lambda: DataLoader(ROWS, batch_size=10, sampler=SubsetRandomSampler(TRAIN_ROWS)), True),
    "split-of-a-tensor": (lambda: DataLoader(ROWS, batch_size=10, sampler=SubsetRandomSampler(
        torch.tensor(TRAIN_ROWS))), True),  # torch.randperm(n)[:k], as tutorials split
    "batch-sampler-over-a-split": (lambda: DataLoader(ROWS, batch_sampler=BatchSampler(
        SubsetRandomSampler(TRAIN_ROWS), 10, False)), True),
    "random-sampler-over-a-subset": (lambda: DataLoader(Subset(ROWS, TRAIN_ROWS), batch_size=10,
                                                        sampler=RandomSampler(Subset(ROWS, TRAIN_ROWS))), True),
    "sequential-over-a-subset": (lambda: DataLoader(Subset(ROWS, TRAIN_ROWS), batch_size=10,
                                                    sampler=SequentialSampler(Subset(ROWS, TRAIN_ROWS))), False),
}
TOGGLES = [dict(), dict(batch_size=20, preload_data=True), dict(batch_size=25, num_workers=1)]


@pytest.mark.parametrize("toggles", TOGGLES, ids=["as-given", "batch-20-held", "batch-25-workers"])
@pytest.mark.parametrize("split", SPLITS)
def test_a_split_keeps_every_toggle_and_trains_as_a_plain_loop_over_its_rows_in_nbtrains_seeded_order(split, toggles):
    # A plain loop over the same split, epoch e drawn as SubsetRandomSampler(indices, generator seeded seed + e)
    # draws: nbtrain's order is exactly that (the same rows each epoch; not the user's sampler's own draws).
    loader, shuffled = SPLITS[split]
    seen, model, reference = [], _net(), _net()
    result = nbtrain.fit(model, loader(), training_step=_recording(seen), max_epochs=2, seed=4, accelerator="cpu",
                         **toggles)
    batch = toggles.get("batch_size", 10)
    assert (result.config.batch_size, result.config.shuffle, result.summary.steps) == (batch, shuffled, 200 // batch)
    assert sorted(seen[:100]) == sorted(seen[100:]) == sorted(TRAIN_ROWS)  # held-out rows never come in
    engine = nbtrain.api.live_engine(model)
    assert isinstance(engine.loader, data.HeldBatches) == (not toggles.get("num_workers"))  # held where it can be
    notes = result.summary.notes
    said = any("SubsetRandomSampler of 100 of 512 samples" in n and "in nbtrain's seeded order" in n for n in notes)
    assert said == (split in ("subset-random-sampler", "split-of-a-tensor", "batch-sampler-over-a-split")), notes  # the sampler's own draws are not kept: the run says whose order it is
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    for epoch in range(2):
        order = SubsetRandomSampler(TRAIN_ROWS, generator=torch.Generator().manual_seed(4 + epoch)) if shuffled \
            else TRAIN_ROWS
        for rows in BatchSampler(list(order), batch, False):
            _recording([])(reference, ROWS[rows]).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert same_weights(weights(model), weights(reference))


def test_ab_on_a_split_compares_batch_sizes_on_its_rows_only():
    seen = []
    loader = DataLoader(ROWS, batch_size=64, sampler=SubsetRandomSampler(TRAIN_ROWS))
    result = nbtrain.ab(_net(), loader, training_step=_recording(seen), a={"batch_size": 8}, b={"batch_size": 16},
                        block_steps=2, min_pairs=2, max_pairs=2, budget_s=5, config=TrainConfig(accelerator="cpu"))
    assert result.b.batch_size == 16 and set(seen) <= set(TRAIN_ROWS)


@pytest.mark.parametrize("inner, shuffle", [(SequentialSampler, False), (RandomSampler, True)])
def test_torchs_own_batch_sampler_is_a_plain_loader_nbtrain_rebuilds(inner, shuffle):
    loader = DataLoader(ROWS, batch_sampler=BatchSampler(inner(ROWS), 16, True))
    model = _net()
    result = nbtrain.fit(model, loader, training_step=_recording([]), max_epochs=1, accelerator="cpu")
    config = result.config
    assert (config.batch_size, config.drop_last, config.shuffle) == (16, True, shuffle)
    assert result.summary.steps == 32 and isinstance(nbtrain.api.live_engine(model).loader, data.HeldBatches)


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
    loader = OWN_ORDERS["weighted"]()
    model = _net()
    before = weights(model)
    with pytest.raises(ConfigError, match=r"batch_size=32: the DataLoader's own sampler \(WeightedRandomSampler\) "
                                          r"decides its batches.*torch.utils.data.Subset\(dataset, indices\)"
                                          r".*\(its batch_size is 10\)"):
        nbtrain.fit(model, loader, training_step=_recording([]), max_steps=1, batch_size=32)
    assert same_weights(before, weights(model))
    result = nbtrain.fit(model, loader, training_step=_recording([]), max_steps=1, batch_size=10)
    assert result.status == "completed"


def test_ab_on_a_loader_read_as_it_is_refuses_in_one_line_naming_the_way_out(ip, capsys):
    ip.user_ns.update(rows=ROWS, step=_recording([]), net=_net())
    result = ip.run_cell("import nbtrain, torch\nfrom torch.utils.data import DataLoader, WeightedRandomSampler\n"
                         "loader = DataLoader(rows, batch_size=10, sampler=WeightedRandomSampler([1.0] * 512, 512))\n"
                         "nbtrain.ab(net, loader, training_step=step, a={'batch_size': 32}, b={'batch_size': 128})")
    text = capsys.readouterr().out
    assert isinstance(result.error_in_exec, ConfigError)
    assert text.strip().count("\n") == 0 and "Traceback" not in text, text
    assert text.startswith("ConfigError: invalid training configuration: batch_size=32: the DataLoader's own sampler "
                           "(WeightedRandomSampler)") and "torch.utils.data.Subset(dataset, indices)" in text, text


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_continuing_a_pass_says_so_where_the_loader_is_read_again(workers):
    loader = DataLoader(ROWS, batch_size=10, sampler=list(range(100)), num_workers=workers)
    model = _net()
    notes = [nbtrain.fit(model, loader, training_step=_recording([]), max_steps=steps, accelerator="cpu")
             .summary.notes for steps in (3, 2, 5)]
    said = [[n.split(" into")[0] for n in run if "read again" in n] for run in notes]
    # without workers the pass a run left open is continued (its order kept); with workers, whose processes
    # stop at each run's end, the loader is read again, and the run says its sampler may give a new order
    again = ["the DataLoader was read again 30 samples", "the DataLoader was read again 50 samples"]
    assert said == ([[]] + [[text] for text in again] if workers else [[], [], []])
