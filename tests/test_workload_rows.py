"""The workload digest of a data set of rows (engine/workload.py), read at every call (issue 51): rows that read
alike are kept as one reading and a count, a tensor met twice in one walk is read once, and a dict's keys are put
in order once per set of keys. None of it may hide a change: a row changed in place, in the middle of a run of
alike rows or at its end, a tensor reshaped in place between two calls, a hook set on one module or parameter."""
import collections

import pytest
import torch
from torch import nn

from nbtrain import Recipe
from nbtrain.engine.workload import _Reader, digest


def _rows(n=12, width=8):
    ids = torch.zeros(n, width, dtype=torch.long)
    return [{"input_ids": row, "labels": row} for row in ids]


def _digest(rows, model=None):
    return digest(Recipe(model=model or nn.Linear(8, 1), train_data=rows))


def test_rows_that_read_alike_are_one_reading_and_a_count():
    reader = _Reader()
    reader.data(_rows(10_000))
    assert len(reader.parts) < 20, len(reader.parts)  # 10,000 rows, 5 parts each, before runs were counted


def _in_place(change, rows):
    if change == "a row's tensor replaced by one of another shape":
        rows[5]["labels"] = torch.zeros(9, dtype=torch.long)
    elif change == "the last row's tensor replaced":
        rows[-1]["labels"] = torch.zeros(9, dtype=torch.long)
    elif change == "a row's tensor reshaped in place":
        rows[5]["labels"].unsqueeze_(0)
    elif change == "a tensor's data swapped (no version moves)":
        rows[5]["labels"].data = torch.zeros(9, dtype=torch.long)
    elif change == "a row's number changed":
        for row in rows:
            row["weight"] = 1
        rows[7]["weight"] = 2
    elif change == "a row's key renamed":
        rows[3]["targets"] = rows[3].pop("labels")
    elif change == "a row gained a key":
        rows[3]["mask"] = torch.ones(8)
    elif change == "a row's tensor needs gradients":
        rows[4]["input_ids"] = rows[4]["input_ids"].float().requires_grad_()
    elif change == "two rows swapped places":
        rows[2] = {"input_ids": torch.zeros(4, dtype=torch.long), "labels": torch.zeros(4, dtype=torch.long)}
        rows[2], rows[9] = rows[9], rows[2]
    elif change == "a row appended":
        rows.append(dict(rows[0]))


CHANGES = ["a row's tensor replaced by one of another shape", "the last row's tensor replaced",
           "a row's tensor reshaped in place", "a tensor's data swapped (no version moves)", "a row's number changed",
           "a row's key renamed", "a row gained a key", "a row's tensor needs gradients", "a row appended"]


@pytest.mark.parametrize("change", CHANGES)
def test_a_row_changed_in_place_changes_the_digest(change):
    rows = _rows()
    before = _digest(rows)
    assert before is not None and _digest(rows) == before  # the same rows, read again: the same digest
    _in_place(change, rows)
    assert _digest(rows) not in (before, None)


def test_where_a_different_row_stands_in_a_run_of_alike_rows_is_read():
    def rows(odd_at):
        out = _rows(6)
        out[odd_at] = {"input_ids": torch.zeros(3, dtype=torch.long), "labels": torch.zeros(3, dtype=torch.long)}
        return out
    digests = {_digest(rows(i)) for i in range(6)}
    assert len(digests) == 6 and None not in digests
    # three of one then one of another is not two and two
    a, b = _rows(1)[0], {"input_ids": torch.zeros(3, dtype=torch.long)}
    assert _digest([a, a, a, b]) != _digest([a, a, b, b])
    assert _digest([dict(a) for _ in range(4)]) == _digest(_rows(4))  # rows built afresh read alike


@pytest.mark.parametrize("where", ["a submodule's forward hook", "a parameter's gradient hook",
                                   "a parameter's post-accumulate hook"])
def test_a_hook_on_one_module_or_parameter_changes_the_digest(where):
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    rows, plain = _rows(), model()
    hooked = model()
    if where == "a submodule's forward hook":
        hooked[2].register_forward_hook(lambda module, args, out: out * 2)
    elif where == "a parameter's gradient hook":
        hooked[0].weight.register_hook(lambda grad: grad * 2)
    else:
        hooked[0].bias.register_post_accumulate_grad_hook(lambda p: None)
    assert _digest(rows, plain) == _digest(rows, model()) is not None
    assert _digest(rows, hooked) not in (_digest(rows, plain), None)


def test_string_keys_are_put_in_order_by_their_text_as_any_dict_is():
    # the order kept once per set of keys is the one every other dict gets: by repr, whatever order they were written in
    quoted = {'a"b': torch.zeros(2), "a'b": 1, "ab": 2.0, "a\nb": None}
    reversed_order = dict(reversed(list(quoted.items())))
    assert _digest([quoted]) == _digest([reversed_order]) is not None
    assert _digest([quoted]) != _digest([{**quoted, "ab": 3.0}])


class _Name(str):
    def __repr__(self):
        return f"_Name({str.__repr__(self)})"


def test_a_key_that_is_a_str_subclass_is_not_taken_for_the_equal_string():
    plain, named = [{"x": torch.zeros(2)}], [{_Name("x"): torch.zeros(2)}]
    first = _digest(plain)  # the order of the key "x" is kept first: an equal key of another type must not find it
    assert _digest(named) not in (first, None)


class _OneByOne(_Reader):
    """The reading every row gets when the column-wise one does not apply: the reference it must equal."""
    def _alike_rows(self, items):
        return False


class _Marked(torch.Tensor):
    pass


def _generated_rows(seed: int) -> tuple[list, str]:
    """A data set of dict rows that read alike except where one change, drawn by `seed`, makes one row differ in a
    way the column-wise reading must see (or must leave to the row-by-row one)."""
    import random
    draw = random.Random(seed)
    n, width = draw.choice([2, 3, 17]), draw.choice([1, 4])
    dtype = draw.choice([torch.long, torch.float32])
    shared = draw.random() < 0.5  # labels that are the input_ids tensor itself
    keys = draw.choice([("input_ids", "labels"), ("labels", "input_ids"), ("x",)])
    ids = torch.zeros(n, width, dtype=dtype)
    rows = [{k: (row if shared or i == 0 else row.clone()) for i, k in enumerate(keys)} for row in ids]
    at = draw.randrange(n)
    change = draw.choice(["none", "shape", "dtype", "non-contiguous", "requires_grad", "key order", "str subclass key",
                          "parameter", "tensor subclass", "number", "nested list", "same row twice", "dict subclass",
                          "meta device", "sparse", "missing key"])
    row, key = rows[at], keys[-1]
    if change == "shape":
        row[key] = torch.zeros(width + 1, dtype=dtype)
    elif change == "dtype":
        row[key] = torch.zeros(width, dtype=torch.float64)
    elif change == "non-contiguous":
        row[key] = torch.zeros(width, 2, dtype=dtype)[:, 0]
    elif change == "requires_grad":
        row[key] = torch.zeros(width).requires_grad_()
    elif change == "key order":
        rows[at] = dict(reversed(list(row.items())))
    elif change == "str subclass key":
        rows[at] = {_Name(k) if k == key else k: v for k, v in row.items()}
    elif change == "parameter":
        row[key] = nn.Parameter(torch.zeros(width))
    elif change == "tensor subclass":
        row[key] = torch.zeros(width, dtype=dtype).as_subclass(_Marked)
    elif change == "number":
        row[key] = 3
    elif change == "nested list":
        row[key] = [torch.zeros(width, dtype=dtype)]
    elif change == "same row twice":
        rows[at] = rows[(at + 1) % n]
    elif change == "dict subclass":
        rows[at] = collections.OrderedDict(row)
    elif change == "meta device":
        row[key] = torch.zeros(width, dtype=dtype, device="meta")
    elif change == "sparse":
        row[key] = torch.zeros(width, dtype=dtype).to_sparse()
    elif change == "missing key":
        del row[key]
    return rows, change


@pytest.mark.parametrize("seed", range(120))
def test_the_column_wise_reading_of_rows_equals_the_row_by_row_one(seed):
    rows, change = _generated_rows(seed)
    # the rows alone, then met again after something else holds one of them (the references' numbers must agree)
    for whole in (rows, [rows[-1], rows, {"again": rows}]):
        fast, reference = _Reader(), _OneByOne()
        fast.value(whole)
        reference.value(whole)
        assert fast.parts == reference.parts, change
        assert fast.seen == reference.seen, change


def test_the_column_wise_reading_applies_to_alike_rows_only():
    calls = []

    class Counting(_Reader):
        def _alike_rows(self, items):
            taken = super()._alike_rows(items)
            calls.append(taken)
            return taken
    Counting().data(_rows(50))
    assert calls == [True]
    odd = _rows(50)
    odd[10]["labels"] = torch.zeros(3, dtype=torch.long)
    calls.clear()
    Counting().data(odd)
    assert calls == [False]


class _Settings:
    def __init__(self):
        self.width = 8


class _Meta(type):
    pass


class _Made(metaclass=_Meta):  # a class whose metaclass is not `type`
    pass


def test_an_object_met_again_reads_as_its_first_reading_whatever_its_kind():
    shared, module = _Settings(), nn.Linear(2, 2)
    whole = [shared, _Made, module, {"k": shared}, shared, _Made, module, [shared], _Settings]

    class Asking(_Reader):  # the reading without the shortcut: every object met again asked its kind again
        def _met_before(self, value, kind):
            return False
    fast, asking = _Reader(), Asking()
    fast.value(whole)
    asking.value(whole)
    assert fast.parts == asking.parts
    assert ("seen", fast.seen[id(shared)]) in fast.parts
