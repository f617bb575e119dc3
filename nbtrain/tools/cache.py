"""Offline preprocessing cache: do a dataset's deterministic per-sample work once, read it back for free.

    train_data = nbtrain.cache(train_data, "cache/")          # first call: fills, in parallel
    train_data = nbtrain.cache(train_data, "cache/")          # later calls: opens the same files

Every sample is computed once by DataLoader workers and written into numpy memory-mapped
files (one per field of a sample), then read back by a `CachedDataset`. The files live in a
folder named by a fingerprint of the dataset's code, its parameters and a sample of its
outputs, so changing the transform (or its settings, or the data) never serves stale samples:
it lands in a new folder. Random augmentation is not deterministic work: it is refused here
(the message says so) and belongs in `CachedDataset(..., transform=...)`, applied after reading.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..engine.state import rng_kept
from .tool_options import declare, option

_SAMPLE_PROBES = 8


def _to_array(value, where: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return np.asarray(value)
    raise TypeError(f"nbtrain.tools.cache: {where} is a {type(value).__name__}; allowed: tensors, numpy arrays "
                    "and numbers (or tuples of them)")


def _fields(sample, index: int) -> tuple[list[np.ndarray], bool]:
    """A sample as a list of arrays, and whether it was a tuple/list (False: a single tensor)."""
    if isinstance(sample, (tuple, list)):
        return [_to_array(v, f"field {i} of sample {index}") for i, v in enumerate(sample)], True
    return [_to_array(sample, f"sample {index}")], False


def _describe(obj, seen: set, depth: int = 0):
    """A stable description of code and parameters: source of classes and functions, values of state."""
    if id(obj) in seen or depth > 4:
        return "<seen>"
    seen.add(id(obj))
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        arr = obj.detach().cpu().numpy() if isinstance(obj, torch.Tensor) else obj
        flat = np.ascontiguousarray(arr).reshape(-1)
        step = max(1, flat.size // 4096)  # large data: shape, dtype and a strided sample of its values
        return ["array", arr.shape, str(arr.dtype), hashlib.sha256(flat[::step].tobytes()).hexdigest()]
    if isinstance(obj, (str, int, float, bool, type(None), bytes)):
        return repr(obj)
    if isinstance(obj, (list, tuple)):
        items = obj if len(obj) <= 64 else list(obj[:32]) + list(obj[-32:]) + [len(obj)]
        return [type(obj).__name__] + [_describe(v, seen, depth + 1) for v in items]
    if isinstance(obj, dict):
        return {str(k): _describe(v, seen, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        fn = getattr(obj, "__func__", obj)
        closure = [c.cell_contents for c in fn.__closure__ or ()]
        return ["function", _source(fn), _describe(closure, seen, depth + 1), repr(fn.__defaults__)]
    cls = type(obj)
    code = [_source(k) for k in cls.__mro__ if k.__module__ not in ("builtins", "torch.utils.data.dataset",
                                                                     "typing", "abc")]
    state = getattr(obj, "__dict__", None)
    return [cls.__qualname__, code, _describe(state, seen, depth + 1) if state is not None else repr(obj)]


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):  # defined where no source is kept: fall back to the compiled code
        code = getattr(obj, "__code__", None)
        if code is not None:
            return hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()
        methods = [v.__code__.co_code for v in vars(obj).values() if hasattr(v, "__code__")] \
            if isinstance(obj, type) else []
        return getattr(obj, "__qualname__", repr(obj)) + hashlib.sha256(b"".join(methods)).hexdigest()


def probe_indices(n: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, _SAMPLE_PROBES)})


def fingerprint(dataset) -> str:
    """Hash of the dataset's code, parameters, length and a few of its outputs (each read twice)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(_describe(dataset, set()), default=str).encode())
    digest.update(str(len(dataset)).encode())
    for i in probe_indices(len(dataset)):
        first, _ = _fields(dataset[i], i)
        again, _ = _fields(dataset[i], i)
        if any(a.shape != b.shape or not np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again)):
            raise ValueError(f"nbtrain.tools.cache: dataset[{i}] differs between two reads, so its per-sample work is "
                             "random; cache the deterministic part (a dataset without random augmentation) and "
                             "apply augmentation after reading: CachedDataset transform=...")
        for a in first:
            digest.update(str((a.shape, a.dtype.str)).encode())
            digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()[:20]


class CachedDataset(Dataset):
    """Samples read from the memory-mapped files of a filled cache folder (opened lazily per process)."""

    def __init__(self, folder, transform=None):
        self.folder = Path(folder)
        meta = json.loads((self.folder / "meta.json").read_text())
        self.length, self.as_tuple, self.nfields = meta["length"], meta["tuple"], meta["fields"]
        self.transform = transform
        self._arrays = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if self._arrays is None:  # opened in whichever process reads (DataLoader workers included)
            self._arrays = [np.load(self.folder / f"field{k}.npy", mmap_mode="r") for k in range(self.nfields)]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for a cache of {self.length} samples")
        values = [torch.from_numpy(np.array(a[index])) for a in self._arrays]
        sample = tuple(values) if self.as_tuple else values[0]
        return self.transform(sample) if self.transform is not None else sample

    def __getstate__(self):
        return {**self.__dict__, "_arrays": None}


@declare("cache", "nbtrain.cache", "offline preprocessing cache: a dataset's deterministic per-sample work done once", (
    option("num_workers", "whole", "DataLoader workers filling the cache", low=0, nullable=True, none="one per core"),
    option("batch_size", "whole", "samples each worker computes at a time", low=1),
    option("transform", "function", "applied after reading (random augmentation)", nullable=True,
           allowed="a function sample -> sample, or None")), magic=False)
def cache(dataset, path, num_workers: int | None = None, batch_size: int = 64, transform=None) -> CachedDataset:
    """Compute every sample of `dataset` once (in parallel) into memory-mapped files under `path`. Every RNG
    stream is as it was afterwards: reading the data (and the reading DataLoader's seed) draws nothing a
    later training run would."""
    with rng_kept():
        return _cache(dataset, path, num_workers, batch_size, transform)


def _cache(dataset, path, num_workers, batch_size, transform) -> CachedDataset:
    # The dataset is the data, not an option: its problems are about what it holds.
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")) or len(dataset) == 0:
        raise ValueError(f"dataset: got {type(dataset).__name__}; allowed: a non-empty map-style Dataset")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = root / f"{type(dataset).__name__}-{fingerprint(dataset)}"
    if (folder / "meta.json").exists():
        return CachedDataset(folder, transform)
    first, as_tuple = _fields(dataset[0], 0)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=root))  # private (0700) until complete
    try:
        arrays = [np.lib.format.open_memmap(work / f"field{k}.npy", mode="w+", dtype=a.dtype,
                                            shape=(len(dataset),) + a.shape) for k, a in enumerate(first)]
        workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                            collate_fn=_stack_fields)
        at = 0
        for fields in loader:
            if len(fields) != len(arrays):
                raise ValueError(f"nbtrain.tools.cache: samples have {len(arrays)} fields at 0 but {len(fields)} "
                                 f"near {at}; every sample must have the same fields")
            for k, (array, block) in enumerate(zip(arrays, fields)):
                if block.shape[1:] != array.shape[1:] or block.dtype != array.dtype:
                    raise ValueError(f"nbtrain.tools.cache: field {k} near sample {at} is {block.dtype}{list(block.shape[1:])}"
                                     f" but sample 0's is {array.dtype}{list(array.shape[1:])}; every sample "
                                     "must have the same shape and dtype to be cached")
                array[at:at + len(block)] = block
            at += len(fields[0])
        for array in arrays:
            array.flush()
        del arrays
        (work / "meta.json").write_text(json.dumps({"length": len(dataset), "tuple": as_tuple,
                                                    "fields": len(first), "source": type(dataset).__qualname__}))
        try:
            os.replace(work, folder)  # atomic: a folder with meta.json is always complete
        except OSError:  # another process completed the same cache first
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return CachedDataset(folder, transform)


def _stack_fields(samples):
    """Collate into one numpy block per field (checked against sample 0's layout by the writer)."""
    rows = [_fields(s, i)[0] for i, s in enumerate(samples)]
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        return [np.empty(0)] * (width + 1)  # the writer reports the mismatch
    out = []
    for k in range(width):
        shapes = {r[k].shape for r in rows}
        if len(shapes) > 1:  # let the writer name the odd field
            odd = next(r[k] for r in rows if r[k].shape != rows[0][k].shape)
            out.append(odd[None])
        else:
            out.append(np.stack([r[k] for r in rows]))
    return out
