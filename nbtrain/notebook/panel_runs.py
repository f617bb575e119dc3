"""One row of the panel's runs table: the config a run started with and what it measured."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..metrics import MetricsLog
from ..records import Summary, start_info
from ..runs.result import RunResult
from ..runs.table import Row


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
        return self.result.summary.trained_steps

    def row(self) -> Row:
        """This run as the runs table shows it (runs/table.py: the one table of every front-end)."""
        summary = self.result.summary if self.result is not None else Summary()
        return Row(self.number, None, self.status, self.config.to_dict(), summary, self.steps,
                   info=start_info(self.log), error=self.error)
