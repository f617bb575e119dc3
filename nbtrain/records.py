"""A run's records, their layout written once: the events a run emits, what its start says, its summary.

They travel as plain JSON dicts (a DDP rank writes its events to a file and the kernel replays them;
the run store keeps them as JSON), so each record here is a TypedDict: the dict is the format, and a
store written before these names existed opens as it did. Producers build them with these names and
readers read them through the functions below, so a key is spelled in one place.
"""
from __future__ import annotations

from typing import Any, Literal, Protocol, TypedDict


class EngineInfo(TypedDict, total=False):
    """What the engine says about a run at its start and again in its summary."""
    device: str           # "cpu", "cuda:0", ...
    strategy: str         # "single process" | "ddp" | "dp" | "fsdp"
    world_size: int
    global_batch: int
    lr: float             # the first param group's target learning rate
    lr_note: str          # how that rate was chosen, in words
    precision: str
    scaler: bool          # a GradScaler is on
    pin_memory: bool
    seed: int


class StartInfo(EngineInfo, total=False):
    """The "start" event's info: the engine's, and where this run begins."""
    samples_start: int    # samples trained before this run (a run continues its engine's count)
    step_start: int
    planned_steps: int    # what this run trains if nothing stops it
    resumed_from: str     # the checkpoint a resumed run loaded


class Summary(EngineInfo, total=False):
    """RunResult.summary: numbers measured on the run's history (runs/result.summarize) and the engine's."""
    steps: int                   # step rows in the log (a thinned log: every step it saw)
    run_steps: int               # steps this run trained; absent where a DDP run ended before its ranks reported
    samples: int
    train_time_s: float
    samples_per_s: float         # the steady rate, the headline every view shows
    steady: dict                 # measure.steady.SteadyRate.as_dict(); absent from older stores
    overall_samples_per_s: float
    first_loss: float
    last_loss: float
    val_loss: float | None
    val_acc: float | None
    val_metrics: dict[str, float]
    phase_fraction: dict[str, float]
    phase_ms_per_step: dict[str, float]
    epochs_trained: float
    epochs: float                # the same, under the name the table shows ("steps / epochs")
    time_per_epoch_s: float
    status: str
    peak_mem_mb: float | None
    peak_mem_mb_per_rank: list[float | None]   # a DDP run's, one per rank
    mem_kind: str
    notes: list[str]
    logged: dict[str, float]     # the user's self.log values at the end
    device_done_s: float         # CUDA: when the device finished the run's last step, on the run's clock
    time_split: dict[str, float]  # seconds by part (engine.report.TIME_PARTS); nbtrain.fit adds "other"
    call_s: float                # nbtrain.fit's wall time, which the time split's parts sum to
    load: dict                   # measure.load.Load.as_dict(): other processes' share of the machine meanwhile


class StartEvent(TypedDict):
    type: Literal["start"]
    config: dict[str, Any]       # TrainConfig.to_dict()
    info: StartInfo


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
    summary: Summary
    status: str
    message: str                 # absent from some older stores


class _Log(Protocol):
    def last(self, event_type: str) -> dict | None: ...


def start_info(log: _Log) -> StartInfo:
    """The run's start info; empty for a log with no "start" event (one that never started)."""
    start = log.last("start")
    return start["info"] if start else StartInfo()


def samples_start(log: _Log) -> int:
    """Samples trained before this run's first step: the x-axis of its rates starts here."""
    return start_info(log).get("samples_start", 0)


def run_steps(summary: Summary) -> int:
    """The steps this run trained; where the summary was rebuilt from the kernel's log (a DDP run stopped
    before its ranks reported), the steps that log holds."""
    return summary.get("run_steps", summary.get("steps"))
