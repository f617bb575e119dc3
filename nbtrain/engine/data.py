"""DataLoaders for the engine: workers, pinning, sharding across ranks, and a resumable order.

The engine owns the loader so batch size and workers can change between steps. The
epoch's order is DistributedSampler's (a permutation seeded by seed + epoch, sharded
by rank), started at an offset, so a loader rebuilt mid-epoch — or after a resume —
continues with exactly the samples not yet seen.

Batches without the per-sample path (`preload_data`): when the samples are tensors of
fixed shape, `hold` collates the whole data set once — with the DataLoader's own collate,
as one batch — and `HeldBatches` cuts each batch from it in the same EpochSampler order:
the DataLoader's batches, bit for bit, without a __getitem__ and a collate per sample.
When nbtrain may hold the data, and when the checklist walk may choose to, is one rule,
stated above `hold`.
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
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset
from torch.utils.data.dataloader import default_collate

from ..config import TrainConfig
from ..user_loader import fixed_reason
from . import data_identity
from .dist import World
from .epoch_order import EpochSampler, batch_views


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
    seen: data_identity.Seen | None = None  # what was observed of the data set when it was read (rule 4)

    def current(self):
        if tuple(t._version for t in self.sources) != self.versions:
            rows = _tensor_rows(self.dataset)
            self.data = rows if self.shard else _map(lambda t: t.to(self.device), rows)
            self.versions = tuple(t._version for t in self.sources)
            self.seen = data_identity.seen(self.dataset, self.seen is not None and self.seen.content)
        return self.data


class HeldBatches:
    """The DataLoader's batches of a held data set: same EpochSampler order, same values."""
    num_workers = 0

    def __init__(self, held: Held, config, world: World, seed: int):
        self.held, self.batch_size, self.drop_last = held, config.batch_size, config.drop_last
        self.sampler = EpochSampler(held.dataset, world, config.shuffle, seed)

    def __iter__(self):
        data, device = self.held.current(), self.held.device
        order = self.sampler.order()
        size, samples = self.batch_size, len(order)
        order = order[:samples - samples % size] if self.drop_last else order
        # The rest of the epoch in its order, in one gather per tensor (and, for a DDP rank, one copy to its
        # device), already cut into batches: the loop's next batch is views made here, no per-batch work.
        parts = [batch_views(t, order, size, device) for t in _tensors(data)]
        if type(data) is list and all(isinstance(t, torch.Tensor) for t in data):  # the collate's usual [x, y]
            for batch in zip(*parts):
                yield list(batch)
        else:
            for batch in zip(*parts):
                views = iter(batch)
                yield _map(lambda t: next(views), data)


# The held-data rule, decided here and nowhere else (the walk's preload_data item asks `hold` too).
# nbtrain holds the training data, and cuts each batch from it by index, only where those batches are
# the ones its DataLoader would make, bit for bit, at every epoch:
#   1. the batches are nbtrain's to make: a map-style dataset, the default collate, num_workers=0, and no
#      user DataLoader read as it is (one whose own sampler or batch_sampler decides; user_loader.py);
#   2. its samples are fixed, so one read of each stands for every later read:
#      - a TensorDataset, or a Subset of one: a sample is rows of its tensors, nothing more (auto holds it);
#      - with preload_data=True, a dataset that says so (`nbtrain_fixed_samples = True`), or one whose
#        samples read a second time all compare equal: up to CHECKED_SAMPLES of them, spread over the data
#        set (an augmentation that changes 1% of reads shows up with a chance above 1 - 1e-4);
#   3. it fits: what holding really allocates is at most a quarter of the free memory where it goes;
#   4. held data is reused only while nbtrain can show it is what it held (data_identity.py): the same
#      tensors (identity and version; where a copy is held, their contents' checksums too: a write through
#      numpy or `.data` moves no version), a Subset's same indices, the same length, part by part. A Dataset
#      of the user's own class shows only its length: a new call (Engine.adopt) reads it again.
# The checklist walk may choose held data only through this rule: its preload_data item measures a
# held config only when `hold` holds it, and where the rule refuses, the item says why.

CHECKED_SAMPLES = 512  # samples of a custom Dataset read twice before its reads are taken for fixed
_CHUNK = 4096          # samples read and collated at a time while holding a custom Dataset
_SAMPLE_OBJECT_BYTES = 2048  # a read sample's Python objects (a tuple, tensor wrappers: ~1.7 KB measured)
FIXED_SAMPLES = "nbtrain_fixed_samples"  # a Dataset attribute: True says every read of a sample is the same


def hold(dataset, config: TrainConfig, world: World, device: torch.device, collate_fn=None,
         previous: Held | None = None, own_loader=None) -> tuple[Held | None, str | None]:
    """The training data held for index-cut batches, or None and why not (None: nothing worth saying).
    `own_loader`: the user's DataLoader when it is read as it is (its own sampler decides its batches)."""
    wanted = config.preload_data
    if wanted is False:
        return None, None
    why, always = _not_ours(dataset, config, collate_fn, own_loader)
    if why:
        return None, f"preload_data: not used, {why}" if wanted or always else None
    if previous is not None and previous.dataset is dataset and previous.device == device \
            and previous.shard == (world.size > 1) and (wanted or previous.sources) \
            and previous.seen is not None and data_identity.change(previous.seen, dataset) is None:  # (rule 4)
        return previous, previous.note  # (auto: TensorDatasets only)
    gathered, where = _gather_cost(dataset)
    if gathered and gathered > _SHARE * _free(where):  # a Subset's rows are gathered where its tensors are
        return None, (f"preload_data: not used, the data ({size_text(gathered)}) is more than a quarter of the "
                      f"free memory on {where} ({size_text(_free(where))})")
    # Before reading: a change made while reading shows as one later. Where the held data is a copy, a write
    # torch does not count (numpy, .data) would leave it stale unseen: the copy's sources are checksummed.
    seen = data_identity.seen(dataset, content=_copies(dataset, device, world.size > 1))
    rows = _tensor_rows(dataset)  # a TensorDataset's tensors, read without its __getitem__
    sources = _tensor_sources(dataset) if rows is not None else ()
    if rows is None and not wanted:
        return None, ("preload_data=auto holds only a TensorDataset (another Dataset's __getitem__ may make "
                      "new samples at each read); preload_data=True holds these samples once, if reading them "
                      "again gives the same values")
    if rows is None:
        # Reading samples must not move the random numbers the run then draws (keeping numpy's state costs
        # ~0.5 ms: only where samples are read).
        with _rng_kept():
            rows, why = _collate_all(dataset, _free(torch.device("cpu")))
        if rows is None:
            return None, f"preload_data: not used, {why}"
    size = sum(t.nbytes for t in _tensors(rows))
    shard = world.size > 1
    on_device = size * len(EpochSampler(dataset, world, False, 0)) // max(len(dataset), 1) if shard else size
    moved = sum(t.nbytes for t in _tensors(rows) if t.device != device)
    needed = on_device if shard else moved
    free = _free(device) if needed else 0  # nothing to copy (a TensorDataset's own tensors): nothing to fit
    if needed and needed > _SHARE * free:
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
    return Held(dataset, data, device, shard, copied, note, sources, tuple(t._version for t in sources), seen), note


def refusal(dataset, config: TrainConfig, collate_fn=None, own_loader=None) -> str | None:
    """Why the rule would not hold `dataset` under `config` with preload_data=True, or None: rules 1 and 2
    (whether it fits, rule 3, is known once holding allocates). Reads up to 2 x CHECKED_SAMPLES samples."""
    why, _ = _not_ours(dataset, config, collate_fn, own_loader)
    if why or _rows_of_tensors(dataset):
        return why
    with _rng_kept():
        return _samples_refused(dataset)[0]


def _not_ours(dataset, config: TrainConfig, collate_fn, own_loader) -> tuple[str | None, bool]:
    """Why the batches are not nbtrain's to cut from held data (rule 1), or None; and whether to say so
    under auto too (a stream or loader workers the user chose are reason enough, said only when asked)."""
    if own_loader is not None:
        return fixed_reason(own_loader), True
    if isinstance(dataset, IterableDataset):
        return "a stream (IterableDataset) is read as it comes", False
    if collate_fn is not None:
        return "a custom collate_fn builds the batches", True
    if config.num_workers:
        return f"num_workers={config.num_workers} asks for the DataLoader", False
    return None, False


def _copies(dataset, device: torch.device, shard: bool) -> bool:
    """Whether holding `dataset` makes a copy of its samples (anything but a TensorDataset's own tensors, cut
    where they are)."""
    if type(dataset).__getitem__ is not TensorDataset.__getitem__:
        return True
    return not shard and any(t.device != device for t in dataset.tensors)


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


def _gather_cost(dataset) -> tuple[int, torch.device]:
    """Bytes holding a Subset of a TensorDataset gathers its rows into, and where (0: nothing is gathered)."""
    if type(dataset).__getitem__ is not Subset.__getitem__ or not _rows_of_tensors(dataset.dataset):
        return 0, torch.device("cpu")
    sources = _tensor_sources(dataset)
    return len(dataset) * sum(t[0].nbytes for t in sources if len(t)), sources[0].device


def _rows_of_tensors(dataset) -> bool:
    """Whether `dataset` is a TensorDataset, or Subsets of one: what _tensor_rows reads."""
    while type(dataset).__getitem__ is Subset.__getitem__:
        dataset = dataset.dataset
    return type(dataset).__getitem__ is TensorDataset.__getitem__


def _tensor_sources(dataset) -> tuple:
    return tuple(dataset.tensors) if isinstance(dataset, TensorDataset) else _tensor_sources(dataset.dataset)


def _collate_all(dataset, free: int):
    """A map-style data set's samples collated as one batch, as its DataLoader collates each batch; or why not.

    Read a chunk of samples at a time into tensors allocated once for the whole data set: no Python
    object per sample outlives its chunk (a list of every sample costs tens of times the data itself).
    Collating chunk by chunk gives the same values as one collate of all (each leaf is stacked row by row).
    """
    refused, leaves = _samples_refused(dataset)  # before reading them all: an augmentation is refused at once
    if refused:
        return None, refused
    samples = len(dataset)
    chunk = min(samples, _CHUNK)
    # What holding allocates: the held tensors, and one chunk in flight (its samples' objects and its collate).
    size = sum(x.nbytes for x in leaves) * (samples + chunk) + _SAMPLE_OBJECT_BYTES * chunk
    if size > _SHARE * free:
        return None, f"the data ({size_text(size)}) is more than a quarter of the free memory ({size_text(free)})"
    held = None
    for lo in range(0, samples, chunk):
        try:
            part = default_collate([dataset[i] for i in range(lo, min(lo + chunk, samples))])
        except RuntimeError as error:
            return None, f"its samples cannot be stacked into one batch ({str(error).splitlines()[0]})"
        if held is None:
            held = _map(lambda t: torch.empty((samples, *t.shape[1:]), dtype=t.dtype), part)
        pairs = list(zip(_tensors(held), _tensors(part)))
        if len(pairs) != len(leaves) or any(h.shape[1:] != p.shape[1:] or h.dtype != p.dtype for h, p in pairs):
            return None, "its samples cannot be stacked into one batch (their shapes or types differ)"
        for whole, rows in pairs:
            whole[lo:lo + len(rows)].copy_(rows)
    return held, None


def _samples_refused(dataset) -> tuple[str | None, list]:
    """(why one read of these samples cannot be held as one batch (rule 2) or None, the first sample's leaves)."""
    if not len(dataset):
        return "the data set is empty", []
    leaves = _leaves(default_collate([dataset[0]]))  # read once: a data set may count (or pay for) its reads
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        kinds = sorted({type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)})
        return f"its samples hold {', '.join(kinds)}, not only tensors and numbers", leaves
    return _changed_on_rereading(dataset), leaves


def _changed_on_rereading(dataset) -> str | None:
    """Why one read of these samples does not stand for every read (rule 2), or None: up to CHECKED_SAMPLES
    samples, spread over the data set, each read twice and compared."""
    if getattr(dataset, FIXED_SAMPLES, False) is True:
        return None
    samples = len(dataset)
    checked = sorted({round(k * (samples - 1) / max(CHECKED_SAMPLES - 1, 1)) for k in range(CHECKED_SAMPLES)})
    differ = sum(1 for i in checked
                 if not all(_same_values(a, b) for a, b in zip(_leaves(default_collate([dataset[i]])),
                                                               _leaves(default_collate([dataset[i]])))))
    if not differ:
        return None
    return (f"reading {len(checked)} samples twice gave different values for {differ} of them (a random "
            f"augmentation?): one read held would freeze it; a Dataset whose samples never change can say so "
            f"with {FIXED_SAMPLES} = True")


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (a missing value read twice is the same sample)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan()) if a.is_floating_point()
                                        else a == b).all())


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
