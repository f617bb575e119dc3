"""What nbtrain can show about a data set between two reads of it: that it is still what was read.

`seen(dataset)` records what can be observed without reading samples: a TensorDataset's tensors (the
objects themselves and their in-place version counters), a Subset's indices (a copy) and the data set
it indexes, a ConcatDataset's parts, and every length. `change(before, dataset)` compares that record
with the data set now: the first difference, in words, or None when nothing differs. A Dataset of the
user's own class is only its length here: whatever its __getitem__ reads may have changed unseen, so
`Seen.proven` is False and held data of it is read again (the held-data rule, data.py).

A version counter moves only for writes torch makes: `arr *= 2` on the numpy array under a `from_numpy`
tensor, or `x.data.mul_(2)`, leave it where it was. Where a copy of the data is held, `seen(..., content=True)`
also keeps a checksum of each tensor's bytes (zlib's CRC-32: 19 ms for 100 MB measured on this project's CPU
box when quiet, 150-190 ms with it loaded; a non-contiguous tensor is copied first; a tensor on a GPU is read
through the host in chunks), taken when it is held and at each later call: such a write shows as a change.

`same_data(a, b)`: whether two data set objects read the same samples, by the same record: the same structure
(kinds, lengths, a Subset's indices) over the same tensors or tensors of equal values. A new TensorDataset over
the same tensors continues the epoch as the same object would (Engine.adopt).
"""
from __future__ import annotations

import zlib
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
    digests: tuple | None = None  # each tensor's checksum (content=True): writes torch does not count show here

    @property
    def content(self) -> bool:
        """Whether checksums of the tensors' contents were taken, here or in a part."""
        return self.digests is not None or any(p.content for p in self.parts if isinstance(p, Seen))

    @property
    def proven(self) -> bool:
        """Everything this data set's samples are read from is recorded here."""
        return self.kind != "other" and all(p.proven for p in self.parts if isinstance(p, Seen))


def _reads_as(dataset, cls) -> bool:
    return type(dataset).__getitem__ is cls.__getitem__ and type(dataset).__len__ is cls.__len__


def seen(dataset, content: bool = False) -> Seen:
    """What can be observed of `dataset` now (see the module's docstring); `content`: with checksums."""
    length = len(dataset)
    if _reads_as(dataset, TensorDataset):
        tensors = tuple(dataset.tensors)
        return Seen("tensors", length, tensors, tuple(t._version for t in tensors),
                    digests=tuple(digest(t) for t in tensors) if content else None)
    if _reads_as(dataset, Subset):
        indices = dataset.indices
        copied = indices.clone() if isinstance(indices, torch.Tensor) else list(indices)
        return Seen("subset", length, (seen(dataset.dataset, content),), indices=copied)
    if _reads_as(dataset, ConcatDataset):
        return Seen("concat", length, tuple(seen(d, content) for d in dataset.datasets))
    return Seen("other", length)


_CHUNK_BYTES = 1 << 26  # a tensor off the host is checksummed through the host this many bytes at a time


def digest(t: torch.Tensor) -> tuple:
    """A tensor's dtype, shape and the CRC-32 of its bytes: equal for equal contents, and (but for a chance of
    one in 2**32) different after any write, whether or not torch counted it."""
    flat = t.detach().reshape(-1)
    crc = 0
    step = max(1, _CHUNK_BYTES // max(t.element_size(), 1))
    for lo in range(0, flat.numel(), step):
        part = flat[lo:lo + step].to("cpu").contiguous()
        crc = zlib.crc32(memoryview(part.view(torch.uint8).numpy()), crc)
    return t.dtype, tuple(t.shape), crc


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
        if before.digests is not None and tuple(digest(t) for t in now.parts) != before.digests:
            return "its tensors were written where torch does not count writes (through numpy or .data)"
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


def same_data(before, now) -> str | None:
    """Why data set `now` may read other samples than `before` (two objects), or None: the same kinds, lengths
    and indices, part by part, over the same tensors or tensors of equal values (compared here, one read of
    each pair). A Dataset of the user's own class cannot be told: it is other data."""
    a, b = seen(before), seen(now)
    if a.kind == "other" or b.kind == "other":
        name = type(now if b.kind == "other" else before).__name__
        return f"nbtrain cannot compare a {name} with another object: only TensorDatasets, Subsets and ConcatDatasets"
    if a.kind != b.kind or a.length != b.length or len(a.parts) != len(b.parts):
        return "it is another data set"
    if a.kind == "subset" and not _same_indices(a.indices, b.indices):
        return "its indices differ"
    if a.kind == "tensors":
        equal = all(x is y or (x.dtype == y.dtype and x.shape == y.shape and x.device == y.device
                               and torch.equal(x, y)) for x, y in zip(a.parts, b.parts))
        return None if equal else "its tensors differ"
    return next((why for x, y in zip(dataset_parts(before), dataset_parts(now)) if (why := same_data(x, y))), None)


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
