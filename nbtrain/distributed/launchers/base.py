"""The launcher contract: a `Target` (one place ranks run), the `Ranks` it starts, and the loop that drives them.

A target owns its options, what it offers and the check of a config against that, and the run's plan:

    update_options(**o)   set options (one LauncherOptionError naming a bad one, its value, what is allowed)
    inventory(), check()  what it offers (this machine, a SLURM partition's node, a Ray cluster) and whether
                          it runs a config (ConfigError naming the target; where it cannot tell, it says so)
    plan(config)          the launch plan (distributed/plan.py decides)
    start(run, plan)      the plan's ranks, each running nbtrain's worker entry (distributed/worker.py,
                          `run_job`) on the run directory (distributed/rundir.py): `Ranks`, the running job

`supervise` drives any `Ranks` the same way, so fit_distributed, a SLURM job's handle, the magic, the panel
and the tools never ask which launcher ran:

    events()        the run's events added since the last call (rank 0's event stream), in order
    show(echo)      print the ranks' output received so far, each line prefixed `[rank N]`
    state()         "running", "completed" or "failed"; once "completed", the run directory the
                    kernel holds has the outputs (model, engine state, result, return value)
    request_stop()  every rank stops after the same optimizer step (the ranks vote: requeue.py)
    error()         once "failed": the root cause, a WorkerError with the failing rank's traceback
    close(echo)     end every process the launcher started (idempotent); print what output is left

A launcher whose ranks cannot write the kernel's run directory (another machine) brings the events,
outputs and errors back itself; the rest of nbtrain reads them from the run directory only.
"""
from __future__ import annotations

import re
import signal
import time
from typing import Protocol

from ... import hardware
from ...config import TrainConfig, check_runnable
from .. import plan as plans
from ..plan import LaunchPlan
from ..rundir import RunDir
from ..tracebacks import error_line, with_user_source
from ...hardware import Inventory
from ...metrics import MetricsLog

PEER_SYMPTOM = re.compile(r"connection (closed|reset) by peer|connectFullMesh failed", re.I)


class WorkerError(RuntimeError):
    """A rank failed: raised, was killed by a signal, or timed out in a collective."""

    def __init__(self, message: str, rank: int | None = None, traceback: str = "", signal_name: str | None = None):
        super().__init__(message)
        self.rank, self.traceback, self.signal_name = rank, traceback, signal_name
        self.pids: list[int] = []


class Ranks(Protocol):
    """A run's ranks once started, wherever they run."""

    def events(self) -> list[dict]: ...

    def show(self, echo: bool) -> None: ...

    def state(self) -> str: ...

    def request_stop(self) -> None: ...

    def error(self) -> WorkerError: ...

    def close(self, echo: bool) -> None: ...


class LauncherOptionError(ValueError):
    """A launcher option the target does not take, or a value it cannot use: names both and what is allowed."""


class Target:
    """One place ranks run (a module of this package each: local, torchrun, slurm, ray, debug), as submitit's
    Executor is: it owns its options (`update_options`, checked here, one error naming a bad one), what it
    offers (`inventory`) and the check of a config against that (`check`), the run's plan (`plan`), and
    `start`. A remote target never reads the kernel's machine: its inventory is its partition's or cluster's.

    OPTIONS: each option it takes -> what is allowed (the error's words); `read_option` checks a value."""

    name = ""
    OPTIONS: dict[str, str] = {}

    def __init__(self, **options):
        self.options: dict = {}
        self.checked = ""  # what the last check said it could not check ("" once it checked, or before)
        self.update_options(**options)

    def __repr__(self) -> str:
        return f"<nbtrain launcher {self.name!r} {self.options}>"

    def update_options(self, **options) -> "Target":
        """Set options (as submitit's update_parameters); a bad name or value raises LauncherOptionError."""
        for name, value in options.items():
            if name not in self.OPTIONS and not self.takes_any(name):
                takes = ", ".join(self.OPTIONS) or "none"
                raise LauncherOptionError(f"launcher={self.name!r}: option {name}={value!r}: allowed options: {takes}")
            self.options[name] = self.read_option(name, value)
        return self

    def takes_any(self, name: str) -> bool:
        """Whether an option outside OPTIONS passes on (SLURM's other sbatch options); read_option checks it."""
        return False

    def read_option(self, name: str, value):
        return value

    def inventory(self) -> Inventory | None:
        """What the target offers (a node of it: the devices of one node run its ranks); None: it cannot tell."""
        return hardware.inventory()

    def where(self) -> str:
        """The target, as a problem names it."""
        return "this machine"

    def check(self, config: TrainConfig) -> str:
        """Raise ConfigError when the target cannot run `config`; else what was checked, or why nothing was."""
        found = self.inventory()
        if found is None:
            self.checked = (f"launcher={self.name!r}: {self.where()} did not say what it offers: nothing was "
                            "checked against it")
            return self.checked
        check_runnable(self.config_to_check(config), found, self.where())
        self.checked = ""
        return ""

    def config_to_check(self, config: TrainConfig) -> TrainConfig:
        return config

    def plan(self, config: TrainConfig, **keywords) -> LaunchPlan:
        """The run's launch plan (plan.py decides; `keywords`: fit_distributed's launch keywords)."""
        return plans.for_fit(config, **keywords)

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> Ranks:
        """The plan's ranks of the worker entry on `run`, started; `shipped`: what the kernel sent (the
        recipe, or fn and args), to find the source of the user's frames in a rank's traceback."""
        raise NotImplementedError

    def release(self) -> None:
        """Let go of what the target took for a run that never started (a Ray cluster it started to read)."""


def supervise(ranks: Ranks, log: MetricsLog, echo: bool, stop=None,
              timeout: float | None = None) -> tuple[str, WorkerError | None]:
    """Replay the ranks' events into `log` and print their output until they end; ("completed" | "failed" |
    "interrupted", the error). `stop`: a threading.Event asking every rank to stop at one step boundary.
    `timeout`: seconds to follow them at most; past it ("running", None), the ranks left running (a batch job
    followed for a while: JobHandle.wait)."""
    __tracebackhide__ = True
    status, error = "completed", None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if stop is not None and stop.is_set():  # the ranks vote on it at their next log window
                ranks.request_stop()
                stop = None
            ranks.show(echo)
            for event in ranks.events():
                log.emit(event)
            state = ranks.state()
            if state == "failed":
                status, error = "failed", ranks.error()
                break
            if state == "completed":
                break
            if deadline is not None and time.monotonic() > deadline:
                status = "running"
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        if status != "running":
            ranks.close(echo)
        for event in ranks.events():
            log.emit(event)
    return status, error


# --- a rank's error, as the kernel shows it ---------------------------------------------------------

def first_raised(run: RunDir, timeout_s: float, shipped) -> WorkerError | None:
    """The root cause among the tracebacks the ranks wrote, or None (no rank raised)."""
    # A peer's "connection closed" can land before the root cause is written: the cause goes first.
    errors = sorted(run.errors(), key=lambda found: bool(PEER_SYMPTOM.search(found[1])))
    if not errors:
        return None
    rank, text = errors[0]
    error = raised_error(rank, text, timeout_s, shipped)
    error.nbtrain_part = run.error_part(rank)  # the recipe part that raised, as Recipe marks it
    return error


def signal_error(rank: int, number: int) -> WorkerError:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return WorkerError(f"rank {rank} was killed by {name}; the other ranks were stopped", rank=rank,
                       signal_name=name)


def raised_error(rank: int, text: str, timeout_s: float, shipped) -> WorkerError:
    text = with_user_source(text, shipped)
    last = error_line(text)
    if re.search(r"timed? ?out|timeout", last, re.I) and re.search(r"gloo|nccl|c10d|collective|store|wait", text, re.I):
        head = (f"rank {rank} timed out after {timeout_s:g} s waiting in a collective operation: another rank is "
                f"stuck or too slow (raise timeout= if that much waiting is expected)")
    elif re.search(r"connection (closed|reset) by peer", last, re.I):
        head = (f"rank {rank} lost its connection to another rank, which failed or was stopped first (on another "
                f"node, that node's launcher reports why)")
    else:
        head = f"rank {rank} raised {last}"
    return WorkerError(f"{head}\n\n[rank {rank}] {text}", rank=rank, traceback=text)
