"""One row of the panel's runs table: the config a run started with and what it measured."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..metrics import MetricsLog
from ..result import RunResult


@dataclass
class RunRecord:
    number: int
    config: TrainConfig
    log: MetricsLog = field(default_factory=MetricsLog)
    status: str = "running"
    result: RunResult | None = None
    error: str = ""

    def label(self) -> str:
        c = self.config
        return (f"#{self.number} {c.device_type} {c.precision} batch {c.batch_size}x{c.accumulate_grad_batches}"
                f"x{c.world_size}")

    def cells(self) -> tuple:
        c = self.config
        s = self.result.summary if self.result is not None else {}
        start = self.log.last("start")
        info = start["info"] if start else {}
        return (f"#{self.number}", self.status, info.get("device", c.device_type), c.precision, c.batch_size,
                c.accumulate_grad_batches, c.num_workers, c.world_size, c.global_batch_size,
                _number(info.get("lr")), s.get("steps", len(self.log)), _number(s.get("samples_per_s")),
                _number(s.get("time_per_epoch_s"), " s"), _number(s.get("peak_mem_mb"), " MB"),
                _number(s.get("last_loss")))


def _number(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return (f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}") + unit
    return f"{value}{unit}"
