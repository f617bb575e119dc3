"""Runs of the same settings, and how far apart the machine alone put their speeds: the A/A evidence a
comparison of runs taken at different times needs.

A run's interval comes from its own steps, so it cannot see how far the machine's speed moves between one
run and the next: on a 2-core VM, identical runs of a small CNN read 0.81x-1.21x apart, each with a narrow
interval. Two runs of the same settings (the same config, and the same workload digest: engine/workload.py)
differ by the machine alone; where the store holds such repeats, their spread says how large a difference
between other runs taken apart the machine alone can make.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable

from ..config import GIVEN_KEY
from ..records import Summary
from .result import RunResult

# What a run ran with beyond its config, as its summary records it: equal in runs of the same settings.
ENGINE_FIELDS = ("workload", "world_size", "device", "strategy", "global_batch", "lr", "precision")


def settings_key(config: dict, summary: Summary) -> str | None:
    """One string per settings (its config's option values and its engine info), None where the run's
    workload is unknown (a run recorded before digests, or one whose code nbtrain could not read)."""
    if summary.workload is None:
        return None
    values = {k: v for k, v in config.items() if k != GIVEN_KEY}
    return json.dumps([values, [getattr(summary, name) for name in ENGINE_FIELDS]], sort_keys=True, default=str)


def key_of(run: RunResult) -> str | None:
    return settings_key(json.loads(json.dumps(run.config.to_dict(), default=str)), run.summary)


def same_settings(first: RunResult, other: RunResult) -> bool:
    """Whether the two runs trained the same code and data with the same config, so a difference in speed
    between them is the machine's. Unknown: False."""
    key = key_of(first)
    return key is not None and key == key_of(other)


@dataclass(frozen=True)
class Spread:
    """How far apart the steady rates of `runs` runs of one settings read: fastest over slowest."""
    factor: float
    runs: int


def spread(run: RunResult, others: Iterable[tuple[object, str | None, float]]) -> Spread | None:
    """The spread of `run`'s settings among itself and `others` ((who, settings key, steady rate): `evidence`),
    quiet runs only; None where fewer than two had its settings."""
    key = key_of(run)
    if key is None:
        return None
    rates = [rate for who, other_key, rate in others
             if who != id(run) and other_key == key and rate > 0 and math.isfinite(rate)]
    own = run.steady().rate
    if quiet(run.summary) and own > 0 and math.isfinite(own):
        rates.append(own)
    return Spread(max(rates) / min(rates), len(rates)) if len(rates) >= 2 else None


def evidence(runs: list[RunResult], store=None, last: int = 500) -> list[tuple[object, str | None, float]]:
    """(who, settings key, steady rate) of the compared runs (who: the RunResult's id()) and of the newest
    `last` completed runs in `store` (a RunStore, or None; who: its row id), each once: a compared run loaded
    from the store is not counted again; a run beside a load has no rate here (`quiet`)."""
    loaded = {run.extras.get("run_id") for run in runs} - {None}
    out = [(id(run), key_of(run), run.steady().rate if quiet(run.summary) else math.nan) for run in runs]
    if store is not None:
        for row in store.runs(last=last):
            if row.id not in loaded and row.status == "completed" and quiet(row.summary):
                rate = row.summary.steady.rate if row.summary.steady else math.nan
                out.append((("store", row.id), settings_key(row.config, row.summary), rate))
    return out


def quiet(summary: Summary) -> bool:
    """Whether a run counts as a repeat: one beside a load other processes put on the machine says how far
    that load moved it (the load's own rules, runs/apart.py), not how far a quiet machine moves a run."""
    return summary.load is None or summary.load.small
