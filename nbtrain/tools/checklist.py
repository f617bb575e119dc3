"""The automated checklist walk: try each applicable speed item on the live model, keep what helps.

    walk = nbtrain.checklist(recipe, config=cfg, budget_s=60)
    print(walk.table())       # every item: its candidates, the head-to-head verdict, kept or not, skips and why
    walk.plot("walk.png")     # waterfall of the measured speed-ups
    cfg = walk.best_config    # or checklist(..., keep_best=True) leaves the live engine on it

Starting from the current config, items are tried in order — the data held in memory, batch size
(learning rate scaled by the linear rule), DataLoader workers (after the batch: workers pay only once
a batch keeps them busy), accumulation to a target global batch, device,
precision, optimizer kernels, channels_last, TF32 matmuls, torch.compile, activation
checkpointing, DDP processes — each item either measured or skipped with the reason
(checklist_items.py). An item's candidates are screened by short trials on the user's own
engine; the fastest is then measured head to head against the current config in alternating
blocks (measure/ab.py) — unless its screen, set against the current config's, already lies wholly
below a worthwhile gain — and kept only when the 95% interval of its speed-up lies above
`min_gain`: one short trial on a shared machine moves by tens of percent, an interval says
whether the gain is real. The next item starts from what was kept. Trials never keep their
weights (each is undone by a Snapshot); the walk stops starting trials and comparisons when
the stated budget would be passed. The budget is read on the walk's own clock (`clock=`,
default time.monotonic), so a test can run it on a fake one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from . import trial
from .checklist_items import (FUNCTIONS as _ITEM_FUNCTIONS, ITEMS, Tried, batch_candidates,  # noqa: F401
                              precision_candidates, with_batch, with_workers, worker_candidates)
from ..config import TrainConfig
from ..measure.ab import compare_on, steps_lasting, trial_rate
from ..measure.steady import NOTHING
from ..measure.verdict import UNMEASURED, Verdict, unpaired
from .tool_options import ToolRefusal, declare, option
from .tune import MEMORY_BUDGET, _is_oom, checked_lr, memory_limit

_AB_PAIRS = (3, 8)  # fewest and most pairs of blocks per head-to-head comparison


@dataclass
class ItemResult:
    name: str
    tried: list
    before: float
    after: float
    kept: bool
    chosen: str
    verdict: Verdict = UNMEASURED   # the chosen candidate over the current config, with its interval
    compared: str = ""              # the candidate measured head to head
    note: str = ""                  # why no verdict (e.g. no time left to compare)

    @property
    def speedup(self) -> float:
        return self.after / self.before if self.before else float("nan")

    def verdict_text(self) -> str:
        if self.note:
            return self.note
        return self.verdict.short() + ("" if self.verdict.paired else ", measured apart")


@dataclass
class ChecklistResult:
    start_config: TrainConfig
    best_config: TrainConfig
    baseline: float
    items: list
    skipped: list                 # (item, reason)
    budget_s: float
    elapsed_s: float
    trials: int
    device: str
    lr_note: str = ""
    kept_on_engine: bool = False
    blocks: int = 0               # head-to-head blocks measured
    start: Tried | None = None    # the starting config's screening trial

    @property
    def final(self) -> float:
        return self.items[-1].after if self.items else self.baseline

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
        interval = f", 95% interval {total.interval_text()}" if math.isfinite(total.low) and total.pairs else ""
        lines = [f"nbtrain checklist walk on {self.device}: {self.baseline:,.0f} -> {self.final:,.0f} samples/s "
                 f"(x{self.final / self.baseline:.2f}{interval}), {self.trials} trials and {self.blocks} "
                 f"head-to-head blocks in {self.elapsed_s:.1f} s of a {self.budget_s:.0f} s budget",
                 f"  {'item':<{w}} {'head to head vs current (95% interval)':<42} {'kept':<4}  "
                 f"screened (samples/s, 95% interval)",
                 f"  {'start':<{w}} {(self.start.text() if self.start else ''):<42} {'':<4}  "
                 f"{_describe(self.start_config)}"]
        for item in self.items:
            tried = "; ".join(t.text() for t in item.tried)
            lines.append(f"  {item.name:<{w}} {item.verdict_text():<42} {'yes' if item.kept else 'no':<4}  {tried}"
                         + (f" -> {item.chosen}" if item.kept else ""))
        for name, reason in self.skipped:
            lines.append(f"  {name:<{w}} {'skipped':<42} {'':<4}  {reason}")
        changes = self.changes()
        lines.append("best config: " + (", ".join(f"{k}={v!r}" for k, v in changes.items()) or "the starting one"))
        if self.lr_note:
            lines.append(f"learning rate: {self.lr_note}")
        lines.append("the live engine now uses the best config" if self.kept_on_engine
                     else "model and config restored (keep_best=True keeps the best config)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ChecklistResult(x{self.final / self.baseline:.2f}: {self.changes()})"

    def plot(self, path=None, ax=None):
        """Waterfall: the starting throughput, each item's measured change, the result."""
        from .waterfall import waterfall
        return waterfall(self, path=path, ax=ax)


def _describe(c: TrainConfig) -> str:
    return (f"batch {c.batch_size} x accumulate {c.accumulate_grad_batches}, {c.num_workers} workers, "
            f"{c.device_type}, {c.precision}, {c.world_size} process(es)")


class _Walk:
    def __init__(self, engine, budget_s: float, trial_s: float, memory_budget, min_gain: float, clock, t0: float):
        self.engine, self.clock, self.t0 = engine, clock, t0
        self.budget_s, self.trial_s, self.min_gain = budget_s, trial_s, min_gain
        self.overhead_s = 0.5  # start-up and restore per trial; re-estimated from each trial
        self.block_overhead_s = 0.25  # the same per head-to-head block (no memory release); re-estimated too
        self.trials = self.blocks = 0
        self.rate = float("nan")  # samples/s of the config the walk has kept so far
        self.rate_blocks: list = []  # that config's screened block rates, to screen candidates against
        self.snapshot = trial.Snapshot(engine)
        self.limit, _ = memory_limit(memory_budget, engine.device) if engine.device.type == "cpu" \
            else (None, "")

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0)

    def comparison_s(self) -> float:
        """The least time a head-to-head comparison takes: its fewest pairs of blocks, with their overheads."""
        return 2 * _AB_PAIRS[0] * (self.trial_s / 4 + self.block_overhead_s)

    def measure(self, config: TrainConfig, reserve: bool = True) -> Tried | None:
        """One timed screening trial; None when the budget has no room left for it (and, with `reserve`,
        for the comparison it leads to: a screened candidate that cannot be compared cannot be kept)."""
        seconds = min(self.trial_s, self.left() - self.overhead_s - (self.comparison_s() if reserve else 0.0))
        if seconds < 0.25 * self.trial_s:
            return None
        t0 = self.clock()
        steady, blocks = None, []
        try:
            m, steady, blocks = trial_rate(self.engine, config, seconds=seconds)
            note = m.error
            if not note and self.limit is not None and config.device_type == "cpu" and m.peak_bytes > self.limit:
                note = f"over the memory budget (peak {m.peak_bytes / 2**20:,.0f} MB)"
        except Exception as error:  # noqa: BLE001 - out of memory is a result; anything else is raised
            if not _is_oom(error):
                raise
            note = "out of memory"
        finally:
            self.snapshot.restore()
            trial.release_memory()
        self.trials += 1
        self.overhead_s = max(0.2, 0.5 * self.overhead_s + 0.5 * (self.clock() - t0 - seconds))
        ok = steady is not None and not note and math.isfinite(steady.rate)
        return Tried("", config, steady.rate if ok else None, note, steady if ok else NOTHING, blocks)

    def head_to_head(self, current: TrainConfig, best: Tried):
        """The best candidate against the current config in alternating blocks, within the budget.

        Returns (verdict, note): the note says why there is no verdict.
        """
        block_s = self.trial_s / 4  # each block: a quarter of a screening trial, so a few pairs fit one trial's time
        if self.left() < self.comparison_s():
            return UNMEASURED, f"no time left to compare ({max(self.left(), 0):.1f} s)"
        steps = (steps_lasting(self.rate, current, block_s), steps_lasting(best.samples_per_s, best.config, block_s))
        try:
            result = compare_on(self.engine, self.snapshot, current, best.config, block_steps=steps, discard=False,
                                min_pairs=_AB_PAIRS[0], max_pairs=_AB_PAIRS[1], precision_target=0.03,
                                budget_s=max(min(4 * self.trial_s, self.left() - self.overhead_s), 0.0),
                                clock=self.clock, decide_at=self.min_gain)
        except Exception as error:  # noqa: BLE001 - as in a screening trial, only out of memory is a result
            if not _is_oom(error):
                raise
            return UNMEASURED, "out of memory when compared head to head"
        finally:
            self.snapshot.restore()
            trial.release_memory()
        blocks = len(result.rates_a) + len(result.rates_b)
        self.blocks += blocks
        self.block_overhead_s = max(0.02, 0.5 * self.block_overhead_s + 0.5 * (result.seconds / blocks - block_s))
        return result.verdict, ""


@declare("checklist", "nbtrain.checklist", "the automated checklist walk: each item kept only when its head-to-head "
         "interval lies above the keep threshold; table and waterfall", (
             option("budget_s", "number", "a number of seconds > 0", "seconds the walk may take", above=0,
                    flag="budget", metavar="S", panel="walk budget (s)"),
             option("keep_best", "switch", "true or false", "leave the live model on the best config, and use it in "
                    "later cells", flag="keep_best"),
             option("target_global_batch", "whole", "a whole number >= 1, or None", "global batch the walk "
                    "accumulates up to", low=1, nullable=True, flag="target_global_batch"),
             option("items", "names", "each one of " + ", ".join(ITEMS), "checklist items to try (default all): "
                    + ", ".join(ITEMS), choices=ITEMS, flag="items"),
             option("trial_s", "number", "a number of seconds > 0, or None (from the budget)",
                    "seconds per screening trial", above=0, nullable=True),
             option("min_gain", "number", "a fraction in [0, 1) (smallest speed-up worth keeping)",
                    "smallest speed-up worth keeping", low=0, below=1),
             MEMORY_BUDGET,
             option("clock", "function", "a function returning seconds, like time.monotonic", "the walk's clock")),
         label="Checklist walk", figsize=(9, 3.8))
def checklist(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
              budget_s: float = 60.0, keep_best: bool = False, target_global_batch: int | None = None,
              items=ITEMS, trial_s: float | None = None, min_gain: float = 0.03, memory_budget=None,
              clock=time.monotonic, **parts) -> ChecklistResult:
    """Walk the checklist on the live model within `budget_s` seconds of `clock`; see the module docstring."""
    t0 = clock()  # the budget counts from here: finding the engine is part of the walk
    engine = trial.resolve(model, train_data, recipe=recipe, config=config, **parts)
    start = trial.plain_config(engine.config)
    # Screening trials are short: the head-to-head comparison, not one trial, decides what is kept.
    trial_s = trial_s or min(max(budget_s / 20, 0.5), 3.0)
    walk = _Walk(engine, float(budget_s), trial_s, memory_budget, min_gain, clock, t0)
    skipped, results, lr_checks = [], [], []
    current, finished = start, False
    try:
        base = walk.measure(start, reserve=False)
        if base is None:
            raise ToolRefusal(lambda spell: f"{spell('budget_s', budget_s)} left no time to measure the starting "
                                            f"config; allow more (e.g. {spell('budget_s', 30)})")
        if base.samples_per_s is None:
            raise ToolRefusal(lambda spell: f"the starting config could not be measured ({base.note})")
        base.label = "steady rate"
        current, walk.rate, walk.rate_blocks = start, base.samples_per_s, base.blocks
        for name in items:
            outcome = _ITEM_FUNCTIONS[name](walk, engine, start, current, target_global_batch)
            if isinstance(outcome, str):
                skipped.append((name, outcome))
                continue
            tried = [t for t in outcome if t.samples_per_s is not None or t.note]
            if not tried:
                left = max(walk.left(), 0)
                skipped.append((name, f"time budget: {left:.1f} s left" + (
                    f"; an item needs about {walk.trial_s + walk.overhead_s + walk.comparison_s():.1f} s (a "
                    "screening trial and a head-to-head comparison)" if left > 0 else "")))
                continue
            item = _decide(walk, name, current, tried)
            results.append(item)
            if item.kept:
                chosen = next(t.config for t in tried if t.label == item.chosen)
                if chosen.scale_lr != "none" and chosen.lr_factor() != current.lr_factor():
                    chosen, notes = checked_lr(engine, chosen)  # the walk never hands over a diverging rate
                    lr_checks += notes
                current = chosen
                walk.rate = item.after
                walk.rate_blocks = next(t.blocks for t in tried if t.label == item.chosen)
        finished = True
    finally:
        walk.snapshot.restore(current if keep_best and finished else None)
    lr_note = ""
    if current.scale_lr != "none":
        lr_note = (f"{current.scale_lr} rule: x{current.lr_factor():.3g} for global batch {current.global_batch_size} "
                   f"vs {current.base_batch_size}" + (f", linear warm-up over {current.warmup_steps} steps"
                                                      if current.warmup_steps else
                                                      "; add warmup_steps (linear warm-up) for large scale-ups"))
    lr_note = "; ".join(filter(None, [lr_note] + lr_checks))
    return ChecklistResult(start, current, base.samples_per_s, results, skipped, float(budget_s), clock() - t0,
                           walk.trials, str(engine.device), lr_note, keep_best, walk.blocks, base)


def _decide(walk, name: str, current: TrainConfig, tried: list) -> ItemResult:
    """The item's fastest screened candidate, measured against the current config; kept when its
    interval lies above min_gain (accumulation, asked for by target_global_batch, is kept regardless)."""
    rate = walk.rate
    best = max((t for t in tried if t.samples_per_s), key=lambda t: t.samples_per_s, default=None)
    if best is None:
        return ItemResult(name, tried, rate, rate, False, "", note="no candidate ran")
    required = name == "accumulation"
    screened = unpaired(walk.rate_blocks, best.blocks)
    if best.verdict is not None:  # compared as it was measured (DDP, in processes of its own)
        verdict = best.verdict
        note = "" if math.isfinite(verdict.ratio) else "no time left to measure the current config beside it"
    elif not required and math.isfinite(screened.high) and screened.high < 1 + walk.min_gain:
        # Its screen lies wholly below a gain worth keeping: a comparison would not keep it, so the time
        # goes to the items after it. Screens measured apart only ever drop a candidate, never keep one.
        verdict, note = screened, ""
    else:
        verdict, note = walk.head_to_head(current, best)
    keep = required or verdict.above(walk.min_gain)
    # The head-to-head ratio carries the speed-up; without one (a required item out of time) the screens do.
    ratio = verdict.ratio if math.isfinite(verdict.ratio) else best.samples_per_s / rate
    return ItemResult(name, tried, rate, rate * ratio if keep else rate, keep, best.label if keep else "",
                      verdict, best.label, note)
