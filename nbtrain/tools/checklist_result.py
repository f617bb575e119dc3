"""What a checklist walk returns: each item as raced (ItemResult), in the order walked, and the whole
walk (ChecklistResult) with its table and waterfall."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..format import PrintsAsTable, ratio as ratio_text
from ..measure.verdict import UNMEASURED, Verdict
from .checklist_items import Tried


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
    apart: bool = False             # the verdict compares runs measured apart (DDP), not paired blocks
    bottleneck: str = ""            # the binding ceiling when it was tried ("" where none was read)

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
        if text.startswith(_NOISY) and note.startswith(_NOISY + ": "):  # said once: "too noisy to tell (..): why"
            note = note[len(_NOISY) + 2:]
        return text + (f": {note}" if note else "")


_NOISY = "too noisy to tell"


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

    @property
    def final(self) -> float:
        kept = [i for i in self.items if i.kept]
        return kept[-1].after if kept else self.baseline

    def overall(self) -> Verdict:
        """The kept items' speed-ups multiplied, with their intervals combined (on the log scale)."""
        kept = [i for i in self.items if i.kept]
        if not kept:
            return Verdict(1.0, 1.0, 1.0, 0)
        ratio = self.final / self.baseline
        halves = [(math.log(i.verdict.high) - math.log(i.verdict.low)) / 2 for i in kept]
        half = math.sqrt(sum(h * h for h in halves)) if all(math.isfinite(h) for h in halves) else float("nan")
        return Verdict(ratio, ratio * math.exp(-half), ratio * math.exp(half), min(i.verdict.pairs for i in kept))

    def changes(self) -> dict:
        return {k: v for k, (_, v) in self.best_config.changed_from(self.start_config).items()}

    def table(self) -> str:
        total = self.overall()
        w = max([len("start")] + [len(i.name) for i in self.items] + [len(n) for n, _ in self.skipped])  # names fit
        v = max([42] + [len(i.verdict_text()) for i in self.items])  # and verdicts
        interval = f", 95% interval {total.interval_text()}" if math.isfinite(total.low) and total.pairs else ""
        lines = [f"nbtrain checklist walk on {self.device}: {self.baseline:,.0f} -> {self.final:,.0f} samples/s "
                 f"({ratio_text(self.final / self.baseline)}{interval}), {self.blocks} blocks in {self.rounds} rounds"
                 + (f" and {self.trials} separate trials" if self.trials else "")
                 + f" in {self.elapsed_s:.1f} s of a {self.budget_s:.0f} s budget",
                 f"  {'bound by':<9} {'item':<{w}} {'head to head vs current (95% interval)':<{v}} {'kept':<4}  "
                 f"candidates (median samples/s of their blocks)",
                 f"  {'':<9} {'start':<{w}} {(self.start.text() if self.start else ''):<{v}} {'':<4}  "
                 f"{_describe(self.start_config)}"]
        for item in self.items:
            tried = "; ".join(t.text() for t in item.tried)
            lines.append(f"  {item.bottleneck or '-':<9} {item.name:<{w}} {item.verdict_text():<{v}} "
                         f"{'yes' if item.kept else 'no':<4}  {tried}" + (f" -> {item.chosen}" if item.kept else ""))
        for name, reason in self.skipped:
            lines.append(f"  {'':<9} {name:<{w}} {'skipped':<{v}} {'':<4}  {reason}")
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
        return f"ChecklistResult({ratio_text(self.final / self.baseline)}: {self.changes()})"

    def plot(self, path=None, ax=None):
        """Waterfall: the starting throughput, each item's measured change in the order walked, the result."""
        from .waterfall import waterfall
        return waterfall(self, path=path, ax=ax)


def _describe(c: TrainConfig) -> str:
    return (f"batch {c.batch_size} x accumulate {c.accumulate_grad_batches}, {c.num_workers} workers, "
            f"{c.device_type}, {c.precision}, {c.world_size} process(es)")
