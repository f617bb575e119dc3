"""What may be said of two runs taken at different times: the "vs first" cell of a comparison.

A run's interval comes from its own steps, so it sees neither a load that changed between the runs nor how
far the machine's speed moves from one run to the next. So a speed verdict between runs taken apart is
given only where nothing observable says the machine could have made it:
- two runs of the same settings are an A/A check, never faster or slower (runs/repeats.py); where their
  rates read further apart than the machine moves a run (repeats.BEYOND_MACHINE), the observation wins:
  something nbtrain cannot read differs, and neither A/A nor a speed verdict is said;
- a run whose steady steps lasted under APART_MIN_S is too short (the load is read every WINDOW_S);
- a load other processes put on the machine that could explain the difference withholds it;
- a difference within how far runs of the same settings have read apart here (the store's repeats) is
  within the machine's own spread; where no settings of the two was ever repeated, the verdict is marked:
  how far the machine alone moves a run is not known.
`nbtrain.ab` measures two configs in alternation, which none of this limits. Whether a verdict is withheld is
measure/withheld.py's to decide; this module reads each run's numbers for it and gives its record to the
comparison table, the panel and the plot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..measure.load import Load, windows
from ..measure.steady import columns_series
from ..measure.verdict import Verdict, steady_ratio
from ..measure.withheld import RunReading, Withheld, between_runs, same_settings
from ..records import samples_start
from .repeats import Spread, apart_beyond_machine, readable_alike, spread
from .result import RunResult

Labelled = tuple[str, RunResult]  # a run and the label its table row shows

UNREPEATED_MARK = "†"
UNREPEATED = (f"{UNREPEATED_MARK} no run of either's settings was repeated here, so how far this machine alone moves a "
              "run's speed between runs is not known: run one of them again (an A/A check), or nbtrain.ab, which "
              "alternates the two")
# The kinds whose note a comparison says once below its table, in this order.
NOTED = ("short", "same_settings", "apart", "within_spread")


@dataclass(frozen=True)
class Against:
    """A run against the first: its speed `verdict` (steady rates, unpaired), `held` (why the runs taken apart
    get no speed verdict: withheld.py's record; None: they get `verdict`'s own words) and `unrepeated` (no
    settings of the two was repeated here: how far the machine alone moves a run is not known)."""
    verdict: Verdict
    held: Withheld | None = None
    unrepeated: bool = False

    @property
    def withheld(self) -> Withheld | None:
        """Why no speed verdict is given: the runs' own reason, else the verdict's (too noisy, ...)."""
        return self.held or self.verdict.withheld

    @property
    def cell(self) -> str:
        """The "vs first" cell: the reason's words, or the verdict's short words, marked where unrepeated."""
        return self.held.words if self.held else self.verdict.short() + (UNREPEATED_MARK if self.unrepeated else "")

    def line(self, change: str) -> str:
        """A line naming the run by its `change`: 'batch_size=128: 1.31x faster (...)'; an A/A check, or runs
        apart beyond the machine, by the cell alone (those say what the two runs share)."""
        if self.held and self.held.kind in ("same_settings", "apart"):
            return self.held.words
        return f"{change}: {self.held.words}" if self.held else self.verdict.text(change)


def versus(first: RunResult, other: RunResult) -> Verdict:
    """`other`'s steady throughput over `first`'s: the ratio of the samples/s the two runs show, with its
    interval (runs measured apart: unpaired)."""
    return steady_ratio(columns_series(first.history, samples_start(first.log)),
                        columns_series(other.history, samples_start(other.log)))


def against(first: Labelled, other: Labelled, seen=()) -> Against:
    """`other` against `first` (each a (label, run)); `seen`: repeats.evidence of the runs and the store (no
    evidence: every verdict between other settings is unrepeated)."""
    verdict = versus(first[1], other[1])  # a bootstrap of both runs' steps: once per comparison
    if readable_alike(first[1], other[1]):  # the observation wins over the digest
        return Against(verdict, apart_beyond_machine(first[1], other[1]) or same_settings(verdict))
    if not verdict.measurable:
        return Against(verdict)
    known = spreads(first, other, seen)
    held = withheld(first, other, seen, verdict, known)
    return Against(verdict, held, unrepeated=held is None and not known)


def withheld(first: Labelled, other: Labelled, seen=(), verdict: Verdict | None = None,
             known: list[Spread] | None = None) -> Withheld | None:
    """Why the two (label, run)s get no speed verdict (withheld.between_runs decides), or None where they may
    (or their verdict is none); `verdict`: their `versus`, and `known`: their `spreads`, where the caller has
    them already."""
    verdict = verdict or versus(first[1], other[1])
    if not verdict.measurable:
        return None
    known = spreads(first, other, seen) if known is None else known
    return between_runs(reading(*first), reading(*other), verdict, known)


def reading(label: str, run: RunResult) -> RunReading:
    """What a comparison reads of a run: its steady seconds (NaN: no steps), its load, its steady windows'."""
    steady = run.steady()
    seconds = steady.total_s - steady.warmup_s if run.summary.steps else math.nan
    return RunReading(label, seconds, run.load(), tuple(steady_windows(run)))


def spreads(first: Labelled, other: Labelled, seen) -> list[Spread]:
    """How far repeats of each run's settings read apart (repeats.spread), for those that were repeated."""
    return [s for s in (spread(first[1], seen), spread(other[1], seen)) if s is not None]


def footnotes(readings: list[Against], marked: bool = True) -> list[str]:
    """What the reasons of "vs first" cells mean, once each (a cell says "same settings (A/A)", the note why),
    and, where a cell is `marked`, what the mark means."""
    held = [r.held for r in readings if r.held is not None]
    said = [next(h.note for h in held if h.kind == kind) for kind in NOTED if any(h.kind == kind for h in held)]
    return said + ([UNREPEATED] if marked and any(r.unrepeated for r in readings) else [])


def steady_windows(run: RunResult) -> list[Load]:
    """The loads of the windows that hold a run's steady steps (the warm-up's are left out, as its rate does)."""
    warm = run.steady().warmup_steps
    return [window.load for window in windows(run.history) if window.end > warm]
