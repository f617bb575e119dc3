"""Runs side by side: loss against wall time (held-out points too), time to a loss, throughput, peak
memory and the last held-out numbers.

Plain matplotlib (an Agg figure, no pyplot state), so it works in a script as well as in
a notebook, where the returned Comparison displays itself (table and figure).
"""
from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field

import numpy as np

from ..measure.load import WINDOW_S, demand, explains, explains_by_windows, windows
from ..measure.steady import WIDE_SPREAD, columns_series
from ..measure.verdict import Verdict, steady_ratio
from ..plotting import held_out_series
from ..format import duration, number, rate_with_interval
from ..records import Summary, samples_start
from .result import RunResult, peak_memory, peak_memory_text

NOISY_MARK = "*"  # a samples/s too noisy to trust, said once in the table's footnote


def smoothed(losses: list[float], window: int) -> list[float]:
    """Trailing mean over `window` steps, so one lucky batch does not count as reaching a loss."""
    out, total = [], 0.0
    for i, value in enumerate(losses):
        total += value
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def _window(run: RunResult) -> int:
    return max(1, min(10, len(run.history["loss"]) // 10))


def time_to_loss(run: RunResult, target: float) -> float | None:
    """Training seconds until the smoothed loss first reaches `target` (None: never)."""
    cols = run.history
    for t, value in zip(cols["time"], smoothed(cols["loss"], _window(run))):
        if value <= target:
            return t
    return None


def resolve(runs, store=None) -> list[RunResult]:
    """RunResults from results, names or ids (names and ids are read from the run store)."""
    from .store import RunStore
    out = []
    for run in runs:
        if isinstance(run, RunResult):
            out.append(run)
        elif isinstance(run, (str, int)):
            store = store if isinstance(store, RunStore) else RunStore(store)
            out.append(store.load(run))
        else:
            raise TypeError(f"compare: got {type(run).__name__}; allowed: a RunResult, a run name or a run id")
    return out


@dataclass
class Comparison:
    runs: list[RunResult]
    labels: list[str]
    target_loss: float
    rows: list[dict]
    figure: object
    notes: list = field(default_factory=list)  # footnotes to the table's marks

    def table(self) -> str:
        heads = list(self.rows[0])
        cells = [[str(row[h]) for h in heads] for row in self.rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

        def line(values):
            return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
        return "\n".join([line(heads)] + [line(c) for c in cells] + self.notes)

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=120)
        return buffer.getvalue()

    def html_table(self) -> str:
        heads = list(self.rows[0])
        head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[h]))}</td>" for h in heads) + "</tr>"
                       for r in self.rows)
        notes = "".join(f"<div>{html.escape(note)}</div>" for note in self.notes)
        return f"<table><tr>{head}</tr>{body}</table>{notes}"

    def _repr_mimebundle_(self, include=None, exclude=None):
        image = base64.b64encode(self.png()).decode()
        return {"text/plain": self.table(),
                "text/html": self.html_table() + f'<img src="data:image/png;base64,{image}"/>'}

    def save(self, path) -> None:
        self.figure.savefig(path, dpi=100)


def compare(*runs, loss: float | None = None, store=None, path=None) -> Comparison:
    """Compare runs (RunResults, stored names or ids): loss vs time, time to `loss`, samples/s, memory.

    `loss` defaults to the lowest smoothed loss every run reached, so each run has a time.
    """
    results = resolve(runs, store)
    if not results:
        raise ValueError("compare: give at least one run (a RunResult, a run name or a run id)")
    labels = [r.name or f"run {i + 1}" for i, r in enumerate(results)]
    reached = [min(smoothed(r.history["loss"], _window(r)), default=math.nan) for r in results]
    target = loss if loss is not None else max(reached)
    times = [time_to_loss(r, target) for r in results]
    base = results[0]
    rows, noisy = [], []
    for label, run, t in zip(labels, results, times):
        s, steady = run.summary, run.steady()
        changes = ", ".join(f"{k}={new}" for k, (_, new) in run.config.changed_from(base.config).items())
        wide = steady.wide and math.isfinite(steady.spread)
        if wide:  # a mark in the cell, the words once below the table (a cell of them wrapped into three lines)
            noisy.append(f"{label} {100 * steady.spread:.0f}%")
        rows.append({"run": label, "status": run.status, "steps": s.steps,
                     "samples/s": rate_with_interval(steady.rate, steady.low, steady.high) + (NOISY_MARK if wide else ""),
                     "vs first": "-" if run is base else vs_first((labels[0], base), (label, run)),
                     f"time to loss {target:.3g}": "not reached" if t is None else number(t, " s"),
                     "peak memory": peak_memory_text(s), "last loss": number(s.last_loss),
                     "held-out": held_out_text(s), "changed from first": changes or "-"})
    if all(row["held-out"] == "-" for row in rows):  # no run validated: no column of dashes
        for row in rows:
            del row["held-out"]
    figure = _draw(results, labels, target, times)
    notes = [f"{NOISY_MARK} too noisy to trust: the spread between timed blocks ({', '.join(noisy)}) is over "
             f"{100 * WIDE_SPREAD:.0f}%; samples/s with the 95% interval"] if noisy else []
    notes += footnotes([row["vs first"] for row in rows])
    result = Comparison(results, labels, target, rows, figure, notes)
    if path is not None:
        result.save(path)
    return result


def held_out_text(summary: Summary) -> str:
    """The last validation's numbers, compact: "loss 0.31, acc 91.2%, f1 0.88" ("-" without one)."""
    if summary.val_loss is None:
        return "-"
    parts = [f"loss {number(summary.val_loss)}"]
    if summary.val_acc is not None:
        parts.append(f"acc {100 * summary.val_acc:.1f}%")
    parts += [f"{k[4:] if k.startswith('val_') else k} {number(v)}" for k, v in summary.val_metrics.items()]
    return ", ".join(parts)


def versus(first: RunResult, other: RunResult) -> Verdict:
    """`other`'s steady throughput over `first`'s: the ratio of the samples/s the two runs show, with its
    interval (runs measured apart: unpaired).

    Two runs taken at different times cannot see a load that changed between them; for a
    verdict on one config against another, `nbtrain.ab` measures them in alternation.
    """
    return steady_ratio(columns_series(first.history, samples_start(first.log)),
                        columns_series(other.history, samples_start(other.log)))


def vs_first(first: tuple[str, RunResult], other: tuple[str, RunResult]) -> str:
    """The table's "vs first" cell for two (label, run)s: an A/A check where they ran the same settings, no
    speed verdict where one is `withheld`, else the verdict."""
    verdict = versus(first[1], other[1])
    if same_settings(first[1], other[1]):
        return f"{SAME_SETTINGS_CELL}: {verdict.short()}"
    return withheld(first, other) or verdict.short()


def same_settings(first: RunResult, other: RunResult) -> bool:
    """Whether the two runs trained the same code and data (their workload digests, engine/workload.py, are
    known and equal) with the same config: then a difference in speed is the machine's. Unknown: False."""
    a, b = first.summary, other.summary
    engine = ("workload", "world_size", "device", "strategy", "global_batch", "lr", "precision")  # as it ran
    return a.workload is not None and all(getattr(a, name) == getattr(b, name) for name in engine) \
        and not other.config.changed_from(first.config)


SAME_SETTINGS_CELL = "same settings (A/A)"
SAME_SETTINGS = (f"{SAME_SETTINGS_CELL}: both runs trained the same code and data with the same config, so how far "
                 "apart their speeds read is how much the machine moved between them, not a difference of settings")

def footnotes(cells: list[str]) -> list[str]:
    """What the words of "vs first" cells mean, once each (a cell says "same settings (A/A)", the note why)."""
    return [note for cell, note in ((TOO_SHORT_CELL, TOO_SHORT), (SAME_SETTINGS_CELL, SAME_SETTINGS))
            if any(text.startswith(cell) for text in cells)]


APART_MIN_S = 5 * WINDOW_S  # the steady seconds a run needs before its speed is set against another run's


def withheld(first: tuple[str, RunResult], other: tuple[str, RunResult]) -> str:
    """Why the two (label, run)s get no speed verdict, or '' where they may (or their verdict is none): a run
    too short to compare (`too_short`) or a load that could explain the difference (`busier_machine`)."""
    if not versus(first[1], other[1]).measurable:
        return ""
    return too_short(first, other) or busier_machine(first, other)


def too_short(*labelled: tuple[str, RunResult]) -> str:
    """"too short to compare (a: 0.12 s)" where a run's steady steps lasted under APART_MIN_S, else ''
    (TOO_SHORT says why, once below the table).

    Runs taken at different times differ by what the machine did in each, and the machine's load is read
    every WINDOW_S: a run of a few hundredths of a second fits in one burst, or in the lull between two, and
    no reading says which (identical runs of 30 ms read 1.35x apart with tight intervals). Its interval,
    from its own steps, cannot see that."""
    for label, run in labelled:
        steady = run.steady()
        seconds = steady.total_s - steady.warmup_s
        if run.summary.steps and math.isfinite(seconds) and seconds < APART_MIN_S:
            return f"{TOO_SHORT_CELL} ({label}: {duration(seconds)} of steady steps)"
    return ""


TOO_SHORT_CELL = "too short to compare"
TOO_SHORT = (f"{TOO_SHORT_CELL}: runs taken at different times need {APART_MIN_S:g} s of steady steps each, for the "
             f"machine's load to be read beside them (every {WINDOW_S:g} s); run more steps, or nbtrain.ab, which "
             "alternates the two")


def busier_machine(first: tuple[str, RunResult], other: tuple[str, RunResult]) -> str:
    """"the machine was busier during b (other processes took 0.9 of 2 cores): the difference may be the
    machine's" where the two (label, run)s' speed verdict is one the machine's load could explain, else ''.

    The load is read for each run as a whole and for each of its steady blocks: a burst over a few blocks
    is diluted in a whole run's mean, not in the blocks it hit."""
    verdict = versus(first[1], other[1])
    if not verdict.measurable or None in (first[1].load(), other[1].load()):
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


def _draw(results, labels, target, times):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import StrMethodFormatter
    figure = Figure(figsize=(13, 3.5), layout="constrained")
    loss_ax, time_ax, rate_ax, mem_ax = figure.subplots(1, 4)
    colors = [f"C{i % 10}" for i in range(len(results))]
    handles, held = [], False
    for run, label, color in zip(results, labels, colors):
        cols = run.history
        handles += loss_ax.plot(cols["time"], smoothed(cols["loss"], _window(run)), color=color, lw=1.3, label=label)
        steps, values = held_out_series(run.log).get("val_loss", ([], []))
        if steps:  # validations happen at steps: placed at the training time of that step
            held = True
            loss_ax.plot(np.interp(steps, cols["step"], cols["time"]), values, color=color, ls="none", marker="o",
                         ms=3.5, mfc="white", label=f"{label} held-out")
    loss_ax.axhline(target, color="grey", ls="--", lw=0.8)
    loss_ax.set(xlabel="training time (s)", ylabel="training loss (smoothed)", title="loss against time")
    if held:  # one entry for every run's held-out points: their colour says whose
        handles.append(Line2D([], [], color="grey", ls="none", marker="o", ms=3.5, mfc="white", label="held-out loss"))
    # Below the panels, one row: inside the loss panel, five runs' entries covered their own curves.
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), fontsize=8,
                  frameon=False)
    positions = range(len(results))

    def bars(ax, values, title, unit, missing="n/a", notes=None):
        heights = [0 if v is None or math.isnan(v) else v for v in values]
        ax.bar(positions, heights, color=colors)
        ax.set_xticks(list(positions), labels, rotation=20 if len(labels) > 3 else 0, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.10g}"))  # 8,000 as the tables write it
        for x, v, h, note in zip(positions, values, heights, notes or [""] * len(values)):
            text = missing if v is None or math.isnan(v) else number(float(v)) + note
            ax.annotate(text, (x, h), ha="center", va="bottom", fontsize=8)
        ax.margins(y=0.22 if any(notes or []) else 0.12)  # room above the tallest bar for its number

    bars(time_ax, times, f"time to loss {target:.3g}", "seconds", missing="not reached")
    bars(rate_ax, [r.summary.samples_per_s for r in results], "throughput", "samples/s")
    kinds = {r.summary.mem_kind or "memory" for r in results}
    memory = [peak_memory(r.summary) for r in results]
    several = any(processes > 1 for _, processes in memory)
    bars(mem_ax, [mb for mb, _ in memory], "peak memory" + (" (all processes)" if several else ""),
         f"MB ({', '.join(sorted(kinds))})",
         notes=[f"\n{processes} processes" if processes > 1 else "" for _, processes in memory])
    return figure
