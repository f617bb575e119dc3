"""DataLoaders kept with their worker processes running between runs (Engine.keeping_workers)."""
from __future__ import annotations

from torch.utils.data import DataLoader

from .data import stop_workers


class KeptLoaders:
    """DataLoaders whose persistent workers outlive the run that started them (Engine.keeping_workers), one
    per loader settings: a tool that alternates configs in short blocks takes each config's loader back
    with its workers running, so a worker start-up is paid once, not in every block. Each iteration
    still starts from the sampler's position (a persistent iterator's reset drains the batches
    prefetched for the last one), so the data order is a fresh loader's."""

    def __init__(self):
        self.loaders: dict = {}

    def get(self, key, build) -> DataLoader:
        if key not in self.loaders:
            self.loaders[key] = build()
        return self.loaders[key]

    def settle(self, loader) -> bool:
        """At a run's end: when `loader` is kept, wait for the batches its workers are still making for the
        pass that ended (True); else False (the caller stops its workers). Left running, they would take
        the cores from whatever runs next (in a race, the next config's block: alternating a config with
        two workers and one without slowed the one without from 7,200 to 2,700 samples/s on 2 cores).
        Iterating an empty pass does it with the DataLoader's own means: a persistent iterator's reset
        collects what its workers were asked for and asks for nothing new."""
        if not any(kept is loader for kept in self.loaders.values()) or loader._iterator is None:
            return any(kept is loader for kept in self.loaders.values())
        sampler = loader.sampler
        epoch, start = sampler.epoch, sampler.start
        sampler.set_position(epoch, sampler.per_epoch)  # no sample left in this pass
        try:
            iter(loader)
        finally:
            sampler.set_position(epoch, start)
        return True

    def keep_only(self, keys=()) -> None:
        """Stop the workers of every kept loader but those of `keys` (the settings a caller goes on with)."""
        for key in [k for k in self.loaders if k not in set(keys)]:
            stop_workers(self.loaders.pop(key))
