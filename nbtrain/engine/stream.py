"""Data nbtrain does not cut into batches itself: streams (an IterableDataset), shared out across
ranks and workers, and a user's DataLoader whose own sampler decides its batches.

A stream has no length and no index, so its order is its own and an epoch is one pass over
it (until it ends). The rule that gives each process its share: item i of the stream goes to
rank r when i % ranks == r, so under DDP every item is used once per pass; a rank's loader
workers then read whole batches of its share in turn (worker w the batches w, w + workers, ...),
so the loader, which takes a batch from each worker in turn, gives them in the stream's order.
(An IterableDataset that shares itself out by get_worker_info would be shared twice: give it
num_workers=0 in nbtrain, or drop its own sharing.) A loader rebuilt mid-pass (a batch-size or
workers change, a resume) reads the stream again from its start and passes over exactly the
items this rank already used, so a deterministic stream continues with the next item, whatever
the new batch size.
"""
from __future__ import annotations

import itertools

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .dist import World
from .evaluation import batch_size


class RankShare(IterableDataset):
    """This rank's share of a stream, from its item `skip` on; with loader workers, each reads whole batches."""

    def __init__(self, dataset: IterableDataset, world: World, batch_size: int = 1):
        self.dataset, self.rank, self.size, self.batch_size = dataset, world.rank, world.size, batch_size
        self.skip = 0  # items of this rank's share already used in this pass

    def __iter__(self):
        share = itertools.islice(iter(self.dataset), self.rank, None, self.size)
        share = itertools.islice(share, self.skip, None)
        info = get_worker_info()
        if info is None or info.num_workers == 1:
            return share
        workers, worker, size = info.num_workers, info.id, self.batch_size
        return (item for k, item in enumerate(share) if (k // size) % workers == worker)


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
        self._share = RankShare(dataset, world, config.batch_size)
        self._loader = DataLoader(self._share, batch_size=config.batch_size, num_workers=config.num_workers,
                                  pin_memory=config.pin, drop_last=config.drop_last, collate_fn=collate_fn, **extra)

    def __iter__(self):
        self._share.skip = self.sampler.start  # item by item: a new batch size continues at the next item
        return iter(self._loader)


class FixedLoader:
    """The user's own DataLoader, read as it is: its sampler or batch_sampler decides the batches.

    A pass is one iteration of the loader. A run that ends mid-pass leaves the pass open, and the
    next run on this engine continues it: the same iteration, so a random sampler's order of this
    pass is kept, as a hand-written loop that keeps its iterator would. (With loader workers the
    pass is closed at the run's end, so no worker outlives its run; the loader is then read again
    and the samples this rank already used are skipped, as after a resume, which continues
    exactly only where the loader's order is deterministic.)
    """

    draws_on_its_own = True  # iter() of the user's loader draws its own base seed (epoch_order.draw_as_a_loader_pass)

    def __init__(self, loader, note=lambda text: None):
        self.sampler = StreamPosition()
        self.batch_size = loader.batch_size
        self._loader = loader
        self._open: _Pass | None = None  # the pass a run left mid-way (num_workers=0 only)
        self._note = note  # says where a pass is read again mid-way (what the run's summary then states)

    def batches_per_pass(self) -> int:
        return len(self._loader)

    def __iter__(self):
        epoch, start = self.sampler.epoch, self.sampler.start
        open_pass = self._open
        if open_pass is not None and (open_pass.epoch, open_pass.read) == (epoch, start):
            return open_pass
        batches = iter(self._loader)
        skipped = 0
        while skipped < start:
            skipped += batch_size(next(batches))
        if start:
            self._note(f"the DataLoader was read again {start} samples into a pass (its workers stop at each run's "
                       "end, or a resume): the rest of the pass follows its sampler's new order, the same only "
                       "where that order does not change between passes")
        open_pass = _Pass(batches, epoch, skipped)
        self._open = open_pass if not self._loader.num_workers else None
        return open_pass


class _Pass:
    """One iteration of a user's DataLoader, counting the samples read (where the next run continues)."""

    def __init__(self, batches, epoch: int, read: int):
        self.batches, self.epoch, self.read = batches, epoch, read

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.batches)
        self.read += batch_size(batch)
        return batch
