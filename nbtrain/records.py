"""A run's records, their layout written once: the events a run emits, what its start says, its summary.

Events travel as plain JSON dicts (a DDP rank writes them to a file and the kernel replays them; the run
store keeps them), so an event is a TypedDict: the dict is the format. What a run says of itself (its
engine's info, its start, its summary) is a typed, frozen record, a dataclass with a JSON round trip
(`to_dict`/`from_dict`, `to_json`/`from_json`), as distributed/plan.LaunchPlan is. Its defaults read the
stores of older versions: a name they lack reads as its default (None: not recorded), and a name a newer
version wrote is left out. A record is read by its fields (`summary.samples_per_s`), never as a dict: a
name it does not declare is an error naming the record, the name and its fields (a dict's `get` read None
for a renamed field, `summary.get("batch_size")` long after it became `global_batch`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypedDict

from .measure.load import Load
from .measure.steady import SteadyRate
from .options import ATOMS


class Record:
    """A frozen dataclass's JSON round trip; its fields are its only face."""
    NESTED: ClassVar[dict[str, type]] = {}  # a field held as a record (a dataclass) of its own, read from its dict

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values (nested records as dicts, tuples as lists)."""
        return {name: _plain(value) for name, value in vars(self).items()}

    def to_json(self) -> str:
        """JSON text; a value JSON cannot hold (a NumPy number a user logged) as its text."""
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        declared = {f.name: f for f in dataclasses.fields(cls)}
        return cls(**{name: _read(declared[name], cls.NESTED.get(name), value)
                      for name, value in values.items() if name in declared})

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def __getattr__(self, name: str):
        """Reached only where no field, property or method has `name`: one error that says what the record has."""
        if name.startswith("__"):  # Python's own probes (copy, pickle): the plain error they expect
            raise AttributeError(name)
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; its fields: "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")

    def __getitem__(self, name):
        """A record read as a dict (as nbtrain's records once were): one error saying how to read it now."""
        hint = f"{type(self).__name__.lower()}.{name}" if isinstance(name, str) and name.isidentifier() else \
            f"getattr(record, {name!r})"
        raise TypeError(f"{type(self).__name__} is read by its fields, not as a dict: {hint} (or .to_dict() for a "
                        f"dict of every field)")


def _plain(value):
    if type(value) in ATOMS:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # field by field: asdict's deep copy of every value would be read again here anyway
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _read(declared: dataclasses.Field, nested: type | None, value):
    """A stored value as its field holds it: a nested record from its dict, a list as the field's tuple, a
    number that engine.support.plain wrote as text ('inf') as the float it was."""
    if value is None:
        return None
    if nested is not None and isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(nested)}
        return nested(**{k: v for k, v in value.items() if k in known})
    if isinstance(value, list) and str(declared.type).startswith("tuple"):
        return tuple(value)
    if isinstance(value, str) and value in ("inf", "-inf", "nan") and "float" in str(declared.type):
        return float(value)
    return value


@dataclass(frozen=True)
class EngineInfo(Record):
    """What the engine says about a run at its start and again in its summary (None: not recorded, as in a
    store written before the name existed)."""
    device: str | None = None          # "cpu", "cuda:0", ...
    strategy: str | None = None        # "single process" | "ddp" | "dp" | "fsdp"
    world_size: int = 1
    global_batch: int | None = None
    lr: float | None = None            # the first param group's target learning rate
    lr_note: str | None = None         # how that rate was chosen, in words
    precision: str | None = None
    scaler: bool | None = None         # a GradScaler is on
    pin_memory: bool | None = None
    seed: int | None = None
    workload: str | None = None        # a digest of what the run trains beyond its config (engine/workload.py)
    inert: tuple[str, ...] = ()        # options the run's data could not use (a stream's order is its own: shuffle)
    threads: int | None = None         # torch's intra-op threads the run trained at (engine/threads.py)


@dataclass(frozen=True)
class StartInfo(EngineInfo):
    """The "start" event's info: the engine's, and where this run begins."""
    samples_start: int = 0             # samples trained before this run (a run continues its engine's count)
    step_start: int = 0
    planned_steps: int | None = None   # what this run trains if nothing stops it
    resumed_from: str | None = None    # the checkpoint a resumed run loaded


@dataclass(frozen=True)
class Summary(EngineInfo):
    """RunResult.summary: numbers measured on the run's history (runs/result.summarize) and the engine's."""
    NESTED: ClassVar[dict[str, type]] = {"steady": SteadyRate, "load": Load}
    steps: int = 0                     # step rows in the log (a thinned log: every step it saw)
    run_steps: int | None = None       # steps this run trained; None where a DDP run ended before its ranks reported
    samples: int = 0
    train_time_s: float = 0.0
    samples_per_s: float = math.nan         # the steady rate, the headline every view shows
    steady: SteadyRate | None = None   # its interval and warm-up; None in stores from before it was measured
    overall_samples_per_s: float = math.nan
    first_loss: float = math.nan
    last_loss: float = math.nan
    val_loss: float | None = None
    val_acc: float | None = None
    val_metrics: dict[str, float] = field(default_factory=dict)
    phase_fraction: dict[str, float] = field(default_factory=dict)
    phase_ms_per_step: dict[str, float] = field(default_factory=dict)
    epochs_trained: float | None = None
    epochs: float | None = None        # the same, under the name the table shows ("steps / epochs")
    time_per_epoch_s: float = math.nan
    status: str | None = None
    peak_mem_mb: float | None = None
    peak_mem_mb_per_rank: tuple[float | None, ...] | None = None  # a DDP run's, one per rank
    mem_kind: str | None = None
    notes: tuple[str, ...] = ()
    logged: dict[str, float] = field(default_factory=dict)  # the user's self.log values at the end
    device_done_s: float | None = None  # CUDA: when the device finished the run's last step, on the run's clock
    time_split: dict[str, float] | None = None  # seconds by part (engine.report.time_split); nbtrain.fit adds "other"
    call_s: float | None = None        # nbtrain.fit's wall time, which the time split's parts sum to
    load: Load | None = None           # other processes' share of the machine meanwhile
    compile_s: float | None = None     # a compiled run's compile time, apart from its steps (engine/report.py)

    @property
    def trained_steps(self) -> int:
        """The steps this run trained; where the summary was rebuilt from the kernel's log (a DDP run stopped
        before its ranks reported), the steps that log holds."""
        return self.steps if self.run_steps is None else self.run_steps

    def with_notes(self, notes) -> "Summary":
        return self.replace(notes=(*self.notes, *notes))


class StartEvent(TypedDict):
    type: Literal["start"]
    config: dict[str, Any]       # TrainConfig.to_dict()
    info: dict[str, Any]         # StartInfo.to_dict()


class StepsEvent(TypedDict, total=False):
    type: Literal["steps"]
    rows: dict[str, list]        # one log window: metrics.COLUMNS, a list each
    thinned: dict                # a replayed thinned history says what was dropped before it


class ChangeEvent(TypedDict):
    type: Literal["change"]
    step: int
    changes: dict[str, list]     # option: [old, new]


class EpochEvent(TypedDict, total=False):
    """An epoch's end, or a validation (`partial`: mid-epoch); held-out numbers where it validated."""
    type: Literal["epoch"]
    epoch: int
    step: int
    partial: bool
    val_loss: float
    val_acc: float


class LoggedEvent(TypedDict):
    type: Literal["logged"]
    step: int
    values: dict[str, float]


class EndEvent(TypedDict, total=False):
    type: Literal["end"]
    summary: dict[str, Any]      # Summary.to_dict()
    status: str
    message: str                 # absent from some older stores


class _Log(Protocol):
    def last(self, event_type: str) -> dict | None: ...


def start_info(log: _Log) -> StartInfo:
    """The run's start info; every default for a log with no "start" event (one that never started)."""
    start = log.last("start")
    return StartInfo.from_dict(start["info"]) if start else StartInfo()


def samples_start(log: _Log) -> int:
    """Samples trained before this run's first step: the x-axis of its rates starts here."""
    return start_info(log).samples_start
