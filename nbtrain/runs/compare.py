"""Runs side by side: loss against wall time (held-out points too), time to a loss, throughput, peak
memory, the last held-out numbers and which run reaches a held-out loss sooner in wall time (held_out_time.py).

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

from ..measure.steady import WIDE_SPREAD
from ..plotting import figure_class, held_out_series
from ..format import PrintsAsTable, number, rate_with_interval
from ..records import Summary
from . import repeats
from ..measure.learned import alters_learning
from .held_out_time import learned_in_time
from .apart import against, footnotes, versus  # versus: the verdict of two runs, a public name of this module
from .result import RunResult, peak_memory, peak_memory_text
from .table import not_applied

__all__ = ["Comparison", "compare", "resolve", "smoothed", "time_to_loss", "versus"]

NOISY_MARK = "*"  # a samples/s too noisy to trust, said once in the table's footnote
WITHHELD_COLOR = "0.45"  # the figure's words under a bar whose verdict is withheld: grey, not a winner's black


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


@dataclass(repr=False)
class Comparison(PrintsAsTable):
    """Runs side by side: print() and a notebook show its table (a notebook its figure too); `plot(path)`
    saves the figure, as every result's `plot` does."""
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

    def plot(self, path=None):
        """The figure (loss against time, time to the loss, throughput with its interval and verdict, memory),
        saved to `path` when given."""
        if path is not None:
            self.save(path)
            self.figure.saved_to = str(path)
        return self.figure

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.runs)} runs: {', '.join(self.labels)}>"


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
    seen = repeats_seen(results, store)
    # the compared runs of each run's settings (itself first): where a side has repeats, 'held-out in time' spans them
    alike = [[run] + [r for r in results if r is not run and repeats.same_settings(run, r)] for run in results]
    rows, noisy, learns = [], [], []
    readings = [None if run is base else against((labels[0], base), (label, run), seen) for label, run in
                zip(labels, results)]  # each run against the first: its verdict, or withheld.py's record of why not
    for label, run, t, kin, reading in zip(labels, results, times, alike, readings):
        s, steady = run.summary, run.steady()
        inert = not_applied(run.summary, base.summary)
        changes = ", ".join(f"{k}={new}" for k, (_, new) in run.config.changed_from(base.config).items()
                            if k not in inert)
        wide = steady.wide and math.isfinite(steady.spread)
        if wide:  # a mark in the cell, the words once below the table (a cell of them wrapped into three lines)
            noisy.append(f"{label} {100 * steady.spread:.0f}%")
        rows.append({"run": label, "status": run.status, "steps": s.steps,
                     "samples/s": rate_with_interval(steady.rate, steady.low, steady.high) + (NOISY_MARK if wide else ""),
                     "vs first": "-" if reading is None else reading.cell,
                     f"time to loss {target:.3g}": "not reached" if t is None else number(t, " s"),
                     "peak memory": peak_memory_text(s), "last loss": number(s.last_loss),
                     "held-out": held_out_text(s),
                     "held-out in time": "-" if run is base else held_out_in_time(base, run, labels[0], alike[0], kin),
                     "changed from first": changes or "-"})
        if run is not base and (altered := alters_learning(run.config, base.config)):
            seen = "'held-out in time' does" if s.val_loss is not None else "give val_data to both runs to see that"
            learns.append(f"{label} changes what is learned ({', '.join(altered)}): its samples/s says nothing of "
                          f"how soon it learns; {seen}")
    for column in ("held-out", "held-out in time"):
        if all(row[column] == "-" for row in rows):  # no run validated: no column of dashes
            for row in rows:
                del row[column]
    figure = _draw(results, labels, target, times, readings)
    notes = [f"{NOISY_MARK} too noisy to trust: the spread between timed blocks ({', '.join(noisy)}) is over "
             f"{100 * WIDE_SPREAD:.0f}%; samples/s with the 95% interval"] if noisy else []
    notes += footnotes([r for r in readings if r is not None]) + learns
    result = Comparison(results, labels, target, rows, figure, notes)
    if path is not None:
        result.save(path)
    return result


def held_out_in_time(base: RunResult, run: RunResult, base_label: str, base_kin: list, kin: list) -> str:
    """The 'held-out in time' cell: over the repeats of each side's settings among the runs compared; a repeat of the
    first run's own settings is read against it alone as an A/A (what sets them apart is the machine: no verdict)."""
    if any(r is run for r in base_kin):
        return learned_in_time(base, run, base_label, repeat=True)
    return learned_in_time(base, run, base_label, base_kin, kin)


def repeats_seen(results: list[RunResult], store) -> list:
    """The A/A evidence of the runs compared and their store (repeats.evidence); a store that cannot be read
    gives none (the table still shows what the runs themselves say)."""
    from .store import StoreError
    try:
        return repeats.evidence(results, evidence_store(store, results))
    except StoreError:
        return repeats.evidence(results)


def evidence_store(store, results: list[RunResult]):
    """The run store whose repeats of the runs' settings say how far the machine alone moves a run: the one
    given, else the one the runs were loaded from, else the default one where it exists (None: none)."""
    from .store import RunStore, default_path
    if isinstance(store, RunStore):
        return store
    paths = {run.extras.get("store") for run in results} - {None}
    path = store if store is not None else paths.pop() if len(paths) == 1 else None
    if path is None and default_path().exists():
        path = default_path()
    return RunStore(path) if path is not None else None


def held_out_text(summary: Summary) -> str:
    """The last validation's numbers, compact: "loss 0.31, acc 91.2%, f1 0.88" ("-" without one)."""
    if summary.val_loss is None:
        return "-"
    parts = [f"loss {number(summary.val_loss)}"]
    if summary.val_acc is not None:
        parts.append(f"acc {100 * summary.val_acc:.1f}%")
    parts += [f"{k[4:] if k.startswith('val_') else k} {number(v)}" for k, v in summary.val_metrics.items()]
    return ", ".join(parts)


def _wrapped(text: str, width: int = 16) -> str:
    import textwrap
    return "\n".join(textwrap.wrap(text, width))


def _draw(results, labels, target, times, readings):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.lines import Line2D
    from matplotlib.ticker import StrMethodFormatter
    figure = figure_class()(figsize=(13, 3.5), layout="constrained")
    FigureCanvasAgg(figure)
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

    def bars(ax, values, title, unit, missing="n/a", notes=None, intervals=None):
        heights = [0 if v is None or math.isnan(v) else v for v in values]
        whiskers = None
        if intervals:  # the 95% interval of each bar, as the table gives it (none where it is unknown)
            whiskers = [[max(h - low, 0) if math.isfinite(low) else 0 for h, (low, _) in zip(heights, intervals)],
                        [max(high - h, 0) if math.isfinite(high) else 0 for h, (_, high) in zip(heights, intervals)]]
        ax.bar(positions, heights, color=colors, yerr=whiskers, capsize=4 if whiskers else 0,
               error_kw={"elinewidth": 1, "ecolor": "0.2"})
        ax.set_xticks(list(positions), labels, rotation=20 if len(labels) > 3 else 0, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.10g}"))  # 8,000 as the tables write it
        tops = [h + (whiskers[1][i] if whiskers else 0) for i, h in enumerate(heights)]
        for x, v, top, note in zip(positions, values, tops, notes or [""] * len(values)):
            text = missing if v is None or math.isnan(v) else number(float(v)) + note
            ax.annotate(text, (x, top), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8)
        ax.margins(y=0.22 if any(notes or []) else 0.12)  # room above the tallest bar for its number

    bars(time_ax, times, f"time to loss {target:.3g}", "seconds", missing="not reached")
    steady = [r.steady() for r in results]
    bars(rate_ax, [s.rate for s in steady], "throughput", "samples/s (steady, 95% interval)",
         intervals=[(s.low, s.high) for s in steady])
    # The table's verdict under each bar but the first, in its words: bars of different heights whose
    # intervals overlap are "too noisy to tell", not a winner. A withheld verdict (withheld.py's record) in grey.
    rate_ax.set_xticks(list(positions), [label if reading is None else f"{label}\n" + _wrapped(reading.cell)
                                         for label, reading in zip(labels, readings)], fontsize=7)
    for text, reading in zip(rate_ax.get_xticklabels(), readings):
        if reading is not None and reading.withheld is not None:
            text.set_color(WITHHELD_COLOR)
    rate_ax.set_xlabel("under each bar: its verdict against the first", fontsize=7)
    kinds = {r.summary.mem_kind or "memory" for r in results}
    memory = [peak_memory(r.summary) for r in results]
    several = any(processes > 1 for _, processes in memory)
    bars(mem_ax, [mb for mb, _ in memory], "peak memory" + (" (all processes)" if several else ""),
         f"MB ({', '.join(sorted(kinds))})",
         notes=[f"\n{processes} processes" if processes > 1 else "" for _, processes in memory])
    return figure
