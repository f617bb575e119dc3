"""DataLoaders for the engine: workers, pinning, sharding across ranks, and a resumable order.

The engine owns the loader so batch size and workers can change between steps. The
epoch's order is DistributedSampler's (a permutation seeded by seed + epoch, sharded
by rank), started at an offset, so a loader rebuilt mid-epoch — or after a resume —
continues with exactly the samples not yet seen.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from .config import TrainConfig
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


def batch_sizes(samples: int, batch_size: int, drop_last: bool) -> list[int]:
    """How many samples each batch of `samples` indices holds."""
    full, rest = divmod(samples, batch_size)
    return [batch_size] * full + ([rest] if rest and not drop_last else [])


def to_device(batch, device: torch.device, non_blocking: bool):
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device, non_blocking) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch
