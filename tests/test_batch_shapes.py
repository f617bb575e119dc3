"""Batches of any structure, and models that return their own loss (Hugging Face style)."""
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import nbtrain

from helpers import same_weights, weights


class DictData(Dataset):
    """Items are dicts, as a tokenizer's dataset gives: {"features": ..., "labels": ...}."""

    def __init__(self, n=96):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "labels": self.y[i]}


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class OwnLossModel(nn.Module):
    """forward(**batch) returns its loss, as a Hugging Face model does given labels."""

    def __init__(self, as_dict=False):
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
        self.as_dict = as_dict

    def forward(self, features, labels=None):
        logits = self.net(features)
        loss = nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits} if self.as_dict else Output(loss, logits)


@pytest.mark.parametrize("as_dict", [False, True], ids=["output.loss", "output['loss']"])
def test_a_model_returning_its_own_loss_trains_on_dict_batches_as_a_plain_loop_does(as_dict):
    data = DictData()
    model, reference = OwnLossModel(as_dict), OwnLossModel(as_dict)
    nbtrain.fit(model, data, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batch_size=16, max_steps=6,
                shuffle=False)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for start in range(0, 96, 16):
        batch = {"features": data.x[start:start + 16], "labels": data.y[start:start + 16]}
        out = reference(**batch)
        (out["loss"] if as_dict else out.loss).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert same_weights(weights(model), weights(reference))


def test_a_dict_batch_model_validates_on_held_out_dicts():
    result = nbtrain.fit(OwnLossModel(), DictData(), val_data=DictData(32), batch_size=16, max_epochs=1)
    assert result.summary.val_loss > 0


@pytest.mark.slow
def test_dict_batches_train_in_two_ddp_processes():
    model = OwnLossModel(as_dict=True)
    before = weights(model)
    result = nbtrain.fit(model, DictData(), batch_size=8, max_steps=3, devices=2, accelerator="cpu")
    assert result.status == "completed" and not same_weights(before, weights(model))


# --- a DataLoader the user already tuned ---------------------------------------------------


def test_a_dataloader_gives_its_dataset_collate_and_settings_and_trains_as_the_plain_loop():
    from torch.utils.data import DataLoader
    data = DictData()
    seen = []

    def collate(items):  # the user's collate_fn is kept
        seen.append(len(items))
        return torch.utils.data.default_collate(items)

    loader = DataLoader(data, batch_size=12, shuffle=False, drop_last=True, collate_fn=collate)
    model, reference = OwnLossModel(), OwnLossModel()
    result = nbtrain.fit(model, loader, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), max_epochs=1)
    assert (result.config.batch_size, result.config.shuffle, result.config.drop_last) == (12, False, True)
    assert seen and set(seen) == {12}
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for batch in DataLoader(data, batch_size=12, shuffle=False, drop_last=True):
        reference(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert same_weights(weights(model), weights(reference))


def test_flags_win_over_the_dataloaders_settings_and_a_live_batch_change_rebuilds_it():
    from torch.utils.data import DataLoader
    loader = DataLoader(DictData(), batch_size=12, shuffle=True)
    model = OwnLossModel()
    first = nbtrain.fit(model, loader, batch_size=24, max_steps=2)
    assert first.config.batch_size == 24 and first.config.shuffle is True
    again = nbtrain.fit(model, loader, batch_size=6, max_steps=2)
    assert again.config.batch_size == 6 and again.history["samples"][-1] - again.history["samples"][0] == 6


def test_a_dataloader_with_its_own_batch_sampler_is_read_as_it_is_and_batching_toggles_say_why_not():
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    class Buckets(BatchSampler):  # e.g. length bucketing: the user's own batching
        pass

    data = DictData()
    loader = DataLoader(data, batch_sampler=Buckets(SequentialSampler(range(96)), 8, False))
    model, reference = OwnLossModel(), OwnLossModel()
    result = nbtrain.fit(model, loader, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), max_epochs=1)
    assert result.summary.steps == 12 and result.config.batch_size == 8
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for batch in loader:
        reference(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert same_weights(weights(model), weights(reference))
    with pytest.raises(ValueError, match=r"batch_size=16: the DataLoader's own batch_sampler \(Buckets\) decides "
                                         r"its batches.*give nbtrain the samples to train on as a data set"):
        nbtrain.fit(model, loader, batch_size=16, max_steps=1)
    with pytest.raises(ValueError, match=r"devices=2: 1: the DataLoader's own batch_sampler"):
        nbtrain.fit(model, loader, devices=2, max_steps=1)


def test_the_panel_turns_the_batching_controls_off_with_the_reason_for_a_fixed_dataloader():
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    class Buckets(BatchSampler):
        pass

    loader = DataLoader(DictData(), batch_sampler=Buckets(SequentialSampler(range(96)), 8, False))
    panel = nbtrain.panel(nbtrain.Recipe(model=OwnLossModel(), train_data=loader), display=False)
    try:
        for control in (panel.controls.batch_size, panel.controls.workers, panel.controls.devices):
            assert control.disabled and "batch_sampler (Buckets) decides its batches" in control.tooltip
        assert panel.controls.accumulate.disabled is False
    finally:
        panel.close_button.click()
