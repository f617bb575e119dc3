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
`nbtrain.ab` measures two configs in alternation, which none of this limits.
"""
from __future__ import annotations

import math

from ..format import duration
from ..measure.load import WINDOW_S, Load, demand, explains, explains_by_windows, windows
from ..measure.steady import columns_series
from ..measure.verdict import Verdict, steady_ratio
from ..records import samples_start
from .repeats import BEYOND_LOADED, BEYOND_MACHINE, Spread, apart_beyond_machine, readable_alike, spread
from .result import RunResult

Labelled = tuple[str, RunResult]  # a run and the label its table row shows

APART_MIN_S = 5 * WINDOW_S  # the steady seconds a run needs before its speed is set against another run's

SAME_SETTINGS_CELL = "same settings (A/A)"
SAME_SETTINGS = (f"{SAME_SETTINGS_CELL}: both runs trained the same code and data with the same config, so how far "
                 "apart their speeds read is how much the machine moved between them, not a difference of settings")
UNREAD_CELL = "the same settings as far as nbtrain can read"
UNREAD = (f"{UNREAD_CELL}, yet apart: the two runs' config, code, data and process settings read the same, but "
          f"their speeds read more than {BEYOND_MACHINE:g}x apart, further than repeats of one settings read on a "
          f"quiet machine (on a full one: more than {BEYOND_LOADED:g}x, in the CPU time each sample took too): "
          "something nbtrain cannot read differs (a file or a library's state read in a step, the machine "
          "itself). Neither counts as a repeat of the other; run each again to see which one moves")
TOO_SHORT_CELL = "too short to compare"
TOO_SHORT = (f"{TOO_SHORT_CELL}: runs taken at different times need {APART_MIN_S:g} s of steady steps each, for the "
             f"machine's load to be read beside them (every {WINDOW_S:g} s); run more steps, or nbtrain.ab, which "
             "alternates the two")
WITHIN_CELL = "within the machine's own spread"
WITHIN = (f"{WITHIN_CELL}: runs of the same settings have read that far apart on this machine, so the difference "
          "may be the machine's; nbtrain.ab alternates the two")
UNREPEATED_MARK = "†"
UNREPEATED = (f"{UNREPEATED_MARK} no run of either's settings was repeated here, so how far this machine alone moves a "
              "run's speed between runs is not known: run one of them again (an A/A check), or nbtrain.ab, which "
              "alternates the two")


def versus(first: RunResult, other: RunResult) -> Verdict:
    """`other`'s steady throughput over `first`'s: the ratio of the samples/s the two runs show, with its
    interval (runs measured apart: unpaired)."""
    return steady_ratio(columns_series(first.history, samples_start(first.log)),
                        columns_series(other.history, samples_start(other.log)))


def vs_first(first: Labelled, other: Labelled, seen=()) -> str:
    """The "vs first" cell for two (label, run)s; `seen`: repeats.evidence of the runs and the store (no
    evidence: every verdict between other settings is marked UNREPEATED_MARK)."""
    verdict = versus(first[1], other[1])  # a bootstrap of both runs' steps: once per cell
    if readable_alike(first[1], other[1]):
        if factor := apart_beyond_machine(first[1], other[1]):  # the observation wins over the digest
            return f"{UNREAD_CELL}, yet {factor:.1f}x apart: something it cannot read differs"
        return f"{SAME_SETTINGS_CELL}: {verdict.short()}"
    if not verdict.measurable:
        return verdict.short()
    known = spreads(first, other, seen)
    return _held(first, other, verdict, known) or verdict.short() + ("" if known else UNREPEATED_MARK)


def withheld(first: Labelled, other: Labelled, seen=(), verdict: Verdict | None = None) -> str:
    """Why the two (label, run)s get no speed verdict, or '' where they may (or their verdict is none);
    `verdict`: their `versus`, where the caller has it already."""
    verdict = verdict or versus(first[1], other[1])
    return _held(first, other, verdict, spreads(first, other, seen)) if verdict.measurable else ""


def _held(first: Labelled, other: Labelled, verdict: Verdict, known: list[Spread]) -> str:
    """`withheld`'s reasons for a measurable `verdict`, given the runs' known spreads."""
    if out := too_short(first, other) or busier_machine(first, other, verdict):
        return out
    return within_spread(verdict, max(known, key=lambda s: s.factor)) if known else ""


def spreads(first: Labelled, other: Labelled, seen) -> list[Spread]:
    """How far repeats of each run's settings read apart (repeats.spread), for those that were repeated."""
    return [s for s in (spread(first[1], seen), spread(other[1], seen)) if s is not None]


def within_spread(verdict: Verdict, widest: Spread) -> str:
    """WITHIN_CELL where the least difference `verdict`'s interval allows is no more than `widest`, the
    widest spread of the two runs' settings; else ''."""
    least = verdict.low if verdict.ratio > 1 else 1 / verdict.high
    if least > widest.factor:
        return ""
    return f"{WITHIN_CELL} ({widest.runs} runs of one's settings read up to {widest.factor:.2f}x apart)"


def footnotes(cells: list[str]) -> list[str]:
    """What the words of "vs first" cells mean, once each (a cell says "same settings (A/A)", the note why)."""
    said = [note for cell, note in ((TOO_SHORT_CELL, TOO_SHORT), (SAME_SETTINGS_CELL, SAME_SETTINGS),
                                    (UNREAD_CELL, UNREAD), (WITHIN_CELL, WITHIN)) if any(cell in text for text in cells)]
    return said + ([UNREPEATED] if any(text.endswith(UNREPEATED_MARK) for text in cells) else [])


def too_short(*labelled: Labelled) -> str:
    """"too short to compare (a: 120 ms of steady steps)" where a run's steady steps lasted under APART_MIN_S,
    else '' (TOO_SHORT says why, once below the table).

    The machine's load is read every WINDOW_S: a run of a few hundredths of a second fits in one burst, or in
    the lull between two, and no reading says which (identical runs of 30 ms read 1.35x apart with tight
    intervals)."""
    for label, run in labelled:
        steady = run.steady()
        seconds = steady.total_s - steady.warmup_s
        if run.summary.steps and math.isfinite(seconds) and seconds < APART_MIN_S:
            return f"{TOO_SHORT_CELL} ({label}: {duration(seconds)} of steady steps)"
    return ""


def busier_machine(first: Labelled, other: Labelled, verdict: Verdict) -> str:
    """"the machine was busier during b (other processes took 0.9 of 2 cores): the difference may be the
    machine's" where the two (label, run)s' speed `verdict` is one the machine's load could explain, else ''.

    The load is read for each run as a whole and for each of its steady blocks: a burst over a few blocks
    is diluted in a whole run's mean, not in the blocks it hit."""
    if None in (first[1].load(), other[1].load()):
        return ""
    # the slower run, and the least slowdown the interval allows: the load need explain no more than that
    (label, slower), (_, faster), slowdown = (other, first, 1 / verdict.high) if verdict.ratio < 1 \
        else (first, other, verdict.low)
    if explains(slower.load(), faster.load(), slowdown):
        busier = "busier" if slower.load().other_cores > faster.load().other_cores else "full"
        return f"the machine was {busier} during {label} ({slower.load().text()}): the difference may be the machine's"
    blocks = steady_windows(slower)
    if not explains_by_windows(blocks, steady_windows(faster), slowdown, demand(slower.load(), faster.load())):
        return ""
    busiest = max(blocks, key=lambda w: (w.waited_cores if math.isfinite(w.waited_cores) else 0, w.other_cores))
    return (f"the machine was busier during {label} (in some of its blocks {busiest.text()}): "
            f"the difference may be the machine's")


def steady_windows(run: RunResult) -> list[Load]:
    """The loads of the windows that hold a run's steady steps (the warm-up's are left out, as its rate does)."""
    warm = run.steady().warmup_steps
    return [window.load for window in windows(run.history) if window.end > warm]
