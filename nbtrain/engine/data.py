"""DataLoaders for the engine: workers, pinning, sharding across ranks, and a resumable order.

The engine owns the loader so batch size and workers can change between steps. The
epoch's order is DistributedSampler's (a permutation seeded by seed + epoch, sharded
by rank), started at an offset, so a loader rebuilt mid-epoch — or after a resume —
continues with exactly the samples not yet seen.

Batches without the per-sample path (`preload_data`): when the samples are tensors of
fixed shape, `hold` collates the whole data set once — with the DataLoader's own collate,
as one batch — and `HeldBatches` cuts each batch from it in the same EpochSampler order:
the DataLoader's batches, bit for bit, without a __getitem__ and a collate per sample.
One process holds the data on its training device and cuts batches by index; a DDP rank
holds only its share: each epoch (from where it stands), its samples go to its device in
one copy and batches are slices of that.
"""
from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler, Subset, TensorDataset
from torch.utils.data.dataloader import default_collate

from ..config import TrainConfig
from .dist import World


class EpochSampler(Sampler):
    """This rank's indices for one epoch, from `start` on; repositioned, never rebuilt."""

    def __init__(self, dataset, world: World, shuffle: bool, seed: int):
        self._order = DistributedSampler(dataset, num_replicas=world.size, rank=world.rank,
                                         shuffle=shuffle, seed=seed, drop_last=False)
        self.per_epoch = self._order.num_samples
        self.epoch = 0
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        self._order.set_epoch(self.epoch)
        indices = list(self._order)
        return iter(indices[self.start:])

    def __len__(self) -> int:
        return self.per_epoch - self.start


def build_loader(dataset, config: TrainConfig, world: World, seed: int, collate_fn=None,
                 shuffle: bool | None = None) -> DataLoader:
    sampler = EpochSampler(dataset, world, config.shuffle if shuffle is None else shuffle, seed)
    # The loader's own generator seeds its workers (reproducible augmentation) and keeps the
    # loader from drawing on the global RNG, so a resumed run's random numbers match.
    extra = {"generator": torch.Generator().manual_seed(seed)}
    if config.num_workers:
        extra["persistent_workers"] = config.persistent_workers
        if config.prefetch_factor is not None:
            extra["prefetch_factor"] = config.prefetch_factor
    return DataLoader(dataset, batch_size=config.batch_size, sampler=sampler,
                      num_workers=config.num_workers, pin_memory=config.pin,
                      drop_last=config.drop_last, collate_fn=collate_fn, **extra)


def stop_workers(loader) -> None:
    """End a loader's persistent worker processes now; the next run starts its own. Left alive, they
    would go only when the collector frees the engine, and their shutdown (up to seconds a worker)
    would stall whichever later cell happens to run that collection. torch offers no public call for
    it: dropping the loader's iterator after shutting it down is what DataLoader itself does."""
    loader = getattr(loader, "_loader", loader)  # FixedLoader / StreamLoader wrap a DataLoader
    iterator = getattr(loader, "_iterator", None) if isinstance(loader, DataLoader) else None
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None


def batch_sizes(samples: int, batch_size: int, drop_last: bool) -> list[int]:
    """How many samples each batch of `samples` indices holds."""
    full, rest = divmod(samples, batch_size)
    return [batch_size] * full + ([rest] if rest and not drop_last else [])


def to_device(batch, device: torch.device, non_blocking: bool):
    """Move every tensor in a (nested) batch to `device`."""
    return _map(lambda t: t.to(device, non_blocking=non_blocking), batch)


def _map(fn, batch):
    """`fn` applied to every tensor of a (nested) batch, its containers kept as the collate made them."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_map(fn, b) for b in batch))
    if isinstance(batch, list):
        return type(batch)([_map(fn, b) for b in batch])
    if isinstance(batch, tuple):
        return tuple(_map(fn, b) for b in batch)
    if isinstance(batch, dict):
        out = copy.copy(batch)
        out.update((k, _map(fn, v)) for k, v in batch.items())
        return out
    return batch


def _tensors(batch) -> list:
    found = []
    _map(found.append, batch)
    return found


# --- batches cut from data held in memory (preload_data) -----------------------------------

_SHARE = 0.25  # of the free memory where the data goes: the model, activations and optimizer need the rest


@dataclass
class Held:
    """The training data as one collated batch of all of it, and what holding it costs."""
    dataset: object
    data: object           # tensors in the structure of one DataLoader batch
    device: torch.device   # where batches are made
    shard: bool            # DDP: `data` stays where it was; each epoch's share of this rank is moved
    copied: int            # bytes copied to hold it (0: the dataset's own tensors, cut in place)
    note: str
    sources: tuple = ()    # tensors copied from: an in-place change to them is copied again
    versions: tuple = ()

    def current(self):
        if tuple(t._version for t in self.sources) != self.versions:
            rows = _tensor_rows(self.dataset)
            self.data = rows if self.shard else _map(lambda t: t.to(self.device), rows)
            self.versions = tuple(t._version for t in self.sources)
        return self.data


class HeldBatches:
    """The DataLoader's batches of a held data set: same EpochSampler order, same values."""
    num_workers = 0

    def __init__(self, held: Held, config, world: World, seed: int):
        self.held, self.batch_size, self.drop_last = held, config.batch_size, config.drop_last
        self.sampler = EpochSampler(held.dataset, world, config.shuffle, seed)

    def __iter__(self):
        data, device = self.held.current(), self.held.device
        order = torch.as_tensor(list(self.sampler), dtype=torch.long)
        # The rest of the epoch in its order, in one gather (and, for a DDP rank, one copy to its device);
        # each batch is then a slice of it: a view, no per-batch gather.
        share = _map(lambda t: t.index_select(0, order.to(t.device)).to(device), data)
        if type(share) is list and all(isinstance(t, torch.Tensor) for t in share):  # the collate's usual [x, y]
            cut = lambda lo, hi: [t[lo:hi] for t in share]  # noqa: E731  (no recursion on the hot path)
        else:
            cut = lambda lo, hi: _map(lambda t: t[lo:hi], share)  # noqa: E731
        size, samples = self.batch_size, len(order)
        end = samples - samples % size if self.drop_last else samples
        for lo in range(0, end, size):
            yield cut(lo, lo + size)


def hold(dataset, config: TrainConfig, world: World, device: torch.device, collate_fn=None,
         previous: Held | None = None) -> tuple[Held | None, str | None]:
    """The training data held for index-cut batches, or None and why not (None: nothing worth saying)."""
    wanted = config.preload_data
    if wanted is False:
        return None, None
    if isinstance(dataset, IterableDataset):
        return None, "preload_data: not used, a stream (IterableDataset) is read as it comes" if wanted else None
    if collate_fn is not None:
        return None, "preload_data: not used, a custom collate_fn builds the batches"
    if config.num_workers:
        return None, f"preload_data: not used, num_workers={config.num_workers} asks for the DataLoader" \
            if wanted else None
    if previous is not None and previous.dataset is dataset and previous.device == device \
            and previous.shard == (world.size > 1) and (wanted or previous.sources):  # (auto: TensorDatasets only)
        return previous, previous.note
    with _rng_kept():  # reading samples must not move the random numbers the run then draws
        rows = _tensor_rows(dataset)
        sources = _tensor_sources(dataset) if rows is not None else ()
        if rows is None and not wanted:
            return None, ("preload_data=auto holds only a TensorDataset (another Dataset's __getitem__ may make "
                          "new samples at each read); preload_data=True holds these samples once")
        if rows is None:
            rows, why = _collate_all(dataset, _free(torch.device("cpu")))
            if rows is None:
                return None, f"preload_data: not used, {why}"
    size = sum(t.nbytes for t in _tensors(rows))
    shard = world.size > 1
    on_device = size * len(EpochSampler(dataset, world, False, 0)) // max(len(dataset), 1) if shard else size
    moved = sum(t.nbytes for t in _tensors(rows) if t.device != device)
    needed = on_device if shard else moved
    free = _free(device)
    if needed > _SHARE * free:
        return None, (f"preload_data: not used, the data ({size_text(needed)}) is more than a quarter of the free "
                      f"memory on {device} ({size_text(free)})")
    data = rows if shard else _map(lambda t: t.to(device), rows)
    own = {id(t) for t in sources}
    copied = sum(t.nbytes for t in _tensors(data) if id(t) not in own) + (on_device if shard else 0)
    if not copied:
        note = "preload_data: batches cut by index from the TensorDataset's own tensors (no copy)"
    else:
        where = f"this rank's share of each epoch on {device}" if shard else f"on {device}"
        note = f"preload_data: batches cut from {size_text(copied)} of tensors held in memory ({where})"
    return Held(dataset, data, device, shard, copied, note, sources, tuple(t._version for t in sources)), note


def _tensor_rows(dataset):
    """The tensors a TensorDataset (or a Subset of one) reads its samples from, or None."""
    if type(dataset).__getitem__ is TensorDataset.__getitem__:  # a sample is these tensors' rows, nothing more
        return list(dataset.tensors)
    if type(dataset).__getitem__ is Subset.__getitem__:
        rows = _tensor_rows(dataset.dataset)
        if rows is not None:
            index = torch.as_tensor(list(dataset.indices), dtype=torch.long)
            return [t.index_select(0, index.to(t.device)) for t in rows]
    return None


def _tensor_sources(dataset) -> tuple:
    return tuple(dataset.tensors) if isinstance(dataset, TensorDataset) else _tensor_sources(dataset.dataset)


def _collate_all(dataset, free: int):
    """A map-style data set's samples collated as one batch, as its DataLoader collates each batch; or why not."""
    samples = len(dataset)
    if not samples:
        return None, "the data set is empty"
    first = default_collate([dataset[0]])
    again = default_collate([dataset[0]])
    leaves = _leaves(first)
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        kinds = sorted({type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)})
        return None, f"its samples hold {', '.join(kinds)}, not only tensors and numbers"
    if not all(torch.equal(a, b) for a, b in zip(leaves, _leaves(again))):
        return None, "reading a sample twice gave different values (random augmentation?): one read held would differ"
    size = sum(x.nbytes for x in leaves) * samples
    if size > _SHARE * free:
        return None, f"the data ({size_text(size)}) is more than a quarter of the free memory ({size_text(free)})"
    try:
        return default_collate([dataset[i] for i in range(samples)]), None
    except RuntimeError as error:
        return None, f"its samples cannot be stacked into one batch ({str(error).splitlines()[0]})"


def _leaves(batch) -> list:
    if isinstance(batch, dict):
        return [x for v in batch.values() for x in _leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [x for v in batch for x in _leaves(v)]
    return [batch]


def _free(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def size_text(size: int) -> str:
    return f"{size / 2**20:,.1f} MB" if size >= 2**20 / 10 else f"{size / 2**10:,.1f} KB"


@contextlib.contextmanager
def _rng_kept():
    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(state[0])
    np.random.set_state(state[1])
