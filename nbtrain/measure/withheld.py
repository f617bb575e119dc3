"""When a verdict is withheld, and why: the one place that decides it, as a frozen record.

A verdict (B against A, a run against the first, the ceiling that binds) is given only where the reading
can carry it. Each rule below reads numbers -- a Verdict's interval and pairs, the machine's load beside a
reading, how far repeats of one settings read apart, how long a run's steady steps lasted -- and where it
withholds, returns a `Withheld`: its `kind` (one of KINDS), the `numbers` it read, by name, and the `words`
a person reads (`cell`: shorter words for a table cell; `note`: what the kind means, said once below a
table). Tables, the panel and the plots read the record -- its words, or its kind where they style or
group -- and never decide again or parse a reason. pyperf's `format_checks` and torch.utils.benchmark's
`Measurement.meets_confidence` keep their rules in one place for the same reason.

The load arithmetic (how much the cores other processes took, or the waits for a CPU, could slow a
reading) lives here too: nbtrain reads it only to decide whether a difference may be the machine's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..format import duration, ratio as ratio_text, si
from .load import SMALL, WINDOW_S, Load

# What each kind means; a record's kind is one of these.
KINDS = {
    "unmeasured": "no rate was measured",
    "few_measurements": "too few measurements for an interval",
    "few_pairs": "paired blocks too few for an interval a person can read",
    "noisy": "an interval too wide to rule out a difference a person cares about",
    "one_config": "one config measured against itself (an A/A check): its spread is the machine's noise",
    "set_aside": "pairs whose two blocks ran under unlike loads, left out of the verdict",
    "busy_machine": "the machine's load during the reading could explain the difference",
    "unsteady_machine": "one machine rate read twice, further apart than an interval allows",
    "short": "runs too short for the machine's load beside them to be read",
    "same_settings": "two runs of the same settings: how far apart they read is the machine's",
    "apart": "two runs alike as far as nbtrain reads, yet further apart than the machine moves a run",
    "within_spread": "a difference within how far repeats of one settings read apart here",
    "undecided": "a race's leader whose interval straddles the smallest gain worth keeping",
}

TOO_WIDE = 1.5  # an interval wider than this factor (e.g. 0.82-1.25) that holds 1 is "too noisy to tell"
# Fewer paired blocks than this give no interval worth printing: t's 97.5% point is 12.7 at 2 pairs and 4.3 at 3,
# so a busy machine's pairs printed "0.00-46666641476640.16" (ab's own fewest pairs is 4 too).
FEWEST_PAIRS = 4
EXPLAINS = 0.05   # a load that explains all but this share of a slowdown (on a log scale) can explain it
APART_MIN_S = 5 * WINDOW_S  # the steady seconds a run needs before its speed is set against another run's
# How far apart the rates of one settings' quiet repeats may read and still be the machine's: identical runs
# of a small CNN read up to 1.49x apart (0.81x-1.21x) on a quiet 2-core VM, where a hidden difference of
# settings (a global read in forward, a hook, a thread count) put them 7x-46x apart. No spread measured
# between repeats is wider: runs further apart are not repeats (runs/repeats.py).
BEYOND_MACHINE = 2.0
# On a full machine (threads waiting a second a second for a CPU) the load can explain any slowdown of the
# wall clock, but hardly the CPU time a sample took: identical runs of a small MLP there read up to 2.2x
# apart in rate and 1.9x in CPU time per sample (11 pairs, a 2-core VM at load 8-16); 30 extra matmuls a
# step, a difference nbtrain could not read, read 5.5x and 15x in both.
BEYOND_LOADED = 3.0


@dataclass(frozen=True)
class Withheld:
    """Why a verdict is withheld: `kind` (KINDS), the `numbers` the rule read ((name, value) pairs), the
    `words` a person reads, a table `cell`'s shorter words ('': the words) and the `note` a table says once."""
    kind: str
    words: str
    numbers: tuple = ()
    cell: str = ""
    note: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Withheld kind={self.kind!r}: allowed are {', '.join(KINDS)}")

    def number(self, name: str) -> float:
        return dict(self.numbers)[name]

    def short(self) -> str:
        return self.cell or self.words

    def __str__(self) -> str:
        return self.words


# --- a verdict's own interval ----------------------------------------------------------------------------

def of_verdict(v) -> Withheld | None:
    """Why the verdict `v` (verdict.Verdict) says neither faster, slower nor "no measurable difference";
    None where it says one of them."""
    if not math.isfinite(v.ratio):
        return Withheld("unmeasured", "not measured", cell="-")
    if v.one_config:
        noise = _aa_noise(v)
        return Withheld("one_config", f"A/A check, one config against itself: no speed verdict; {noise}",
                        _interval(v), cell=f"A/A check: {noise}")
    if not math.isfinite(v.low):
        shown = ratio_text(v.ratio)
        return Withheld("few_measurements", f"{shown}, too few measurements to tell", (("ratio", v.ratio),),
                        cell=f"{shown}, too few steps to tell")
    if v.paired and 2 <= v.pairs < FEWEST_PAIRS and not v.measurable:
        return Withheld("few_pairs",
                        f"too few pairs to tell ({v.pairs} pairs of blocks; an interval needs {FEWEST_PAIRS})",
                        (("pairs", v.pairs), ("needed", FEWEST_PAIRS)),
                        cell=f"too few pairs to tell ({v.pairs} of {FEWEST_PAIRS})")
    # An interval holding 1 but so wide that it rules out nothing a user cares about: "no measurable
    # difference" would read as "the same", which it cannot show (a low of 0, no time seen, is as wide as it gets)
    if not v.measurable and math.isfinite(v.high) and v.high > TOO_WIDE * v.low:
        interval = f"{v.low:.2f}-{v.high:.2f}"
        return Withheld("noisy", f"too noisy to tell (95% interval {interval})", _interval(v),
                        cell=f"too noisy to tell ({interval})")
    return None


def _interval(v) -> tuple:
    return (("ratio", v.ratio), ("low", v.low), ("high", v.high), ("pairs", v.pairs))


def _aa_noise(v) -> str:
    """What an A/A check's blocks show: how far apart one config's paired blocks read on this machine."""
    if not math.isfinite(v.low):
        return "too few pairs to show the machine's noise"
    return (f"its paired blocks read {v.low:.2f}-{v.high:.2f} of each other (95% interval), "
            f"this machine's noise between blocks")


# --- the machine's load: how much could it slow a reading? ------------------------------------------------

def waits_explain(wall_s: float, waited_s: float, slowdown: float) -> bool:
    """Whether a run whose threads waited `waited_s` seconds for a CPU over `wall_s` could owe a `slowdown`
    to that: each second a thread waited delays the step by at most that second (threads that wait on
    each other wait in the run queue too), so the run could have trained up to wall / (wall - waited)
    faster; waits of a second a second or more (several threads) may explain any slowdown."""
    if not (math.isfinite(waited_s) and wall_s > 0):
        return False
    return waited_s >= wall_s or covers(wall_s / (wall_s - waited_s), slowdown)


def covers(bound: float, slowdown: float) -> bool:
    """A load that could slow a run by up to `bound` explains `slowdown`: all of it, within EXPLAINS."""
    return bound > 1 and math.log(bound) >= (1 - EXPLAINS) * math.log(slowdown)


def explains(busier: Load, quieter: Load, slowdown: float) -> bool:
    """Whether the busier reading's load could explain it being `slowdown` times slower (>= 1) than the
    quieter one. Its threads' wait for a CPU bounds what the machine took from it (`waits_explain`: on a
    full machine, where they waited a second a second, any slowdown). Otherwise a run gets, of the cores it
    wants, those other processes leave it, so it can slow by up to the ratio of those (0.9 of 2 cores
    taken from a run wanting 2: 1.1 left against 2, up to 1.8x). What a run wants is the most either
    reading used: a run that sleeps on its data wants a fraction of a core, and another process's load
    explains none of its difference."""
    if waits_explain(busier.wall_s, busier.waited_cores * busier.wall_s, slowdown):
        return True
    return cores_explain(busier, quieter, slowdown)


def cores_explain(busier: Load, quieter: Load, slowdown: float) -> bool:
    """Whether the cores other processes took during the busier reading, beyond the quieter one's, could
    explain `slowdown` (the free-core ratio of `explains`; a GPU others kept busier explains any)."""
    if busier.small and quieter.small or not busier.other_cores > quieter.other_cores:
        return False
    gpu = busier.gpu_other is not None and busier.gpu_other - (quieter.gpu_other or 0) >= 100 * SMALL
    wants = demand(busier, quieter)
    return gpu or covers(quieter.free_cores(wants) / busier.free_cores(wants), slowdown)


def could_move(reading: Load, factor: float) -> bool:
    """Whether the load during `reading` could have slowed it by `factor` against the same reading on a quiet
    machine: its threads' waits for a CPU, or the cores other processes left of those it used."""
    quiet = Load(0.0, reading.cores, reading.wall_s, own_cores=reading.own_cores)
    return (waits_explain(reading.wall_s, reading.waited_cores * reading.wall_s, factor)
            or cores_explain(reading, quiet, factor))


def demand(*readings: Load) -> float:
    """The cores a run wants: the most any of its readings used (all of the machine where none says)."""
    return max((x.own_cores for x in readings if math.isfinite(x.own_cores)), default=readings[0].cores)


def explains_by_windows(slower: list[Load], faster: list[Load], slowdown: float, wants: float) -> bool:
    """Whether the loads of the slower run's blocks (its steady windows) could explain it being `slowdown`
    times slower than the faster run, whose blocks are `faster`; `wants`: the cores the runs want (`demand`
    of the two whole runs). What a whole run's mean load misses when a burst hit a few of its blocks.

    Its threads' waits, summed over its blocks, bound what the machine took from it (`waits_explain`).
    And its busiest block set against the faster run's quietest by the cores each left of those wanted
    (a burst that took a core from a run wanting two: up to 2x while it lasted), where a block lacked at
    least SMALL of a core: a reading over a fifth of a second counts in 10 ms ticks, and a run that wants
    a tenth of a core reads anything from none to a fifth in one."""
    known = [w for w in slower if math.isfinite(w.waited_cores)]
    if known and waits_explain(sum(w.wall_s for w in known), sum(w.waited_cores * w.wall_s for w in known),
                               slowdown):
        return True
    if not slower or not faster:
        return False

    def left(window: Load) -> float:  # the cores of those wanted that others left it (all: a lack within the ticks)
        free = window.cores - window.other_cores
        return wants if free > wants - SMALL else max(free, 0.1)
    return covers(max(left(w) for w in faster) / min(left(w) for w in slower), slowdown)


# --- A/B's pairs of blocks --------------------------------------------------------------------------------

def comparable_pairs(rates_a, rates_b, loads_a, loads_b) -> list[bool]:
    """Per pair of blocks measured in alternation: whether the two blocks ran under loads alike enough to
    compare, i.e. the cores other processes took during the slower block, beyond the faster one's, cannot
    explain the pair's ratio (a burst that hit one block of a pair). Their waits for a CPU do not count
    here: the two blocks ran side by side, and a config that runs more threads waits more on its own."""
    out = []
    for a, b, load_a, load_b in zip(rates_a, rates_b, loads_a, loads_b):
        if not (a > 0 and b > 0) or load_a is None or load_b is None:
            out.append(True)
            continue
        slower, faster = (load_a, load_b) if b > a else (load_b, load_a)
        out.append(not cores_explain(slower, faster, max(a, b) / min(a, b)))
    return out


def set_aside(comparable: list[bool]) -> Withheld | None:
    """The pairs `comparable_pairs` left out of an A/B verdict, where any were."""
    apart = comparable.count(False)
    if not apart:
        return None
    return Withheld("set_aside", f"{apart} of {len(comparable)} pairs set aside: other processes took more of the "
                    "machine during one of their blocks", (("set_aside", apart), ("pairs", len(comparable))))


# --- the ceilings' readings -------------------------------------------------------------------------------

def of_ceilings(c, binding: str, margin, loader_binds: bool) -> Withheld | None:
    """Why the readings of a Ceilings `c` name no ceiling: the reading that decides read while other
    processes' load could have moved it by TOO_WIDE (its interval is narrow when all its steps ran slow), the
    model alone's interval wider than that, one machine rate (the matmul peak) read twice further apart than
    that, or the ratio `margin` that chose `binding` holding 1 in an interval wider than that (an unbounded
    top too). Where the loader is the nearest ceiling, that is the loader's reading: a model read slower than
    it is only makes the loader bind less; a loader slower than the model beyond doubt (`loader_binds`)
    binds whatever the model's own spread (their ratio's interval holds both spreads)."""
    if not loader_binds and (held := _ceiling_readings(c, binding)):
        return held
    if math.isfinite(margin.low) and margin.low <= 1 <= margin.high and margin.high > TOO_WIDE * margin.low:
        return Withheld("noisy", f"the ratio that chose the {binding} ceiling reads {margin.low:.2f}-{margin.high:.2f} "
                        f"(95% interval)", (("low", margin.low), ("high", margin.high)))
    return None


def _ceiling_readings(c, binding: str) -> Withheld | None:
    m = c.model
    name, load = ("loader", c.loader_load) if binding == "data" else ("model", c.model_load)
    if load is not None and could_move(load, TOO_WIDE):
        return Withheld("busy_machine", f"while the {name} alone was read, {load.text()}",
                        (("other_cores", load.other_cores), ("cores", load.cores),
                         ("waited_cores", load.waited_cores), ("factor", TOO_WIDE)))
    if m.low > 0 and m.high / m.low > TOO_WIDE:
        return Withheld("noisy", f"the model alone read {m.low:,.0f}-{m.high:,.0f} samples/s (95% interval)",
                        (("low", m.low), ("high", m.high)))
    if len(c.peak_readings) == 2 and min(p.value for p in c.peak_readings) > 0:
        before, after = (p.value for p in c.peak_readings)
        if max(before, after) / min(before, after) > TOO_WIDE:
            return Withheld("unsteady_machine", f"the matmul peak read {si(before)}FLOP/s before the model and "
                            f"{si(after)}FLOP/s after it: the machine's load changed while it was read",
                            (("before", before), ("after", after)))
    return None


# --- the walk's races ------------------------------------------------------------------------------------

def undecided(verdict, min_gain: float, why: str, spreads: tuple[float, float]) -> Withheld | None:
    """A race's leader whose ratio is above the smallest gain worth keeping (1 + `min_gain`) while its interval
    straddles it: too noisy to keep or to drop. `why`: how the race ended; `spreads`: the current config's and
    the candidate's blocks' interquartile range over median (0.05: 5%), the side that varied most named."""
    v = verdict
    if not (math.isfinite(v.low) and v.low <= 1 + min_gain < v.high and v.ratio > 1 + min_gain):
        return None
    base, own = spreads
    side = "the current config's" if base >= own else "the candidate's"
    reason = (f"{why}; {side} blocks varied most (current {100 * base:.0f}%, candidate {100 * own:.0f}% "
              f"interquartile range)")
    return Withheld("undecided", f"too noisy to tell: {reason}",
                    _interval(v) + (("bar", 1 + min_gain), ("current_spread", base), ("candidate_spread", own)),
                    cell=reason)


# --- runs taken at different times ------------------------------------------------------------------------

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


@dataclass(frozen=True)
class RunReading:
    """What a run taken apart offers a comparison: its label, the seconds its steady steps lasted (NaN: no
    steps), the machine's load over the whole run (None: not recorded) and over each steady window."""
    label: str
    steady_s: float
    load: Load | None
    windows: tuple = ()


def same_settings(verdict) -> Withheld:
    """Two runs of the same settings: an A/A check, never faster or slower, whatever `verdict` reads."""
    return Withheld("same_settings", f"{SAME_SETTINGS_CELL}: {verdict.short()}", _interval(verdict),
                    note=SAME_SETTINGS)


def beyond_machine(rates: tuple, least: float, loads: tuple, work: float) -> Withheld | None:
    """Two runs alike as far as nbtrain reads whose steady `rates` (slower, faster) read further apart than the
    machine moves a run: `least`, the least factor their intervals allow, above BEYOND_MACHINE, and the load
    beside them (`loads`: slower's, faster's) cannot explain it; where it could explain the wall clock, that
    least and `work`, the ratio of the CPU time a sample took, must both be above BEYOND_LOADED."""
    factor = max(rates) / min(rates)
    if least <= BEYOND_MACHINE:
        return None
    if None not in loads and explains(*loads, least) and not (least > BEYOND_LOADED and work > BEYOND_LOADED):
        return None
    return Withheld("apart", f"{UNREAD_CELL}, yet {factor:.1f}x apart: something it cannot read differs",
                    (("factor", factor), ("least", least), ("work", work)), note=UNREAD)


def between_runs(first: RunReading, other: RunReading, verdict, spreads: list) -> Withheld | None:
    """Why two runs taken apart get no speed verdict from `verdict` (measurable: their steady rates' ratio):
    a run too short, a load that could explain it, or a difference within the widest of `spreads` (how far
    repeats of each run's settings read apart: runs/repeats.Spread, where they were repeated); None where
    they get it."""
    if out := too_short(first, other) or busier_machine(first, other, verdict):
        return out
    return within_spread(verdict, max(spreads, key=lambda s: s.factor)) if spreads else None


def too_short(*runs: RunReading) -> Withheld | None:
    """"too short to compare (a: 120 ms of steady steps)" where a run's steady steps lasted under APART_MIN_S.

    The machine's load is read every WINDOW_S: a run of a few hundredths of a second fits in one burst, or in
    the lull between two, and no reading says which (identical runs of 30 ms read 1.35x apart with tight
    intervals)."""
    for run in runs:
        if math.isfinite(run.steady_s) and run.steady_s < APART_MIN_S:
            return Withheld("short", f"{TOO_SHORT_CELL} ({run.label}: {duration(run.steady_s)} of steady steps)",
                            (("steady_s", run.steady_s), ("needed_s", APART_MIN_S)), note=TOO_SHORT)
    return None


def busier_machine(first: RunReading, other: RunReading, verdict) -> Withheld | None:
    """"the machine was busier during b (other processes took 0.9 of 2 cores): the difference may be the
    machine's" where the two runs' speed `verdict` is one the machine's load could explain.

    The load is read for each run as a whole and for each of its steady blocks: a burst over a few blocks
    is diluted in a whole run's mean, not in the blocks it hit."""
    if first.load is None or other.load is None:
        return None
    # the slower run, and the least slowdown the interval allows: the load need explain no more than that
    slower, faster, slowdown = (other, first, 1 / verdict.high) if verdict.ratio < 1 else (first, other, verdict.low)
    numbers = (("slowdown", slowdown), ("other_cores", slower.load.other_cores), ("cores", slower.load.cores))
    if explains(slower.load, faster.load, slowdown):
        busier = "busier" if slower.load.other_cores > faster.load.other_cores else "full"
        return Withheld("busy_machine", f"the machine was {busier} during {slower.label} ({slower.load.text()}): "
                        f"the difference may be the machine's", numbers)
    blocks = list(slower.windows)
    if not explains_by_windows(blocks, list(faster.windows), slowdown, demand(slower.load, faster.load)):
        return None
    busiest = max(blocks, key=lambda w: (w.waited_cores if math.isfinite(w.waited_cores) else 0, w.other_cores))
    return Withheld("busy_machine", f"the machine was busier during {slower.label} (in some of its blocks "
                    f"{busiest.text()}): the difference may be the machine's", numbers)


def within_spread(verdict, widest) -> Withheld | None:
    """WITHIN_CELL where the least difference `verdict`'s interval allows is no more than `widest.factor`, the
    widest spread of the two runs' settings (read over `widest.runs` runs)."""
    least = verdict.low if verdict.ratio > 1 else 1 / verdict.high
    if least > widest.factor:
        return None
    return Withheld("within_spread", f"{WITHIN_CELL} ({widest.runs} runs of one's settings read up to "
                    f"{widest.factor:.2f}x apart)", (("least", least), ("spread", widest.factor), ("runs", widest.runs)),
                    note=WITHIN)
