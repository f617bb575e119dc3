"""Loggers: the run's metrics written for TensorBoard or as CSV, as a MetricsLog subscriber.

A logger sees the same events as the live views: each log window's losses, learning rate and
samples/s, held-out numbers, the user's own logged values and config changes. In a DDP run
only rank 0's engine attaches one, so a run writes one log. TensorBoard's writer comes from
torch.utils.tensorboard, which needs the `tensorboard` package: asked for without it, the
run stops before training with the install command.
"""
from __future__ import annotations

import csv
import os
import time
from pathlib import Path

from ..config import ConfigError, Problem
from ..measure.steady import WindowRate

DEFAULT_DIR = Path(".nbtrain") / "logs"


def attach(log, config) -> "Logger":
    folder = Path(config.logger_dir) if config.logger_dir else DEFAULT_DIR
    run_dir = folder / time.strftime("run-%Y%m%d-%H%M%S") if not config.logger_dir else folder
    writer = TensorBoardWriter(run_dir) if config.logger == "tensorboard" else CsvWriter(run_dir)
    logger = Logger(writer)
    log.subscribe(logger)
    logger.log = log
    return logger


class Logger:
    """Turns MetricsLog events into scalar writes, one per name and step."""

    def __init__(self, writer):
        self.writer = writer
        self.log = None
        self.rate = WindowRate()

    def update(self, event: dict, log) -> None:
        kind = event["type"]
        if kind == "start":
            self.rate.start(event["info"])
        elif kind == "steps" and event["rows"]["step"]:
            rows = event["rows"]
            for step, loss, lr in zip(rows["step"], rows["loss"], rows["lr"]):
                self.writer.scalar("train/loss", loss, step)
                self.writer.scalar("train/lr", lr, step)
            rate = self.rate.of(rows)
            if rate is not None:
                self.writer.scalar("train/samples_per_s", rate, rows["step"][-1])
        elif kind == "epoch":
            for name, value in event.items():
                if name.startswith("val") and isinstance(value, (int, float)):
                    self.writer.scalar(f"val/{name[4:] if name.startswith('val_') else name}", value, event["step"])
        elif kind == "logged":
            for name, value in event["values"].items():
                self.writer.scalar(f"logged/{name}", value, event["step"])
        elif kind == "end":
            self.writer.flush()

    def close(self) -> None:
        if self.log is not None:
            self.log.unsubscribe(self)
        self.writer.close()

    @property
    def path(self) -> Path:
        return self.writer.path


class TensorBoardWriter:
    def __init__(self, path: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError([Problem("logger", "tensorboard", "needs the tensorboard package: "
                                       "pip install tensorboard (or pip install 'nbtrain[tensorboard]')")]) from None
        self.path = path
        self._writer = SummaryWriter(log_dir=str(path))

    def scalar(self, name: str, value: float, step: int) -> None:
        self._writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class CsvWriter:
    """metrics.csv with one row per (step, name, value): long form, so new names need no new columns."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._file = open(path / "metrics.csv", "a", newline="")
        self._csv = csv.writer(self._file)
        if self._file.tell() == 0:
            self._csv.writerow(("step", "name", "value"))

    def scalar(self, name: str, value: float, step: int) -> None:
        self._csv.writerow((step, name, repr(float(value))))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
