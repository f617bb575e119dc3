"""What the engine's loop leans on: the training clock, a failed loop's loader released, JSON-able values,
Ctrl-C turned into a stop at the next step boundary, and a cheap seeding of torch."""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import signal
import threading
import time

import torch


def release_loader(tb) -> None:
    """Drop the failed loop's locals (its DataLoader iterator): the error's traceback, which the kernel
    keeps for %debug, would otherwise keep the loader's worker processes alive."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    loop = next((f for f in frames if f.f_code.co_name == "_train_some"), None)
    iterator = loop.f_locals.get("iterator") if loop is not None else None
    if iterator is None:
        return
    for frame in frames:  # the loop's frame and the loader's own frames below it (their `self`)
        if frame is loop or any(value is iterator for value in frame.f_locals.values()):
            frame.clear()
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def no_device_sync() -> None:
    pass


def seed_torch(seed: int) -> None:
    """torch.manual_seed, without its cost on a machine with no accelerator: there it seeds only the CPU
    generator in the end, after queueing a lazy seeding per device kind that records a stack trace each
    (~0.3 ms, a fixed cost of every run)."""
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


class Clock:
    """Training wall time, with validation (and checkpointing) paused out of it."""

    def __init__(self):
        self._start = time.perf_counter()
        self._paused = 0.0
        self.apart: dict[str, float] = {}  # the seconds paused, by what paused it (the summary's time split)

    @property
    def started(self) -> float:
        return self._start

    def now(self, t: float | None = None) -> float:
        return (time.perf_counter() if t is None else t) - self._start - self._paused

    @contextlib.contextmanager
    def paused(self, what: str = "validation"):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self._paused += spent
            self.apart[what] = self.apart.get(what, 0.0) + spent


def constructor_parameters(cls: type):
    """inspect.signature(cls.__init__).parameters (an immutable mapping), read once per __init__ function: an
    optimizer's constructor is read several times at every engine built (~0.05 ms each), and a class given
    another __init__ is read again."""
    return _parameters_of(cls.__init__)


@functools.lru_cache(maxsize=128)
def _parameters_of(init):
    return inspect.signature(init).parameters


_AS_THEY_ARE = frozenset((int, str, bool, type(None)))  # exactly these (a float may be inf, a subclass anything)


def plain(value):
    """JSON-able copy of a value (NaN stays a float; tuples become lists)."""
    if type(value) in _AS_THEY_ARE:
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return value


@contextlib.contextmanager
def stop_on_sigint(engine):
    """First Ctrl-C / kernel interrupt stops at the next step boundary; a second one aborts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum, frame):
        if engine.stopping:
            raise KeyboardInterrupt
        engine.stop("interrupted")

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
