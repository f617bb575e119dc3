"""An interrupt at any moment leaves a kernel that trains (DESIGN rule 12): torch's heavy lazy imports done once
with the interrupt held until they finish, and an import an interrupt cut short earlier (outside nbtrain) found and named.

torch imports torch._dynamo (and through it sympy and mpmath, ~800 modules, seconds) the first time an optimizer
is built. A KeyboardInterrupt landing inside leaves packages half imported: Python drops the package whose
__init__ was cut short from sys.modules but keeps the submodules that finished, which still point at the dropped
package object, and every later import of it fails (`module 'sympy' has no attribute 'logic'`).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import signal
import sys
import threading
import time
import warnings

HEAVY = ("torch._dynamo",)  # what the first optimizer built imports lazily (sympy, mpmath come with it)
_settled = False
_NO_SOURCE: set = set()  # names without a package to import (see half_imported)
_CLEAN: list = [()]  # sys.modules' names, in order, when half_imported last found nothing: the same names, the same answer


class StartUpNote(UserWarning):
    """What a process's first call spent on torch's imports, said where the call keeps no summary of its own to
    say it in (a checklist tool's trial: its results are tables of measurements, its runs' summaries shown to no one)."""


class HalfImported(RuntimeError):
    """A package an interrupt cut short cannot be imported again in this process."""


@contextlib.contextmanager
def interrupts_held():
    """A SIGINT arriving inside the block is delivered when the block ends (main thread only; elsewhere there
    is no signal to hold): what the interrupted code was importing finishes first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            if callable(previous):
                previous(signal.SIGINT, arrived[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


def half_imported() -> list[str]:
    """The packages an interrupted import left behind: missing from sys.modules while submodules of theirs that
    finished are there (the shortest such name of each)."""
    # One comparison in C instead of a walk of every name (~1 ms a call); of the names in order, each found to be
    # the very string object it was (~0.03 ms), not looked up in a set by its hash (~0.2 ms in a large process).
    # Names that came in another order are walked again, and kept in that order.
    if tuple(sys.modules) == _CLEAN[0]:
        return []
    names = dict.fromkeys(sys.modules)  # a set in sys.modules' order
    missing = {n.rpartition(".")[0] for n in names if "." in n and n.rpartition(".")[0] not in names} - _NO_SOURCE
    for name in sorted(missing):  # a name some library put in sys.modules by hand has no package to import
        if not _importable(name):
            _NO_SOURCE.add(name)
    missing -= _NO_SOURCE
    if not missing:
        _CLEAN[0] = tuple(names)
    return sorted(m for m in missing if not any(m.startswith(o + ".") for o in missing))


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def refuse_half_imported() -> None:
    """One clear refusal where an interrupt outside nbtrain cut an import short (the user's own first optimizer,
    before `%load_ext nbtrain`): torch cannot train in that process, and a repair in place is not sound (torch
    registers operators and caches as it imports, so its modules cannot run twice, and the modules that finished
    keep the dropped objects), so the kernel must restart; never an AttributeError from deep inside later."""
    broken = half_imported()
    if broken:
        raise HalfImported(f"an interrupt earlier in this process cut short Python's import of {', '.join(broken)} "
                           f"(its finished submodules are loaded, the package is not), so torch cannot train in "
                           "this process; restart the kernel (after `%load_ext nbtrain`, nbtrain makes these imports "
                           "with the interrupt held)")


def settle() -> float | None:
    """Before nbtrain builds anything: refuse a half-finished import, and do torch's heavy lazy imports once with
    the interrupt held, so that an interrupt of the first cell cannot land inside them. Returns the seconds this
    call spent importing them, None where they were already imported (the summary says a first call's cost)."""
    global _settled
    refuse_half_imported()
    if _settled:
        return None
    needed = [name for name in HEAVY if name not in sys.modules]
    started = time.perf_counter()
    with interrupts_held():
        for name in needed:
            importlib.import_module(name)
    _settled = True
    return time.perf_counter() - started if needed else None


def say_first_call(seconds: float | None, stacklevel: int = 3) -> None:
    """Say a first call's start-up (settle's seconds) as a StartUpNote, once: where the first call of a process is
    a tool rather than nbtrain.fit, whose summary says it (a later call made no imports, and says nothing)."""
    note = first_call_note(seconds)
    if note is not None:
        warnings.warn(f"nbtrain: {note}", StartUpNote, stacklevel=stacklevel)


def first_call_note(seconds: float | None) -> str | None:
    """What a call that made the heavy imports says about its start-up (None: it made none)."""
    if seconds is None:
        return None
    return (f"start-up {seconds:.1f} s of this call was torch's imports for the first optimizer ({', '.join(HEAVY)}, "
            "with sympy), once per process; `%load_ext nbtrain` makes them before the first cell")
