"""One runs table for every front-end: `%nbtrain_runs` (runs from the store) and the panel (its runs).

The columns that matter first: what differs from the first run, status, steps, the steady
samples/s with its 95% interval, held-out numbers, peak memory. Every other setting and
measurement is one folded "details" line per run.
"""
from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field

from .. import format
from ..records import EngineInfo, Summary
from .result import peak_memory_text

COLUMNS = (("run", "the run's number and name"),
           ("differs from the first run", "the options this run changed from the table's first run"),
           ("status", ""), ("steps", "optimizer steps of this run"),
           ("samples/s (95% interval)", "steady samples/s after the warm-up, with its 95% interval; "
                                        "the compare view says whether two runs differ"),
           ("held-out", "accuracy (and loss) on the held-out data at the run's end"),
           ("peak memory", "peak memory of the training device (process RSS on the CPU), summed over a run's "
                            "processes"))
HEADS = tuple(name for name, _ in COLUMNS)

# JupyterLab's theme colours (light or dark), with plain fallbacks; long values wrap inside their cell.
STYLE = """<style>
.nbtrain-runs-table {border-collapse:collapse; font-size:12px; line-height:1.35; width:100%}
.nbtrain-runs-table th, .nbtrain-runs-table td {border:1px solid var(--jp-border-color2, #ccc); padding:2px 5px;
  text-align:left; vertical-align:top; overflow-wrap:break-word}
.nbtrain-runs-table .nbtrain-run-details td {color:var(--jp-content-font-color2, #555)}
</style>"""


def not_applied(*summaries) -> set[str]:
    """The options one of these runs' data could not use (records.EngineInfo.inert): a difference in them is
    none (shuffle=True beside a stream, which is read in its own order)."""
    return {name for s in summaries for name in (getattr(s, "inert", None) or ())}


@dataclass
class Row:
    """One run as the table shows it, from the store or from a live panel."""
    number: int
    name: str | None
    status: str
    config: dict                  # TrainConfig.to_dict() values
    summary: Summary = field(default_factory=Summary)
    steps: int | None = None      # this run's own optimizer steps
    model: str | None = None
    created: float | None = None  # time.time() at recording
    info: EngineInfo = field(default_factory=EngineInfo)  # the run's engine info (device, lr), where known
    error: str = ""

    @classmethod
    def stored(cls, run) -> "Row":
        """A run-store row (runs.store.StoredRun)."""
        s = run.summary
        return cls(run.id, run.name, run.status, dict(run.config), s, s.trained_steps, run.model, run.created, s)

    def differs_from(self, first: "Row") -> str:
        """'precision=bf16-mixed, batch_size=256': this run's options that are not the first run's (those that
        either run's data could not use left out)."""
        if self is first:
            return "(first run)"
        inert = not_applied(self.summary, first.summary)
        changed = [f"{k}={v}" for k, v in self.config.items() if first.config.get(k) != v and k not in inert]
        return ", ".join(changed) or "the same config"

    def cells(self, first: "Row") -> tuple[str, ...]:
        s, steady = self.summary, self.summary.steady
        label = f"#{self.number}" + (f" {self.name}" if self.name and self.name != f"#{self.number}" else "")
        rate = format.rate_with_interval(s.samples_per_s,
                                         *((steady.low, steady.high, steady.wide and math.isfinite(steady.spread))
                                           if steady else ()))
        return (label, self.differs_from(first), self.status, format.number(self.steps), rate,
                format.held_out(s), peak_memory_text(s))

    def details(self) -> str:
        """Every other setting and measurement, one line."""
        c, s, info = self.config, self.summary, self.info
        devices = c.get("devices", 1) * c.get("num_nodes", 1)
        parts = [self.model or "",
                 time.strftime("%m-%d %H:%M", time.localtime(self.created)) if self.created else "",
                 f"{info.device or c.get('accelerator', '-')}, {c.get('precision', '-')}",
                 f"global batch {c.get('batch_size', 0) * c.get('accumulate_grad_batches', 1) * devices} = batch "
                 f"{c.get('batch_size')} × accumulate {c.get('accumulate_grad_batches', 1)} × {devices} "
                 f"device{'s' if devices > 1 else ''}",
                 f"{c.get('num_workers', 0)} workers", f"lr {format.number(info.lr)}",
                 f"{format.duration(s.time_per_epoch_s)}/epoch", f"final loss {format.number(s.last_loss)}",
                 f"overall {format.number(s.overall_samples_per_s)} samples/s (warm-up included)"]
        return " · ".join(p for p in parts + [self.error] if p)


class RunsTable:
    """The rows as text (a terminal), as HTML (a notebook), details folded unless asked for."""

    def __init__(self, rows: list[Row], where=None):
        self.runs = list(rows)
        self.where = where  # the store's path, said above the table
        self.rows = [run.cells(self.runs[0]) for run in self.runs]

    def _title(self) -> str:
        return f"runs in {self.where}" if self.where is not None else ""

    def __repr__(self) -> str:
        if not self.rows:
            return f"no runs stored in {self.where} yet" if self.where is not None else "no runs yet"
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(HEADS)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in [HEADS, *self.rows]]
        lines += [f"#{run.number}: {run.details()}" for run in self.runs]
        return "\n".join(([self._title()] if self.where is not None else []) + lines)

    def html(self, details: bool = False) -> str:
        if not self.rows:
            return f"<i>{html.escape(repr(self))}</i>"
        head = "".join(f"<th title='{html.escape(tip)}'>{name}</th>" for name, tip in COLUMNS)
        body = []
        for run, cells in zip(self.runs, self.rows):
            body.append(f"<tr class='nbtrain-run-row' data-run='{run.number}' data-status='{html.escape(run.status)}'>"
                        + "".join(f"<td>{html.escape(v)}</td>" for v in cells) + "</tr>")
            if details:
                body.append(f"<tr class='nbtrain-run-details' data-run='{run.number}'><td></td>"
                            f"<td colspan='{len(COLUMNS) - 1}'>{html.escape(run.details())}</td></tr>")
        title = f"<div>{html.escape(self._title())}</div>" if self.where is not None else ""
        return (f"{STYLE}{title}<table class='nbtrain-runs-table'><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>")

    def _repr_html_(self) -> str:
        return self.html(details=True)
