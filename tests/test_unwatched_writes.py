"""Writes torch does not count, and data set objects made again: "the same data" only where nbtrain observed it.

A write through the numpy array under a `from_numpy` tensor, or through `.data`, moves no version counter: a
held copy of such data is checked by a checksum of its source tensors' contents, and read again where they
differ. A new data set object over the same tensors (`fit(model, TensorDataset(X, Y))` written twice) reads the
same samples: its epoch goes on as the same object's would, and the summary says so; a new object over other
values starts its first epoch, as before.

Generated: data set wrapping (a TensorDataset over from_numpy, a Subset of one, a ConcatDataset of two) x the
write (numpy, .data) x preload_data (auto, True) x order; and wrapping x how the object is made again (the same
tensors, equal copies, other values) x held or read through the DataLoader. Each against test_changed_data's
plain loop reading the data as it is at each batch, in DistributedSampler's order, its epoch going on while the
data is the same. Weights bit for bit at fp32 on the CPU.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Subset, TensorDataset

from nbtrain.api import live_engine
from nbtrain.engine import data_identity

from helpers import weights_differ
from test_changed_data import FEATURES, PlainLoop, fit, make_model

ROWS = 64


def arrays():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    return x, ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.3))


def wrap(kind: str, x: torch.Tensor, y: torch.Tensor):
    if kind == "tensors":
        return TensorDataset(x, y)
    if kind == "subset":
        return Subset(TensorDataset(x, y), list(range(4, 52)))
    return ConcatDataset([TensorDataset(x[:24], y[:24]), TensorDataset(x[24:], y[24:])])


# --- writes through numpy and .data ---------------------------------------------------------------------

WRITES = {"numpy": lambda arr, x: arr.__imul__(2), ".data": lambda arr, x: x.data.mul_(-1.5)}
CASES = [(kind, write, preload, shuffle) for kind, write, preload, shuffle
         in itertools.product(("tensors", "subset", "concat"), WRITES, ("auto", True), (False, True))
         if not (kind == "concat" and preload == "auto")]  # auto holds no ConcatDataset: nothing to go stale


@pytest.mark.parametrize("kind,write,preload,shuffle", CASES)
def test_a_write_torch_does_not_count_is_trained_on_not_the_held_copy(kind, write, preload, shuffle):
    arr, labels = arrays()
    x, y = torch.from_numpy(arr), torch.from_numpy(labels)
    dataset = wrap(kind, x, y)
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle)
    steps = random.Random(f"{kind}{write}{preload}{shuffle}").sample(range(2, 7), 3)
    for call, n in enumerate(steps):
        if call:
            WRITES[write](arr, x)
        result = fit(model, dataset, n, preload, shuffle)
        plain.train(dataset, n)
        problem = weights_differ(model, twin)
        assert problem is None, f"{problem} after call {call + 1}; notes: {result.summary.notes}"
    copied = live_engine(model).held_data.copied
    said = any("written where torch does not count writes" in note for note in result.summary.notes)
    assert said == bool(copied), (copied, result.summary.notes)  # only a copy is checked (and read again)


def test_the_checksum_sees_any_one_element_written_and_no_change_where_none_was():
    arr, labels = arrays()
    dataset = TensorDataset(torch.from_numpy(arr), torch.from_numpy(labels))
    before = data_identity.seen(dataset, content=True)
    flat = arr.reshape(-1)
    for i in (0, 17, ROWS * FEATURES - 1):
        kept = flat[i]
        flat[i] = np.nextafter(kept, np.float32(np.inf))  # the smallest write there is
        assert data_identity.change(before, dataset) is not None
        flat[i] = kept
        assert data_identity.change(before, dataset) is None


# --- the same data, a new object ------------------------------------------------------------------------

REMADE = {"same tensors": lambda x, y: (x, y), "equal copies": lambda x, y: (x.clone(), y.clone()),
          "other values": lambda x, y: (x * 0.5, y)}


@pytest.mark.parametrize("kind,remade,shuffle,held", list(itertools.product(("tensors", "subset", "concat"), REMADE,
                                                                             (False, True), (True, False))))
def test_a_new_data_set_object_over_the_same_data_goes_on_with_its_epoch(kind, remade, shuffle, held):
    arr, labels = arrays()
    x, y = torch.from_numpy(arr), torch.from_numpy(labels)
    model, twin = make_model(), make_model()
    plain = PlainLoop(twin, shuffle)
    steps = random.Random(f"{kind}{remade}{shuffle}{held}").sample(range(2, 5), 3)
    for call, n in enumerate(steps):
        tensors = REMADE[remade](x, y) if call else (x, y)
        dataset = wrap(kind, *tensors)
        result = fit(model, dataset, n, (True if kind == "concat" else "auto") if held else False, shuffle)
        if call and remade == "other values":  # other samples: their first epoch, from its start
            plain.epoch = plain.offset = 0
        plain.train(dataset, n)
        problem = weights_differ(model, twin)
        assert problem is None, f"{problem} after call {call + 1}; notes: {result.summary.notes}"
        if call:
            x, y = tensors
            goes_on = [note for note in result.summary.notes if "over the same data" in note]
            assert bool(goes_on) == (remade != "other values"), result.summary.notes
