"""An epoch's order and the batches cut from held tensors in it: the DataLoader's sampler (DistributedSampler's
order, repositioned at any epoch and sample, never rebuilt), that order as one tensor, and one gather per
epoch cut into batches that each lie where a freshly collated batch would (data.HeldBatches reads them)."""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler, Sampler

from .dist import World


class EpochSampler(Sampler):
    """This rank's indices for one epoch, from `start` on; repositioned, never rebuilt."""

    def __init__(self, dataset, world: World, shuffle: bool, seed: int):
        self._order = DistributedSampler(dataset, num_replicas=world.size, rank=world.rank,
                                         shuffle=shuffle, seed=seed, drop_last=False)
        self.per_epoch = self._order.num_samples
        self.length = len(dataset)  # the data set's length when built: another length needs another sampler
        self.epoch = 0
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        self._order.set_epoch(self.epoch)
        indices = list(self._order)
        return iter(indices[self.start:])

    def order(self) -> torch.Tensor:
        """The indices `iter` gives, as one tensor, drawn as DistributedSampler draws them: for held batches,
        which would spend more on the list (its items made and read back one by one) than on a small step."""
        d = self._order
        n = len(d.dataset)
        g = torch.Generator()
        g.manual_seed(d.seed + self.epoch)
        indices = torch.randperm(n, generator=g) if d.shuffle else torch.arange(n)
        if not d.drop_last and d.total_size > n:  # padded with the first indices again, to a multiple of the ranks
            indices = torch.cat([indices, indices.repeat(math.ceil((d.total_size - n) / n))[:d.total_size - n]])
        return indices[d.rank:d.total_size:d.num_replicas][self.start:]

    def __len__(self) -> int:
        return self.per_epoch - self.start



ALIGNMENT = 64  # bytes: where torch's allocators start every new tensor, a collated batch among them


def aligned(rows: torch.Tensor) -> torch.Tensor:
    """`rows` where a fresh tensor would lie: a slice starting off the allocator's alignment is copied. Math
    libraries pick kernels by alignment, and a matmul on misaligned inputs can differ in the last bit from
    the DataLoader's freshly collated batch; an aligned slice stays a view (no copy)."""
    return rows if rows.data_ptr() % ALIGNMENT == 0 else rows.clone()


def batch_views(rows: torch.Tensor, order: torch.Tensor, size: int, device: torch.device) -> Iterator[torch.Tensor]:
    """`rows[order]` on `device`, cut into batches of `size` rows, in one gather. Each batch is a view that
    starts on the allocator's alignment, as a freshly collated batch does (see aligned): where a batch's
    bytes are no multiple of it, each full batch is followed in the gathered tensor by a few padding rows
    (copies of its first), up to a quarter of its size; past that, misaligned batches are copied one by one,
    as they are read (not all at once: that could hold the epoch twice)."""
    full = len(order) // size
    row_bytes = rows[0].nbytes if len(rows) else 0
    period = ALIGNMENT // math.gcd(row_bytes, ALIGNMENT)  # rows after which a row starts aligned again
    pad = -size % period
    if not full or 4 * pad > size:
        pad, full = 0, 0  # one plain gather, each batch a slice of it
    head = order[:full * size].view(full, size)
    index = torch.cat([torch.cat([head, head[:, :1].expand(full, pad)], 1).flatten(), order[full * size:]])
    gathered = rows.index_select(0, index.to(rows.device)).to(device)
    stride = size + pad
    batches = list(gathered[:full * stride].view(full, stride, *rows.shape[1:])[:, :size].unbind(0))
    batches += [gathered[lo:lo + size] for lo in range(full * stride, len(gathered), size)]
    if full == 0 or gathered.data_ptr() % ALIGNMENT:
        return map(aligned, batches)
    return iter(batches)


def draw_as_a_loader_pass(loader) -> None:
    """One number drawn from torch's global generator, as `iter(DataLoader)` draws its base seed (its workers'
    seeds) there at every pass of a loader without a generator of its own, train and validation loaders alike:
    the user's own loop draws it, so every later dropout mask and random augmentation lies where theirs does.
    nbtrain's loaders seed their workers from their own generator (a resumed run's workers match); this draw
    only keeps the global stream in step. A loader read as the user built it (FixedLoader) draws by itself."""
    if getattr(loader, "draws_on_its_own", False):
        return
    torch.empty((), dtype=torch.int64).random_()


def start_pass(loader, offset: int):
    """iter(loader), after the draw the user's DataLoader makes when a pass starts (offset 0; a run continuing a
    pass mid-way makes none, as the user's loop keeps its iterator)."""
    if offset == 0:
        draw_as_a_loader_pass(loader)
    return iter(loader)
