"""A user's DataLoader: what nbtrain rebuilds of it, or why nbtrain reads it as it is.

nbtrain owns the loader it trains from, so batch size and workers can change between steps and a
resume continues exactly. It can rebuild a user's loader only where that loader's order is one
nbtrain's own order stands for: a map-style dataset batched by torch's own BatchSampler (given as
`batch_size=` or as `batch_sampler=BatchSampler(...)`) over a plain order, every sample once per
epoch, in sequence (SequentialSampler) or in a fresh permutation (RandomSampler over the whole data
set, without replacement). nbtrain then takes the loader's dataset, collate_fn and settings and makes
the same kind of batches in its own seeded, resumable order.

Any other order is the user's: a split by SubsetRandomSampler, a WeightedRandomSampler, sampling
with replacement or fewer samples than the data set, a custom sampler or batch_sampler, or
batch_size=None (the dataset's items are its batches). nbtrain then reads that loader as it is
(engine/stream.FixedLoader): no held data, and the options that would change its batches refused.
"""
from __future__ import annotations

from typing import Callable

from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.dataloader import default_collate

# What a loader read as it is cannot follow: each would change its batches or their order.
FIXED_OPTIONS = ("batch_size", "shuffle", "drop_last", "num_workers", "persistent_workers", "prefetch_factor",
                 "preload_data")


def plain_shuffle(sampler, dataset) -> bool | None:
    """False for a sequential order over `dataset`, True for a plain permutation of it, None for anything else."""
    if getattr(sampler, "data_source", None) is not dataset:
        return None
    if type(sampler) is SequentialSampler:
        return False
    if type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(dataset):
        return True
    return None


def fixed_reason(loader) -> str | None:
    """Why nbtrain must read this DataLoader as it is (its own sampler decides the batches), or None."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    batcher = loader.batch_sampler
    if batcher is None:
        what = "batch_size=None: its dataset's items are its batches"
    elif type(batcher) is not BatchSampler:
        what = f"own batch_sampler ({type(batcher).__name__}) decides its batches"
    elif plain_shuffle(batcher.sampler, loader.dataset) is None:
        what = f"own sampler ({_sampler_text(batcher.sampler, loader.dataset)}) decides its batches"
    else:
        return None
    return (f"the DataLoader's {what}, so nbtrain reads it as it is; to change batch size, workers or order, "
            "give nbtrain its dataset")


def _sampler_text(sampler, dataset) -> str:
    name = type(sampler).__name__
    if type(sampler) is RandomSampler and getattr(sampler, "data_source", None) is dataset:
        return f"{name} with replacement" if sampler.replacement else \
            f"{name} of {sampler.num_samples} of {len(dataset)} samples"
    return name


def adopt_loader(loader: DataLoader) -> tuple[Dataset, Callable | None, dict, bool]:
    """(dataset, collate_fn, settings, fixed) of a DataLoader; `fixed`: nbtrain must read it as it is."""
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    if isinstance(loader.dataset, IterableDataset):  # a stream: nbtrain shares it out itself (stream.py)
        return loader.dataset, collate, \
            {"batch_size": loader.batch_size, "num_workers": loader.num_workers, "drop_last": loader.drop_last}, False
    batcher = loader.batch_sampler
    batch = getattr(batcher, "batch_size", None)
    if fixed_reason(loader):  # its own order: nbtrain reads the loader as it is (FixedLoader), toggles off
        return loader.dataset, None, {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                                      **({"batch_size": batch} if isinstance(batch, int) else {})}, True
    # torch's BatchSampler over a plain order, made from batch_size= or given as batch_sampler=: its own
    # batch size, drop_last and sampler are the settings (the loader's batch_size is None for the latter).
    settings = {"batch_size": batch, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                "drop_last": batcher.drop_last, "shuffle": plain_shuffle(batcher.sampler, loader.dataset)}
    if loader.num_workers:
        settings["persistent_workers"] = loader.persistent_workers
        settings["prefetch_factor"] = loader.prefetch_factor
    return loader.dataset, collate, settings, False
