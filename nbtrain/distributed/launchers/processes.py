"""Ranks that are processes of this machine (the local and torchrun launchers): their output printed, their
exit codes read, the first failure found, every process ended."""
from __future__ import annotations

import re
import sys
import time

from ..pool import Relay, terminate
from .base import WorkerError, first_raised, signal_error


class ProcessRanks:
    """Running worker processes (base.Ranks): the ranks themselves, or one torchrun agent that runs them.

    ranks: the rank of each process, or None when one agent runs them all (it reports its ranks' ends).
    outputs: (FileTail, prefix, is_err) of each rank's output file; `keep`: what lives as long as the
    job (the store the ranks meet at)."""

    def __init__(self, run, plan, procs, relay: Relay, ranks, shipped=(), keep=None, outputs=()):
        self.run, self.plan, self.procs, self.relay, self.ranks = run, plan, procs, relay, ranks
        self.shipped = shipped
        self._keep = keep
        self._outputs = list(outputs)
        self._err_tail: list[str] = []
        self._replay = run.tail_events()

    def events(self) -> list[dict]:
        return self._replay()

    def show(self, echo: bool, final: bool = False) -> None:
        self.relay.show(echo)
        for tail, prefix, is_err in self._outputs:
            for line in (tail.rest() if final else tail.lines()):
                if is_err:
                    self._err_tail = (self._err_tail + [prefix + line])[-40:]
                if echo:
                    target = sys.stderr if is_err else sys.stdout
                    target.write(prefix + line)
                    target.flush()

    def state(self) -> str:
        codes = [p.poll() for p in self.procs]
        if any(c not in (None, 0) for c in codes):
            return "failed"
        return "completed" if all(c == 0 for c in codes) else "running"

    def request_stop(self) -> None:
        self.run.request_stop()

    def close(self, echo: bool) -> None:
        terminate(self.procs)
        self.relay.finish(echo)
        self.show(echo, final=True)
        self._keep = None

    def error(self) -> WorkerError:
        """The root cause: a rank killed by a signal, else the first traceback written."""
        error = self._diagnose()
        error.pids = [p.pid for p in self.procs]
        return error

    def _diagnose(self) -> WorkerError:
        time.sleep(0.2)  # a rank's peers fail a moment after it; let its own report land
        codes = [p.poll() for p in self.procs]
        if self.ranks is not None:
            for rank, code in zip(self.ranks, codes):
                if code is not None and code < 0:
                    return signal_error(rank, -code)
        raised = first_raised(self.run, self.plan.timeout_s, self.shipped)
        if raised is not None:
            return raised
        tail = "".join(self._err_tail + [line for lines in self.relay.tails.values() for line in lines])
        found = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", tail, re.S)
        if found and int(found.group(2)) < 0:
            return signal_error(int(found.group(1)), -int(found.group(2)))
        which = [r for r, c in zip(self.ranks or ["launcher"], codes) if c not in (None, 0)]
        return WorkerError(f"{'rank ' if self.ranks else ''}{which[0]} exited with code "
                           f"{[c for c in codes if c not in (None, 0)][0]}; its last output:\n{tail}")
