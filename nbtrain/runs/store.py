"""The run store: every run's config, summary and history in one SQLite file.

Comparisons survive a kernel restart because runs live on disk, by default in
`.nbtrain/runs.sqlite` under the working directory (a notebook's own folder), or where
the NBTRAIN_STORE environment variable or a `path` argument says. A run's row stays
bounded: past STORED_ROWS steps its history is thinned as MetricsLog thins (recent steps
whole, older ones at every 2nd, 4th, ... step), and the loaded log states the thinning.

Recording never breaks training: a corrupt, locked or unwritable file makes `record`
warn once (per file, per process) and return None. Nor does one bad row break reading: a
row whose config, summary or events cannot be read (cut short, the wrong JSON type, a bad
zlib blob) is skipped with one warning naming the file and the row, and every other run
lists, loads and compares. Several kernels may write at once:
each write is one short IMMEDIATE transaction on a WAL-journalled file, and SQLite's
busy timeout makes writers take turns.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

from .. import hardware
from ..config import GIVEN_KEY, TrainConfig
from ..metrics import MetricsLog
from ..records import Summary
from .result import RunResult

SCHEMA_VERSION = 1
STORED_ROWS = 2**14  # step rows a run keeps in the store: every step of a run up to 16,384 steps
_SCHEMA = ("""
CREATE TABLE IF NOT EXISTS runs (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    name     TEXT,
    created  REAL NOT NULL,
    status   TEXT NOT NULL,
    message  TEXT NOT NULL,
    model    TEXT,
    config   TEXT NOT NULL,   -- JSON: TrainConfig.to_record() (the values, and the options given on purpose)
    summary  TEXT NOT NULL,   -- JSON: records.Summary.to_json()
    events   BLOB NOT NULL    -- zlib(JSON): the MetricsLog's events, replayable (thinned past STORED_ROWS)
)""", "CREATE INDEX IF NOT EXISTS runs_by_name ON runs (name, id)", f"PRAGMA user_version={SCHEMA_VERSION}")
_warned: set[str] = set()
_warned_rows: set[tuple[str, int]] = set()  # (store file, row id): each bad row warned of once per process
# What reading a damaged row raises: bad JSON (a ValueError), JSON of the wrong type, a bad zlib blob.
_ROW_ERRORS = (ValueError, TypeError, KeyError, AttributeError, zlib.error)


class StoreError(RuntimeError):
    """The run store cannot be read; the message names the file and the reason."""


def default_path() -> Path:
    """NBTRAIN_STORE if set, else .nbtrain/runs.sqlite under the working directory."""
    env = os.environ.get("NBTRAIN_STORE")
    return Path(env).expanduser() if env else Path.cwd() / ".nbtrain" / "runs.sqlite"


@dataclass(frozen=True)
class StoredRun:
    """One row of the store's listing (no history)."""
    id: int
    name: str | None
    created: float
    status: str
    model: str | None
    config: dict
    summary: Summary

    @property
    def label(self) -> str:
        return self.name or f"#{self.id}"


class RunStore:
    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 5.0):
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"

    # --- connection -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # isolation_level=None: transactions are opened explicitly, so each write is one unit.
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            self._set_up(db)
        except BaseException:
            db.close()
            raise
        return db

    def _set_up(self, db: sqlite3.Connection) -> None:
        """A new file's schema and WAL mode. SQLite answers the switch to WAL with "locked" at once, without its
        busy wait, where another connection holds the file's write lock (its rule against two waiters deadlocking:
        two kernels' first runs in one new store), so the setup is tried again until the store's timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
                    return
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:  # each one idempotent: a setup another connection finished is a no-op
                    db.execute(statement)
                db.execute("COMMIT")
                return
            except sqlite3.OperationalError as error:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if "locked" not in str(error) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def _warn_once(self, error: Exception) -> None:
        key = str(self.path.resolve())
        if key in _warned:
            return
        _warned.add(key)
        # Attributed to the store file, not to nbtrain's line that noticed: the user sees no nbtrain source path.
        warnings.warn_explicit(f"nbtrain: the run store {self.path} is unusable ({error}); training goes on, but "
                               "runs are not recorded there. Move the file away, or set NBTRAIN_STORE to another path.",
                               RuntimeWarning, filename="nbtrain run store", lineno=0, module="nbtrain.runs.store")

    # --- writing ------------------------------------------------------------------------

    def record(self, result: RunResult, name: str | None = None, model: str | None = None) -> int | None:
        """Store a finished run; its id, or None (after one warning) when the file is unusable."""
        # A long run's history is thinned (recent steps kept whole), so its row stays a few MB at most.
        events = zlib.compress(json.dumps(result.log.snapshot(STORED_ROWS).events).encode())
        row = (name if name is not None else result.name, time.time(), result.status, result.message, model,
               json.dumps(result.config.to_record()), result.summary.to_json(), events)
        try:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                cursor = db.execute("INSERT INTO runs (name, created, status, message, model, config, summary, "
                                    "events) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
                db.execute("COMMIT")
                return cursor.lastrowid
            finally:
                db.close()
        except (sqlite3.Error, OSError) as error:
            self._warn_once(error)
            return None

    # --- reading ------------------------------------------------------------------------

    def _query(self, sql: str, args=()) -> list[tuple]:
        try:
            db = self._connect()
            try:
                return db.execute(sql, args).fetchall()
            finally:
                db.close()
        except (sqlite3.Error, OSError) as error:
            raise StoreError(f"cannot read the run store {self.path}: {error}") from None

    def runs(self, last: int | None = None) -> list[StoredRun]:
        """Stored runs, oldest first (the newest `last` rows when given), less any row that cannot be read
        (`_skip` warns of it)."""
        sql = "SELECT id, name, created, status, model, config, summary FROM runs ORDER BY id DESC"
        rows = self._query(sql + (" LIMIT ?" if last else ""), (last,) if last else ())
        out, bad = [], []
        for r in reversed(rows):
            try:
                out.append(StoredRun(r[0], r[1], r[2], r[3], r[4], _option_values(r[5]), _summary(r[6])))
            except _ROW_ERRORS as error:
                bad.append((r[0], r[1], error))
        self._skip(bad)
        return out

    def load(self, key: str | int) -> RunResult:
        """A stored run as a RunResult: by name (the newest readable row of that name), by id, or '#id'."""
        text = str(key)
        columns = "SELECT id, name, status, message, model, config, summary, events FROM runs "
        rows = self._query(columns + "WHERE name = ? ORDER BY id DESC", (text,))
        if not rows and text.lstrip("#").isdigit():
            rows = self._query(columns + "WHERE id = ?", (int(text.lstrip("#")),))
        if not rows:
            known = sorted({r.label for r in self.runs(last=50)})
            raise StoreError(f"no run named {text!r} in {self.path}; stored runs: {', '.join(known) or 'none yet'}")
        bad = []
        for run_id, name, status, message, model, config, summary, events in rows:
            try:
                log = MetricsLog.from_events(_events(events))
                result = RunResult(_stored_config(config), log, _summary(summary), status, message,
                                   name=name or f"#{run_id}")
            except _ROW_ERRORS as error:
                bad.append((run_id, name, error))
                continue
            self._skip(bad)  # an older row of the name was readable: the newer bad ones are said and skipped
            result.extras.update(run_id=run_id, model=model, store=str(self.path))
            return result
        raise StoreError(f"run {text!r} in the run store {self.path} cannot be read: "
                         f"{'; '.join(_row_text(*row) for row in bad)}; the store's other runs still load")

    def _skip(self, bad: list[tuple]) -> None:
        """One warning naming the store and its rows in `bad` ((id, name, error)) not warned of before."""
        key = str(self.path.resolve())
        new = [row for row in bad if (key, row[0]) not in _warned_rows]
        if not new:
            return
        _warned_rows.update((key, row[0]) for row in new)
        rows = "; ".join(_row_text(*row) for row in new)
        warnings.warn_explicit(f"nbtrain: skipped {len(new)} unreadable row{'s' if len(new) > 1 else ''} of the run "
                               f"store {self.path} ({rows}); the other runs list and compare. Delete the row, or move "
                               "the file away, to be rid of this warning.", RuntimeWarning,
                               filename="nbtrain run store", lineno=0, module="nbtrain.runs.store")


def _row_text(run_id: int, name: str | None, error: Exception) -> str:
    return f"row #{run_id}{f' {name!r}' if name else ''}: {type(error).__name__}: {error}"


def _json(text, part: str, kind: type):
    """A row's `part` column read as JSON of `kind`; a ValueError naming the part where it is not."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as error:
        raise ValueError(f"its {part} is not JSON ({error})") from None
    if not isinstance(value, kind):
        raise ValueError(f"its {part} is a JSON {type(value).__name__}, not {kind.__name__}")
    return value


def _summary(summary_json: str) -> Summary:
    return Summary.from_dict(_json(summary_json, "summary", dict))


def _events(blob: bytes) -> list:
    try:
        text = zlib.decompress(blob)
    except (zlib.error, TypeError) as error:
        raise ValueError(f"its events are not a zlib blob ({error})") from None
    return _json(text, "events", list)


def _option_values(config_json: str) -> dict:
    """A stored config's option values (a row's table columns), without the record of what was given."""
    return {k: v for k, v in _json(config_json, "config", dict).items() if k != GIVEN_KEY}


def _stored_config(config_json: str) -> TrainConfig:
    """A past run's config, even one made on hardware this machine lacks (a GPU run read on a laptop)."""
    anything = hardware.Inventory(cuda_devices=1 << 16, cuda_bf16=True, mps=True, cpu_cores=1 << 16)
    with hardware.assume(anything):
        return TrainConfig.from_record(_json(config_json, "config", dict))
