"""One row of the panel's runs table: the config a run started with and what it measured."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..measure.ab import describe_change
from ..measure.steady import SteadyRate
from ..metrics import MetricsLog
from ..runs.result import RunResult


@dataclass
class RunRecord:
    number: int
    config: TrainConfig
    log: MetricsLog = field(default_factory=MetricsLog)
    status: str = "running"
    result: RunResult | None = None
    error: str = ""
    stop: threading.Event = field(default_factory=threading.Event)  # the panel's Stop, for any device count

    def label(self) -> str:
        """'#2 cpu, bf16-mixed, batch 64 × accumulate 2 × 2 devices' (factors of 1 left out)."""
        return f"#{self.number} {self.settings_text()}"

    def settings_text(self) -> str:
        c = self.config
        return (f"{c.device_type}, {c.precision}, batch {c.batch_size}"
                + (f" × accumulate {c.accumulate_grad_batches}" if c.accumulate_grad_batches > 1 else "")
                + (f" × {c.world_size} devices" if c.world_size > 1 else ""))

    @property
    def steps(self) -> int | None:
        """This run's own optimizer steps (the model may have trained before it): the count every view states."""
        if self.result is None:
            return None
        s = self.result.summary
        return s.get("run_steps", s.get("steps"))

    def summary_cells(self, first: "RunRecord") -> tuple[str, ...]:
        """The columns that matter first: what differs from the first run, the steady rate, held-out, memory."""
        s = self.result.summary if self.result is not None else {}
        differs = "(first run)" if self is first else describe_change(first.config, self.config)
        rate = steady_cell(self.result.steady()) if self.result is not None else "-"
        steps = "-" if self.steps is None else f"{self.steps:,}"
        return (f"#{self.number}", differs, self.status, steps, rate, held_out_cell(s),
                _number(s.get("peak_mem_mb"), " MB"))

    def details(self) -> str:
        """Every other setting and measurement, one line (the runs table's folded part)."""
        c = self.config
        s = self.result.summary if self.result is not None else {}
        start = self.log.last("start")
        info = start["info"] if start else {}
        devices = f"{c.world_size} device{'s' if c.world_size > 1 else ''}"
        return " · ".join([
            f"{info.get('device', c.device_type)}, {c.precision}",
            f"global batch {c.global_batch_size} = batch {c.batch_size} × accumulate {c.accumulate_grad_batches}"
            f" × {devices}", f"{c.num_workers} workers", f"lr {_number(info.get('lr'))}",
            f"{_number(s.get('time_per_epoch_s'), ' s')}/epoch", f"final loss {_number(s.get('last_loss'))}",
            f"overall {_number(s.get('overall_samples_per_s'))} samples/s (warm-up included)",
        ] + ([self.error] if self.error else []))


def steady_cell(steady: SteadyRate) -> str:
    """Steady samples/s with its 95% interval, short enough for a table cell."""
    if not math.isfinite(steady.rate):
        return "-"
    text = f"{steady.rate:,.0f}"
    if math.isfinite(steady.low) and math.isfinite(steady.high):
        text += f" ({steady.low:,.0f}–{steady.high:,.0f})"
    return text + (" noisy" if steady.wide and math.isfinite(steady.spread) else "")


def held_out_cell(summary: dict) -> str:
    acc, loss = summary.get("val_acc"), summary.get("val_loss")
    if acc is not None:
        return f"{100 * acc:.1f}% (loss {_number(loss)})"
    return "-" if loss is None else f"loss {_number(loss)}"


def _number(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return (f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}") + unit
    return f"{value}{unit}"
