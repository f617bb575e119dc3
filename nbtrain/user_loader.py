"""A user's DataLoader: what nbtrain rebuilds of it, or why nbtrain reads it as it is.

nbtrain owns the loader it trains from, so batch size and workers can change between steps and a
resume continues exactly. It can rebuild a user's loader only where that loader's order is one
nbtrain's own order stands for: a map-style dataset batched by torch's own BatchSampler (given as
`batch_size=` or as `batch_sampler=BatchSampler(...)`) over a plain order of a known set of samples,
each once per epoch: in sequence (SequentialSampler), in a fresh permutation (RandomSampler without
replacement, one pass), or a split in a fresh permutation (SubsetRandomSampler, the usual train split).
nbtrain then takes the loader's samples (for a split, `Subset(dataset, its indices)`, so held-out samples
never come in), collate_fn and settings, and makes the same kind of batches in its own seeded,
resumable order: the same samples each epoch, shuffled by nbtrain's seed. (That order is exactly what
`SubsetRandomSampler(indices, generator=torch.Generator().manual_seed(seed + epoch))` draws, not the
draws the user's sampler would have made from torch's global random numbers; the run's notes say so.)

Any other order is the user's: a WeightedRandomSampler, sampling with replacement or fewer samples
than its source, a custom sampler or batch_sampler, or batch_size=None (the dataset's items are its
batches). nbtrain then reads that loader as it is (engine/stream.FixedLoader): no held data, and the
options that would change its batches refused, with the way out named (a Subset of the samples).
"""
from __future__ import annotations

import operator
import weakref
from typing import Callable

from torch.utils.data import (BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler,
                              Subset, SubsetRandomSampler)
from torch.utils.data.dataloader import default_collate

# What a loader read as it is cannot follow: each would change its batches or their order.
FIXED_OPTIONS = ("batch_size", "shuffle", "drop_last", "num_workers", "persistent_workers", "prefetch_factor",
                 "preload_data")


class Order:
    """A sampler nbtrain can stand for: the samples of `dataset` it draws (each once per epoch), shuffled or
    in sequence; `note`: what the run says about the order (None where it is the loader's own, unchanged)."""

    def __init__(self, samples: Dataset, shuffle: bool, note: str | None = None):
        self.samples, self.shuffle, self.note = samples, shuffle, note


def plain_order(sampler, dataset) -> Order | None:
    """The Order `sampler` draws from `dataset`, or None where nbtrain cannot stand for it."""
    kind = type(sampler)
    if kind is SubsetRandomSampler:
        try:  # a list, a range, a tensor or a NumPy array of whole numbers (what a split function returns)
            indices = [operator.index(i) for i in sampler.indices]
        except TypeError:
            return None
        if not all(0 <= i < len(dataset) for i in indices):
            return None
        return Order(_subset(sampler, dataset, indices), True,
                     f"data order: the DataLoader's SubsetRandomSampler of {len(indices):,} of {len(dataset):,} "
                     "samples, as Subset(dataset, its indices): each epoch the same samples, in nbtrain's "
                     "seeded order (not the sampler's own draws)")
    source = getattr(sampler, "data_source", None)
    try:
        size = len(source)
    except TypeError:
        return None
    if size > len(dataset):
        return None
    # Both draw positions 0..len(data_source)-1 of the loader's dataset: the whole of it, or its first `size`.
    samples = dataset if size == len(dataset) else _subset(sampler, dataset, list(range(size)))
    split = "" if size == len(dataset) else f" over its first {size:,} of {len(dataset):,} samples"
    if kind is SequentialSampler:
        return Order(samples, False, f"data order: the DataLoader's SequentialSampler{split}" if split else None)
    if kind is RandomSampler and not sampler.replacement and sampler.num_samples == size:
        note = "data order: the DataLoader's RandomSampler" + split + " shuffled in nbtrain's seeded order " \
               "(not the sampler's own draws)"
        return Order(samples, True, note if split or sampler.generator is not None else None)
    return None


# One Subset per sampler, while its data set and indices stay: the engine knows data by identity, so the same
# loader given to the next call continues its epoch where the last call stopped, as the same dataset does.
_SUBSETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _subset(sampler, dataset, indices: list) -> Subset:
    known = _SUBSETS.get(sampler)
    if known is None or known.dataset is not dataset or known.indices != indices:
        known = _SUBSETS[sampler] = Subset(dataset, indices)
    return known


def fixed_reason(loader) -> str | None:
    """Why nbtrain must read this DataLoader as it is (its own sampler decides the batches), or None."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    batcher = loader.batch_sampler
    if batcher is None:
        what = "batch_size=None: its dataset's items are its batches"
    elif type(batcher) is not BatchSampler:
        what = f"own batch_sampler ({type(batcher).__name__}) decides its batches"
    elif plain_order(batcher.sampler, loader.dataset) is None:
        what = f"own sampler ({_sampler_text(batcher.sampler, loader.dataset)}) decides its batches"
    else:
        return None
    return (f"the DataLoader's {what}, so nbtrain reads it as it is; to change batch size, workers or held data, "
            "give nbtrain the samples to train on as a data set (a split: torch.utils.data.Subset(dataset, "
            "indices)) or a DataLoader with batch_size= and shuffle=")


def _sampler_text(sampler, dataset) -> str:
    name = type(sampler).__name__
    if type(sampler) is RandomSampler and getattr(sampler, "data_source", None) is dataset:
        return f"{name} with replacement" if sampler.replacement else \
            f"{name} of {sampler.num_samples} of {len(dataset)} samples"
    return name


def adopt_loader(loader: DataLoader) -> tuple[Dataset, Callable | None, dict, bool, str | None]:
    """(samples, collate_fn, settings, fixed, note) of a DataLoader; `fixed`: nbtrain must read it as it is;
    `note`: what a run says of the order nbtrain stands for (a split's samples shuffled by nbtrain's seed)."""
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    if isinstance(loader.dataset, IterableDataset):  # a stream: nbtrain shares it out itself (stream.py)
        return loader.dataset, collate, \
            {"batch_size": loader.batch_size, "num_workers": loader.num_workers, "drop_last": loader.drop_last}, \
            False, None
    batcher = loader.batch_sampler
    batch = getattr(batcher, "batch_size", None)
    if fixed_reason(loader):  # its own order: nbtrain reads the loader as it is (FixedLoader), toggles off
        return loader.dataset, None, {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                                      **({"batch_size": batch} if isinstance(batch, int) else {})}, True, None
    # torch's BatchSampler over a plain order, made from batch_size= or given as batch_sampler=: its own
    # batch size, drop_last and sampler are the settings (the loader's batch_size is None for the latter).
    order = plain_order(batcher.sampler, loader.dataset)
    settings = {"batch_size": batch, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                "drop_last": batcher.drop_last, "shuffle": order.shuffle}
    if loader.num_workers:
        settings["persistent_workers"] = loader.persistent_workers
        settings["prefetch_factor"] = loader.prefetch_factor
    return order.samples, collate, settings, False, order.note
