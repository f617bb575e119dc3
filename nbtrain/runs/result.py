"""RunResult: a finished (or stopped) run's config, history and measured summary."""
from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..config import TrainConfig
from ..format import PrintsAsTable, duration, number, plural
from ..measure.load import Load
from ..measure.steady import SteadyRate, of_columns
from ..metrics import PHASES, MetricsLog
from ..records import StartInfo, Summary, samples_start


DECLARED = {f.name for f in fields(Summary)}
WHERE_IT_BEGAN = {f.name for f in fields(StartInfo)} - DECLARED


def summarize(log: MetricsLog, extra: Mapping) -> Summary:
    """Numbers measured on this run's history; `extra` adds what only the engine knows, by Summary's names (a
    start info's own, where a run began, are left out: the summary rebuilt from a DDP run's start)."""
    cols = log.columns
    steps = len(cols["step"])
    train_time = cols["time"][-1] if steps else 0.0
    first = samples_start(log)
    samples = cols["samples"][-1] - first if steps else 0
    steady = of_columns(cols, first)
    losses = [x for x in cols["loss"] if x is not None]
    phase_totals = {p[:-2]: sum(cols[p]) for p in PHASES}
    step_total = sum(cols["step_s"]) or float("nan")
    held = held_out(log)
    epochs = extra.get("epochs_trained")
    measured = dict(
        steps=steps, samples=samples, train_time_s=train_time,
        # The headline is the steady rate (warm-up set apart), the one every view shows.
        samples_per_s=steady.rate, steady=steady,
        overall_samples_per_s=samples / train_time if train_time > 0 else float("nan"),
        first_loss=losses[0] if losses else float("nan"), last_loss=losses[-1] if losses else float("nan"),
        val_loss=held.pop("val_loss", None), val_acc=held.pop("val_acc", None),
        val_metrics=held,  # the user's metrics and validation_step's self.log values
        phase_fraction={k: v / step_total for k, v in phase_totals.items()},
        phase_ms_per_step={k: 1000 * v / steps for k, v in phase_totals.items()} if steps else {},
        epochs=epochs,  # the table's "steps / epochs" under the name it shows
        time_per_epoch_s=train_time / epochs if epochs else float("nan"))
    given = {k: v for k, v in extra.items() if k not in WHERE_IT_BEGAN}
    undeclared = set(given) - DECLARED
    if undeclared:  # a name the run writes is declared in records.Summary, or a store would drop it unread
        raise TypeError(f"summarize: records.Summary declares no {', '.join(sorted(undeclared))}")
    return Summary.from_dict({**measured, **given, "epochs": epochs})


def held_out(log: MetricsLog) -> dict:
    """The latest validation's numbers. Not simply the last epoch event's: with validation every N
    steps the epoch boundaries carry none."""
    for event in reversed(log.of_type("epoch")):
        if event.get("val_loss") is not None:
            return {k: v for k, v in event.items() if k not in ("type", "epoch", "step", "partial")}
    return {}




def time_split_text(summary: Summary) -> str:
    """'40.6 s in the call: start-up 9.1 s, warm-up 12.0 s, training 17.3 s, validation 2.0 s, other 0.2 s'
    (parts that took no time left out; without the call's total where the run was not a call of its own)."""
    parts = ", ".join(f"{name} {duration(seconds)}" for name, seconds in summary.time_split.items()
                      if abs(seconds) >= 0.0005)
    return (f"{duration(summary.call_s)} in the call: " if summary.call_s is not None else "") + parts


def peak_memory(summary: Summary) -> tuple[float | None, int]:
    """(MB, processes): a run's peak memory over all its processes. A DDP run's rank 0 alone would look
    like half the memory of the same run in one process."""
    peaks = summary.peak_mem_mb_per_rank or ()
    if len(peaks) > 1 and all(p is not None for p in peaks):
        return float(sum(peaks)), len(peaks)
    return summary.peak_mem_mb, 1


def peak_memory_text(summary: Summary) -> str:
    """'762 MB', or '891.6 MB in 2 processes' (their peaks summed)."""
    mb, processes = peak_memory(summary)
    return number(mb, " MB") + (f" in {processes} processes" if processes > 1 else "")


def _per_rank(peaks) -> str:
    if not peaks or len(peaks) < 2:
        return ""
    return "; per rank " + ", ".join(f"{rank}: {number(mb, ' MB')}" for rank, mb in enumerate(peaks))


@dataclass
class RunResult(PrintsAsTable):
    config: TrainConfig
    log: MetricsLog
    summary: Summary
    status: str = "completed"  # completed | stopped | interrupted | failed
    message: str = ""
    name: str | None = None
    extras: dict = field(default_factory=dict)

    @property
    def history(self) -> dict[str, list]:
        return self.log.columns

    def __post_init__(self):
        # a summary given as its JSON dict (a rank's saved result, a user's own) is read into the record
        if not isinstance(self.summary, Summary):
            self.summary = Summary.from_dict(self.summary)

    def rows(self) -> list[tuple[str, str]]:
        """The summary as (label, text) rows, the same for the console and the notebook."""
        s, c = self.summary, self.config
        phases = ", ".join(f"{k} {100 * v:.0f}%" for k, v in s.phase_fraction.items() if not math.isnan(v))
        return [
            ("status", self.status + (f" — {self.message}" if self.message else "")),
            ("device", f"{s.device or '-'} x{s.world_size}, {c.precision}"
                       + (f", {s.strategy}" if s.world_size > 1 and s.strategy else "")),
            ("global batch", f"{number(s.global_batch)} (batch {c.batch_size} x accumulate "
                             f"{c.accumulate_grad_batches} x {s.world_size} processes)"),
            ("learning rate", s.lr_note or "-"),
            ("steps / epochs", f"{plural(s.steps, 'step')} / {plural(s.epochs_trained, 'epoch')}"),  # not "5 / 0.625"
            ("samples/s", self.steady().text("") + (f"; {self.steady().warmup_text()}" if s.steps else "")
                          + (self.load().beside() if self.load() else "")),
            ("total time", f"{duration(s.train_time_s)} for {s.steps} steps"
                           + (f", {duration(s.time_per_epoch_s)} per epoch" if (s.epochs_trained or 0) >= 1 else "")),
            *([("where the time went", time_split_text(s))] if s.time_split else []),
            ("peak memory", f"{peak_memory_text(s)} ({s.mem_kind or '-'})" + _per_rank(s.peak_mem_mb_per_rank)),
            ("step time by phase", phases or "-"),
            ("loss first -> last", f"{number(s.first_loss)} -> {number(s.last_loss)}"),
        ] + ([("held-out loss / accuracy", f"{number(s.val_loss)} / "
                                           f"{number(None if s.val_acc is None else 100 * s.val_acc, '%')}"
                                           + "".join(f", {k} {number(v)}" for k, v in s.val_metrics.items()))]
             if s.val_loss is not None else []) \
          + [("note", note) for note in s.notes]

    def steady(self) -> SteadyRate:
        """The steady-state rate with its interval (stored summaries carry it; older ones only the rate)."""
        s = self.summary
        if s.steady is not None:
            return s.steady
        nan = float("nan")
        return SteadyRate(s.samples_per_s, nan, nan, nan, 0, 0.0, s.steps, s.train_time_s)

    def load(self) -> Load | None:
        """How busy the machine was during the run (None: a run stored before loads were recorded)."""
        return self.summary.load

    def table(self) -> str:
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        title = f"nbtrain run{' ' + self.name if self.name else ''}"
        return "\n".join([title] + [f"  {label:<{width}}  {text}" for label, text in rows])

    def html(self, notes=()) -> str:
        """The table as HTML, as a notebook shows it (`notes`: lines under it)."""
        title = html.escape(f"nbtrain run{' ' + self.name if self.name else ''}")
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                       f"<td style='text-align:left'>{html.escape(text)}</td></tr>" for label, text in self.rows())
        below = "".join(f"<div>{html.escape(note)}</div>" for note in notes)
        return f"<div><b>{title}</b><table>{rows}</table>{below}</div>"

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        s = self.summary
        return (f"RunResult({self.name or 'unnamed'}: {self.status}, {s.steps} steps, "
                f"{number(s.samples_per_s)} samples/s, loss {number(s.last_loss)})")

    def plot(self, path=None, ax=None):
        """Loss against step (and samples/s on a twin axis); saved to `path` when given."""
        from ..plotting import plot_history
        return plot_history(self.log, path=path, ax=ax, title=self.name)
