"""Loggers: the run's metrics written for TensorBoard or as CSV, as a MetricsLog subscriber.

A logger sees the same events as the live views: each log window's losses, learning rate and
samples/s, held-out numbers, the user's own logged values and config changes. In a DDP run
only rank 0's engine attaches one, so a run writes one log. TensorBoard's writer comes from
torch.utils.tensorboard, which needs the `tensorboard` package: asked for without it, the
run stops before training with the install command.
"""
from __future__ import annotations

import csv
import itertools
import os
import time
from pathlib import Path

from ..options import ConfigError, Problem
from ..measure.steady import WindowRate

DEFAULT_DIR = Path(".nbtrain") / "logs"


def attach(log, config) -> "Logger":
    """A logger writing this run's events into a folder of its own under logger_dir."""
    run_dir = run_folder(config)
    writer = TensorBoardWriter(run_dir) if config.logger == "tensorboard" else CsvWriter(run_dir)
    logger = Logger(writer, config.logger)
    log.subscribe(logger)
    logger.log = log
    return logger


def check_folder(config) -> None:
    """Refuse, before anything trains (and before DDP workers start), a logger_dir nbtrain cannot write to."""
    if config.logger != "none":
        run_folder(config, probe=True)


def run_folder(config, probe: bool = False) -> Path:
    """A new folder for one run under logger_dir (.nbtrain/logs): run-<date>-<time>, with -2, -3, ... for
    runs started in the same second, so no two runs ever share one (TensorBoard shows each as its own run,
    a CSV never mixes two runs' rows). Made with mkdir, which fails where the name exists: two processes
    cannot claim one. `probe`: made and removed again, to learn that the folder is writable."""
    parent = Path(config.logger_dir) if config.logger_dir else DEFAULT_DIR
    stamp = time.strftime("run-%Y%m%d-%H%M%S") if not probe else f".probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        for n in itertools.count(1):
            folder = parent / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                folder.mkdir(mode=0o700)
            except FileExistsError:
                continue
            if probe:
                folder.rmdir()
            return folder
    except OSError as error:
        raise ConfigError([Problem("logger_dir", config.logger_dir, f"a folder nbtrain can write to (creating "
                                   f"{error.filename or parent}: {error.strerror or error})")]) from None


class Logger:
    """Turns MetricsLog events into scalar writes, one per name and step."""

    def __init__(self, writer, kind: str = "csv"):
        self.writer, self.kind = writer, kind
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

    @property
    def note(self) -> str:
        """Where this run's log is, for the run's summary."""
        return f"{self.kind} log of this run in {self.path}"


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
