"""torch's intra-op CPU threads for one run: the config's `num_threads` while it trains, the process's own count
put back after (a tool's trial, a later run without the option, the user's own code see what they had).

Only the intra-op count: torch.set_num_interop_threads cannot change once torch has run anything, so nbtrain
never touches it. A DDP rank starts at this machine's cores / its ranks (distributed/plan.py, set by the worker
before the run); `num_threads` given overrides that in every rank. Threads change no math beyond the order of
float sums (a reduction split across threads adds in another order), so a run at any count learns the same
model up to that rounding.
"""
from __future__ import annotations

import contextlib
import os

import torch


class RunThreads:
    """The thread count of the run in progress: `follow(wanted)` at its start and at a live change of the
    option, `restore()` at its end."""

    def __init__(self):
        self.before = torch.get_num_threads()

    def follow(self, wanted: int | None) -> int:
        """Run at `wanted` threads (None: the count the process had when the run started); the count now."""
        target = self.before if wanted is None else wanted
        if torch.get_num_threads() != target:
            torch.set_num_threads(target)
        return torch.get_num_threads()

    def restore(self) -> None:
        if torch.get_num_threads() != self.before:
            torch.set_num_threads(self.before)


@contextlib.contextmanager
def running(engine):
    """The engine's run at its config's thread count (a DDP rank's summary says it), the count before put back."""
    threads = RunThreads()
    try:
        threads.follow(engine.config.num_threads)
        engine.note("num_threads", rank_note(engine.world.size, engine.config.num_threads))
        yield threads
    finally:
        threads.restore()


def rank_note(world_size: int, wanted: int | None) -> str | None:
    """What a DDP rank's summary says of its threads (None outside DDP): how many, and where the count came
    from, so a CPU speed-up of several ranks is read against one process at the same threads per process."""
    if world_size < 2:
        return None
    now = torch.get_num_threads()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    why = (f"num_threads={wanted}" if wanted is not None
           else f"this machine's {os.cpu_count() or 1} cores / {local} local ranks")
    return (f"each rank trained at {now} torch thread{'s' * (now != 1)} ({why}); compare its speed with one "
            f"process at {now} thread{'s' * (now != 1)} (num_threads={now}), not with one at torch's default")


@contextlib.contextmanager
def held(wanted: int | None):
    """torch at `wanted` threads inside the block (None: as it is), the count before put back after: a tool's
    reading outside Engine.run (a step timed alone, the load meter around a block) at the config's count."""
    threads = RunThreads()
    try:
        threads.follow(wanted)
        yield torch.get_num_threads()
    finally:
        threads.restore()
