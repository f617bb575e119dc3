"""Runs of the same settings, and how far apart the machine alone put their speeds: the A/A evidence a
comparison of runs taken at different times needs.

A run's interval comes from its own steps, so it cannot see how far the machine's speed moves between one
run and the next: on a 2-core VM, identical runs of a small CNN read 0.81x-1.21x apart, each with a narrow
interval. Two runs of the same settings (the same config, and the same workload digest: engine/workload.py)
differ by the machine alone; where the store holds such repeats, their spread says how large a difference
between other runs taken apart the machine alone can make.

The digest reads what nbtrain can read; the rates are an observation, and the observation wins. Two runs
of the same settings whose rates read more than BEYOND_MACHINE apart (a load beside them not explaining it)
differ in something nbtrain cannot read (a file, a C library's state): they are not the same settings, and
neither is a repeat of the other, so they never widen the spread that later verdicts are held against.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable

from ..config import GIVEN_KEY
from ..measure.withheld import BEYOND_MACHINE, Withheld, beyond_machine
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


def readable_alike(first: RunResult, other: RunResult) -> bool:
    """Whether the two runs trained the same code and data with the same config as far as nbtrain can read
    (their settings keys are equal). Unknown: False."""
    key = key_of(first)
    return key is not None and key == key_of(other)


def same_settings(first: RunResult, other: RunResult) -> bool:
    """Whether the two runs trained the same settings, so a difference in speed between them is the
    machine's: alike as far as nbtrain can read, and not further apart than the machine moves a run
    (`apart_beyond_machine`). Unknown: False."""
    return readable_alike(first, other) and apart_beyond_machine(first, other) is None


def apart_beyond_machine(first: RunResult, other: RunResult) -> Withheld | None:
    """Why two runs alike as far as nbtrain reads are no A/A check: their steady rates, their intervals, the
    load beside them and the CPU time a sample took, read here, are further apart than the machine moves a
    run (withheld.beyond_machine decides); None where they are not."""
    rates = first.steady().rate, other.steady().rate
    if not all(rate > 0 and math.isfinite(rate) for rate in rates):
        return None
    (slower, faster) = (first, other) if rates[0] < rates[1] else (other, first)
    high, low = slower.steady().high, faster.steady().low
    # a noisy run's interval (a first run in a process, its blocks 2.3x apart) says how far apart they may be
    least = low / high if math.isfinite(low) and math.isfinite(high) and low > 0 and high > 0 \
        else max(rates) / min(rates)
    work = cpu_per_sample(slower.summary), cpu_per_sample(faster.summary)
    return beyond_machine((slower.steady().rate, faster.steady().rate), least, (slower.load(), faster.load()),
                          work[0] / work[1] if work[1] > 0 else math.nan)


def cpu_per_sample(summary: Summary) -> float:
    """CPU seconds the run's process tree spent per sample it trained (nan: not recorded)."""
    load = summary.load
    if load is None or not summary.samples or not (math.isfinite(load.own_cores) and load.own_cores > 0):
        return math.nan
    return load.own_cores * load.wall_s / summary.samples


@dataclass(frozen=True)
class Spread:
    """How far apart the steady rates of `runs` runs of one settings read: fastest over slowest."""
    factor: float
    runs: int


def spread(run: RunResult, others: Iterable[tuple[object, str | None, float]]) -> Spread | None:
    """The spread of `run`'s settings among itself and `others` ((who, settings key, steady rate): `evidence`),
    quiet runs only, and only those within BEYOND_MACHINE of each other (`_clusters`: run's own, or where its
    rate is not counted, the widest); None where fewer than two such runs had its settings."""
    key = key_of(run)
    if key is None:
        return None
    rates = [rate for who, other_key, rate in others
             if who != id(run) and other_key == key and rate > 0 and math.isfinite(rate)]
    own = run.steady().rate
    counted = quiet(run.summary) and own > 0 and math.isfinite(own)
    clusters = _clusters(rates + [own] if counted else rates)
    repeats = next(c for c in clusters if own in c) if counted else \
        max(clusters, key=lambda c: (len(c) >= 2, c[-1] / c[0] if c else 0), default=[])
    return Spread(repeats[-1] / repeats[0], len(repeats)) if len(repeats) >= 2 else None


def _clusters(rates: list[float]) -> list[list[float]]:
    """`rates` (of one settings key) sorted and split at their widest gaps until no group spans more than
    BEYOND_MACHINE: each group is runs the machine alone may have put that far apart, and runs in two
    groups differ in something nbtrain cannot read."""
    rates = sorted(rates)
    if len(rates) < 2 or rates[-1] / rates[0] <= BEYOND_MACHINE:
        return [rates]
    cut = max(range(1, len(rates)), key=lambda i: rates[i] / rates[i - 1])
    return _clusters(rates[:cut]) + _clusters(rates[cut:])


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
