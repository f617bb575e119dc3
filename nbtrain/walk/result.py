"""What a checklist walk returns: each item as raced (ItemResult), in the order walked, and the whole
walk (ChecklistResult) with its table and waterfall."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..format import PrintsAsTable
from ..measure.verdict import UNMEASURED, Verdict
from ..measure.withheld import Withheld
from .items import Tried


@dataclass
class ItemResult:
    name: str
    tried: list
    before: float
    after: float
    kept: bool
    chosen: str
    verdict: Verdict = UNMEASURED   # the leading candidate over the current config, with its interval
    compared: str = ""              # the leading candidate
    note: str = ""                  # why no verdict (e.g. no candidate ran), or why it stayed too noisy to tell
    withheld: Withheld | None = None  # why its race's leader stayed undecided (withheld.undecided): what the walk reads
    apart: bool = False             # the verdict compares runs measured apart (DDP), not paired blocks
    bottleneck: str = ""            # the binding ceiling when it was tried ("" where none was read)
    current_rate: float = float("nan")  # the current config's samples/s beside the candidates, in the same race
    earlier: list = field(default_factory=list)  # the same item's earlier races, at configs the walk left since
    about: str = ""                 # what the item read beside its race (the batch: the critical batch size)

    @property
    def speedup(self) -> float:
        return self.after / self.before if self.before else float("nan")

    def verdict_text(self, why: bool = True) -> str:
        """The verdict, then (`why`) the note on how it came about; without it, short enough for a chart."""
        if self.note and not math.isfinite(self.verdict.ratio):
            return self.note if why else self.note.split(": ", 1)[0]
        if self.verdict.paired:
            text = self.verdict.short()
        elif self.apart:
            text = self.verdict.short() + ", measured apart"
        else:
            n = self.verdict.pairs  # a race that ended before its pairs gave an interval: the blocks' screen
            text = self.verdict.short() + f", screened on {n} block{'s' if n != 1 else ''} each"
        if not why:
            return text
        note = self.note
        if self.verdict.too_noisy and self.withheld is not None and note == self.withheld.words:
            note = self.withheld.cell  # said once: "too noisy to tell (..): why"
        return text + (f": {note}" if note else "")


@dataclass(kw_only=True)
class ChecklistResult(PrintsAsTable):
    start_config: TrainConfig
    best_config: TrainConfig
    baseline: float
    items: list                   # ItemResult, in the order walked (an item may appear under several bottlenecks)
    skipped: list                 # (item, reason)
    budget_s: float
    elapsed_s: float
    trials: int = 0
    device: str = ""
    lr_note: str = ""
    kept_on_engine: bool = False
    blocks: int = 0               # race blocks measured
    start: Tried | None = None    # the starting config, from its blocks in the first race
    rounds: int = 0               # race rounds, all items together
    path: list = field(default_factory=list)  # (config, Bottleneck or None) each time the ceilings were read
    head_to_head: Tried | None = None  # the walk's choice raced against the start at the end: the headline
    head_to_head_note: str = ""   # why the choice was not measured against the start, where it was not
    chosen_config: TrainConfig | None = None  # what the items kept, before the closing race judged it
    withdrawn: str = ""           # why the closing race did not back the items' choice: then nothing is kept
    learned: object = None        # quality.Quality: the choice's held-out loss against the start's at equal time
    min_gain: float = 0.03        # the keep rule: an item's 95% interval must lie above 1 + min_gain

    @property
    def moved(self) -> bool:
        """The walk chose another config than the start."""
        return self.best_config != self.start_config

    @property
    def final(self) -> float:
        """The walk's choice's samples/s as the head-to-head measured it against the start (nan: not measured)."""
        if not self.moved:
            return self.baseline
        v = self.overall()
        return self.baseline * v.ratio if math.isfinite(v.ratio) else float("nan")

    def overall(self) -> Verdict:
        """The walk's choice over the start, measured head to head in one race at the end (never the kept items'
        ratios multiplied: each was measured from another config, under another load)."""
        if not self.moved:
            return Verdict(1.0, 1.0, 1.0, 0)
        return self.head_to_head.verdict if self.head_to_head is not None else UNMEASURED

    def headline(self) -> str:
        """The walk's result in one line: the head-to-head's rates and verdict, or why there is none."""
        if self.withdrawn:
            h = self.head_to_head
            raced = f" ({self.baseline:,.0f} -> {h.samples_per_s:,.0f} samples/s)" if h is not None else ""
            return f"nothing kept: {self.withdrawn}{raced}; the best config is the start"
        if not self.moved:
            return f"{self.baseline:,.0f} samples/s: nothing kept, the starting config is the best found"
        if self.head_to_head is None:
            return f"{self.head_to_head_note}; no speed-up is claimed"
        return (f"{self.baseline:,.0f} -> {self.final:,.0f} samples/s, the walk's choice against the start "
                f"head to head: {self.overall().text()}")

    def rows(self) -> list:
        """One ItemResult per item, in the order first walked: the race it was kept in, else its last one; its
        other races (at configs the walk left since) in `earlier`."""
        by_name: dict = {}
        for item in self.items:
            by_name.setdefault(item.name, []).append(item)
        out = []
        for races in by_name.values():
            shown = next((i for i in reversed(races) if i.kept), races[-1])
            out.append(dataclasses.replace(shown, earlier=[i for i in races if i is not shown]))
        return out

    def changes(self) -> dict:
        return {k: v for k, (_, v) in self.best_config.changed_from(self.start_config).items()}

    def table(self) -> str:
        rows = self.rows()
        result = self.overall().short() if self.moved and self.head_to_head is not None else \
            "nothing kept" if not self.moved else "not measured"
        w = max([len("result")] + [len(i.name) for i in rows] + [len(n) for n, _ in self.skipped])  # names fit
        v = max([42, len(result)] + [len(i.verdict_text()) for i in rows])  # and verdicts
        lines = [f"nbtrain checklist walk on {self.device}: {self.headline()}; {self.blocks} blocks in {self.rounds} "
                 f"rounds" + (f" and {self.trials} separate trials" if self.trials else "")
                 + f" in {self.elapsed_s:.1f} s of a {self.budget_s:.0f} s budget",
                 f"  {'bound by':<9} {'item':<{w}} {'head to head vs current (95% interval)':<{v}} {'kept':<4}  "
                 f"median samples/s of their blocks, each row's in its own race (the machine's load differs "
                 f"from race to race: compare within a row)",
                 f"  {'':<9} {'start':<{w}} {(self.start.text() if self.start else ''):<{v}} {'':<4}  "
                 f"{_describe(self.start_config)}"]
        for item in rows:
            tried = "; ".join([f"current {item.current_rate:,.0f}"] * math.isfinite(item.current_rate)
                              + [t.text() for t in item.tried])
            again = "".join(f" [raced before, from the config the walk had then: {i.verdict_text(why=False)}]"
                            for i in item.earlier)
            lines.append(f"  {item.bottleneck or '-':<9} {item.name:<{w}} {item.verdict_text():<{v}} "
                         f"{'yes' if item.kept else 'no':<4}  {tried}" + (f" -> {item.chosen}" if item.kept else "")
                         + again + (f" [{item.about}]" if item.about else ""))
        for name, reason in self.skipped:
            lines.append(f"  {'':<9} {name:<{w}} {'skipped':<{v}} {'':<4}  {reason}")
        if self.withdrawn:
            h, chosen = self.head_to_head, self.chosen_config.changed_from(self.start_config)
            cell = h.verdict.short() if h is not None else "not measured"
            lines.append(f"  {'':<9} {'result':<{w}} {cell:<{v}} {'no':<4}  the items' choice ("
                         + ", ".join(f"{k}={b!r}" for k, (_, b) in chosen.items())
                         + f") against the start, head to head in one race: {self.withdrawn}; nothing kept")
        if self.moved:
            h = self.head_to_head
            raced = (f"start {self.baseline:,.0f}; the walk's choice {self.final:,.0f}" if h is not None
                     else self.head_to_head_note)
            lines.append(f"  {'':<9} {'result':<{w}} {result:<{v}} {'':<4}  the walk's choice against the start, "
                         f"head to head in one race: {raced}" + (f"; it {self.learned.text()}" if self.learned else ""))
        changes = self.changes()
        lines.append("best config: " + (", ".join(f"{k}={v!r}" for k, v in changes.items()) or "the starting one"))
        if self.path:
            lines.append("path: " + " -> ".join(b.kind if b is not None else "ceilings not read" for _, b in self.path))
        if self.lr_note:
            lines.append(f"learning rate: {self.lr_note}")
        lines.append("the live engine now uses the best config" if self.kept_on_engine
                     else "model and config restored (keep_best=True keeps the best config)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ChecklistResult({self.overall().short() if self.moved else 'nothing kept'}: {self.changes()})"

    def plot(self, path=None, ax=None):
        """Waterfall: the starting throughput, each item's measured change in the order walked, the result."""
        from .waterfall import waterfall
        return waterfall(self, path=path, ax=ax)


def _describe(c: TrainConfig) -> str:
    return (f"batch {c.batch_size} x accumulate {c.accumulate_grad_batches}, {c.num_workers} workers, "
            f"{c.device_type}, {c.precision}, {c.world_size} process(es)")
