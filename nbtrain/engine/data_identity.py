"""What nbtrain can show about a data set between two reads of it: that it is still what was read.

`seen(dataset)` records what can be observed without reading samples: a TensorDataset's tensors (the
objects themselves and their in-place version counters), a Subset's indices (a copy) and the data set
it indexes, a ConcatDataset's parts, and every length. `change(before, dataset)` compares that record
with the data set now: the first difference, in words, or None when nothing differs. A Dataset of the
user's own class is only its length here: whatever its __getitem__ reads may have changed unseen, so
`Seen.proven` is False and held data of it is read again (the held-data rule, data.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import ConcatDataset, Subset, TensorDataset


@dataclass
class Seen:
    kind: str             # "tensors", "subset", "concat" or "other"
    length: int
    parts: tuple = ()     # tensors (kept: compared by identity), or the inner data sets' Seen
    versions: tuple = ()  # each tensor's version counter (bumped by every in-place change)
    indices: object = None

    @property
    def proven(self) -> bool:
        """Everything this data set's samples are read from is recorded here."""
        return self.kind != "other" and all(p.proven for p in self.parts if isinstance(p, Seen))


def _reads_as(dataset, cls) -> bool:
    return type(dataset).__getitem__ is cls.__getitem__ and type(dataset).__len__ is cls.__len__


def seen(dataset) -> Seen:
    """What can be observed of `dataset` now (see the module's docstring)."""
    length = len(dataset)
    if _reads_as(dataset, TensorDataset):
        tensors = tuple(dataset.tensors)
        return Seen("tensors", length, tensors, tuple(t._version for t in tensors))
    if _reads_as(dataset, Subset):
        indices = dataset.indices
        copied = indices.clone() if isinstance(indices, torch.Tensor) else list(indices)
        return Seen("subset", length, (seen(dataset.dataset),), indices=copied)
    if _reads_as(dataset, ConcatDataset):
        return Seen("concat", length, tuple(seen(d) for d in dataset.datasets))
    return Seen("other", length)


def change(before: Seen, dataset) -> str | None:
    """How `dataset` differs from what `before` recorded, in words; None: no difference observed (for a data
    set of the user's own class, only its length is observed: see Seen.proven)."""
    now = seen(dataset)
    if now.kind != before.kind:
        return "it is read another way now"
    if now.length != before.length:
        return f"its length changed ({before.length} -> {now.length})"
    if now.kind == "tensors":
        if len(now.parts) != len(before.parts) or any(a is not b for a, b in zip(now.parts, before.parts)):
            return "its tensors were replaced"
        if now.versions != before.versions:
            return "its tensors were changed in place"
    if now.kind == "subset" and not _same_indices(now.indices, before.indices):
        return "its indices changed"
    if len(now.parts) != len(before.parts):
        return "its parts changed"
    for a, b in zip(before.parts, dataset_parts(dataset)):
        if isinstance(a, Seen):
            inner = change(a, b)
            if inner:
                return inner
    return None


def why_read_again(held, dataset) -> str | None:
    """Why the data `held` (a data.Held, or None) cannot be reused for `dataset`, or None where it can."""
    if held is None:
        return None
    if held.seen is None:
        return "held before it was observed"
    why = change(held.seen, dataset)
    if why is None and not held.seen.proven:
        why = "nbtrain cannot tell whether a Dataset of its own class changed since it was held"
    return why


def dataset_parts(dataset) -> tuple:
    if _reads_as(dataset, Subset):
        return (dataset.dataset,)
    if _reads_as(dataset, ConcatDataset):
        return tuple(dataset.datasets)
    return ()


def _same_indices(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b
