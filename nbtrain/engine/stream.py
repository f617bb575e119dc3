"""Data nbtrain does not cut into batches itself: streams (an IterableDataset), shared out across
ranks and workers, and a user's DataLoader whose own sampler decides its batches.

A stream has no length and no index, so its order is its own and an epoch is one pass over
it (until it ends). The rule that gives each process its share: item i of the stream goes
to rank r and loader worker w when i % (ranks x workers) == r x workers + w, so under DDP
and with workers every item is used once per pass. (An IterableDataset that shares itself
out by get_worker_info would be shared twice: give it num_workers=0 in nbtrain, or drop its
own sharing.) A loader rebuilt mid-pass (a batch-size change, a resume) reads the stream
again from its start and skips the samples this rank already used, so a deterministic
stream continues exactly where it was.
"""
from __future__ import annotations

import itertools

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .dist import World


class RankShare(IterableDataset):
    def __init__(self, dataset: IterableDataset, world: World):
        self.dataset, self.rank, self.size = dataset, world.rank, world.size

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return itertools.islice(iter(self.dataset), self.rank * workers + worker, None, self.size * workers)


class StreamPosition:
    """Where this rank stands in the current pass (the engine's view of a loader's sampler)."""
    per_epoch = None  # unknown: a stream has no length

    def __init__(self):
        self.epoch = 0
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start


class StreamLoader:
    """Batches of this rank's share of a stream, from the current position of the pass."""

    def __init__(self, dataset: IterableDataset, config, world: World, seed: int, collate_fn=None):
        self.sampler = StreamPosition()
        self.batch_size = config.batch_size
        extra = {"generator": torch.Generator().manual_seed(seed)}
        if config.num_workers:
            extra["persistent_workers"] = False  # each pass starts the stream again
            if config.prefetch_factor is not None:
                extra["prefetch_factor"] = config.prefetch_factor
        self._loader = DataLoader(RankShare(dataset, world), batch_size=config.batch_size,
                                  num_workers=config.num_workers, pin_memory=config.pin, drop_last=config.drop_last,
                                  collate_fn=collate_fn, **extra)

    def __iter__(self):
        from .evaluation import batch_size
        batches = iter(self._loader)
        skipped = 0
        while skipped < self.sampler.start:  # samples this rank already used in this pass
            skipped += batch_size(next(batches))
        return batches


class FixedLoader:
    """The user's own DataLoader, read as it is: its sampler or batch_sampler decides the batches.

    A pass is one iteration of the loader; a loader read again mid-pass (after a resume)
    skips the samples this rank already used, which continues exactly where it was when
    the loader's order is deterministic.
    """

    def __init__(self, loader):
        self.sampler = StreamPosition()
        self.batch_size = loader.batch_size
        self._loader = loader

    def batches_per_pass(self) -> int:
        return len(self._loader)

    def __iter__(self):
        from .evaluation import batch_size
        batches = iter(self._loader)
        skipped = 0
        while skipped < self.sampler.start:
            skipped += batch_size(next(batches))
        return batches
