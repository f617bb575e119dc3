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
(checklist_items.py). An item's candidates race the current config on the user's own engine
(measure/race.py): rounds of short blocks, the current config's block beside every candidate's,
so each candidate's speed-up comes with the 95% interval of its pairs; a candidate leaves the
race as soon as it cannot be kept, and the race ends once the leader's interval answers the
question. The leader is kept only when that interval lies above `min_gain`: one short trial on a
shared machine moves by tens of percent, an interval says whether the gain is real. Screening
and comparing are one measurement, so no config is measured twice for one question. The next
item starts from what was kept. Blocks never keep their weights (each is undone by a Snapshot);
the walk starts no round that would pass the stated budget. The budget is read on the walk's
own clock (`clock=`, default time.monotonic), so a test can run it on a fake one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from . import trial
from .checklist_items import (FUNCTIONS as _ITEM_FUNCTIONS, ITEMS, Tried, batch_candidates,  # noqa: F401
                              batch_to_retry, precision_candidates, with_batch, with_workers, worker_candidates)
import numpy as np

from ..config import TrainConfig
from ..format import ratio as ratio_text
from ..measure.ab import diverged_refusal, trial_rate
from ..measure.race import Block, Entrant, race
from ..measure.steady import NOTHING
from ..measure.verdict import UNMEASURED, Verdict
from .tool_options import ToolRefusal, declare, option
from .tune import MEMORY_BUDGET, checked_lr, is_oom, memory_limit

_ROUNDS = (3, 8)  # fewest rounds before a race may keep a candidate, and most rounds of one race
_BLOCKS_PER_TRIAL = 6  # a race block is a sixth of trial_s: short blocks pair closely in time (the
# machine's speed drifts within a second) and the walk does its work in a third of a grid's time


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
    note: str = ""                  # why no verdict (e.g. no candidate ran)
    apart: bool = False             # the verdict compares runs measured apart (DDP), not paired blocks

    @property
    def speedup(self) -> float:
        return self.after / self.before if self.before else float("nan")

    def verdict_text(self) -> str:
        if self.note:
            return self.note
        if self.verdict.paired:
            return self.verdict.short()
        if self.apart:
            return self.verdict.short() + ", measured apart"
        n = self.verdict.pairs  # a race that ended before its pairs gave an interval: the blocks' screen
        return self.verdict.short() + f", screened on {n} block{'s' if n != 1 else ''} each"


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
    blocks: int = 0               # race blocks measured
    start: Tried | None = None    # the starting config, from its blocks in the first race
    rounds: int = 0               # race rounds, all items together

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
        v = max([42] + [len(i.verdict_text()) for i in self.items])  # and verdicts
        interval = f", 95% interval {total.interval_text()}" if math.isfinite(total.low) and total.pairs else ""
        lines = [f"nbtrain checklist walk on {self.device}: {self.baseline:,.0f} -> {self.final:,.0f} samples/s "
                 f"({ratio_text(self.final / self.baseline)}{interval}), {self.blocks} blocks in {self.rounds} rounds"
                 + (f" and {self.trials} separate trials" if self.trials else "")
                 + f" in {self.elapsed_s:.1f} s of a {self.budget_s:.0f} s budget",
                 f"  {'item':<{w}} {'head to head vs current (95% interval)':<{v}} {'kept':<4}  "
                 f"candidates (median samples/s of their blocks)",
                 f"  {'start':<{w}} {(self.start.text() if self.start else ''):<{v}} {'':<4}  "
                 f"{_describe(self.start_config)}"]
        for item in self.items:
            tried = "; ".join(t.text() for t in item.tried)
            lines.append(f"  {item.name:<{w}} {item.verdict_text():<{v}} {'yes' if item.kept else 'no':<4}  {tried}"
                         + (f" -> {item.chosen}" if item.kept else ""))
        for name, reason in self.skipped:
            lines.append(f"  {name:<{w}} {'skipped':<{v}} {'':<4}  {reason}")
        changes = self.changes()
        lines.append("best config: " + (", ".join(f"{k}={v!r}" for k, v in changes.items()) or "the starting one"))
        if self.lr_note:
            lines.append(f"learning rate: {self.lr_note}")
        lines.append("the live engine now uses the best config" if self.kept_on_engine
                     else "model and config restored (keep_best=True keeps the best config)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ChecklistResult({ratio_text(self.final / self.baseline)}: {self.changes()})"

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
        self.block_s = trial_s / _BLOCKS_PER_TRIAL
        self.overhead_s = 0.5  # start-up and restore of a whole trial (DDP's comparison); re-estimated
        self.block_overhead_s = 0.1  # the same per race block (no memory release); re-estimated from each block
        self.trials = self.blocks = self.rounds = 0
        self.rate = float("nan")  # samples/s of the config the walk has kept so far
        self.current: TrainConfig | None = None  # the config the walk has kept so far
        self.start_rates: list = []  # the starting config's block rates, from the first race
        self.retry_batch: int | None = None  # a larger batch the workers item races as well (checklist_items)
        self.snapshot = trial.Snapshot(engine)
        self.start = trial.plain_config(engine.config)  # the user's own config: its errors are theirs
        self.limit, _ = memory_limit(memory_budget, engine.device) if engine.device.type == "cpu" \
            else (None, "")

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0)

    def block_cost_s(self) -> float:
        return self.block_s + self.block_overhead_s

    def _over_memory(self, m) -> str:
        if self.limit is not None and m.config.device_type == "cpu" and m.peak_bytes > self.limit:
            return f"over the memory budget (peak {m.peak_bytes / 2**20:,.0f} MB)"
        return ""

    def _trial(self, config: TrainConfig, seconds: float):
        """(measurement or None, steady rate, block rates, why it failed) of `config` trained for `seconds`
        on the live model, the state put back after it; out of memory, a candidate whose loss diverged, or any
        error of a config the walk chose, is a result ("failed: ..."); only the user's own starting config raises
        (and the current config diverging: nothing could be compared with it)."""
        try:
            m, steady, parts = trial_rate(self.engine, config, seconds=seconds)
        except Exception as error:  # noqa: BLE001 - see the docstring
            if is_oom(error):
                return None, NOTHING, [], "out of memory"
            if config == self.start:
                raise
            return None, NOTHING, [], trial.failed(error)
        finally:
            self.snapshot.restore()
        if m.diverged and config == self.current:  # a candidate that diverges leaves the race; the current
            # config diverging leaves nothing to measure candidates against
            raise diverged_refusal("the current config", m.error)
        return m, steady, parts, m.error or self._over_memory(m)

    def block(self, config: TrainConfig) -> Block:
        """One race block of `config`."""
        t0 = self.clock()
        m, steady, parts, note = self._trial(config, self.block_s)
        rate = float("nan") if m is None else steady.rate if math.isfinite(steady.rate) else m.samples_per_s
        if note:  # a config that did not fit leaves memory behind that the next block would be charged with
            trial.release_memory()
        self.block_overhead_s = max(0.005, 0.5 * self.block_overhead_s + 0.5 * (self.clock() - t0 - self.block_s))
        return Block(rate, parts, note)

    def race(self, candidates: list, ordered: bool = False) -> list[Tried]:
        """Race (label, config) candidates against the current config (measure/race.py), within the budget.

        Returns [] when not even one round fits what is left of the budget."""
        if self.left() < (len(candidates) + 1) * self.block_cost_s():
            return []
        entrants = [Entrant(label, config) for label, config in candidates]
        result = race(self.block, self.current, entrants, decide_at=self.min_gain, min_rounds=_ROUNDS[0],
                      max_rounds=_ROUNDS[1], budget_s=max(self.left(), 0.0), block_cost_s=self.block_cost_s(),
                      ordered=ordered, clock=self.clock)
        trial.release_memory()
        self.blocks += result.blocks
        self.rounds += result.rounds
        if not self.start_rates:
            self.start_rates = result.base_rates
        if not math.isfinite(self.rate):
            self.rate = result.base_rate
        out_of_time = result.stopped_by == "budget"
        return [Tried(e.label, e.config, e.rate, e.note, blocks=e.rates, verdict=e.verdict,
                      left=(f"left after round {e.left_at}: {e.why_left}" if e.left_at else
                            f"out of time after {result.rounds} round{'s' if result.rounds > 1 else ''}"
                            if out_of_time and not e.note else "")) for e in entrants]

    def measure(self, config: TrainConfig) -> Tried | None:
        """One timed trial of a whole trial_s (DDP's comparison); None when the budget has no room for it."""
        seconds = min(self.trial_s, self.left() - self.overhead_s)
        if seconds < 0.25 * self.trial_s:
            return None
        t0 = self.clock()
        m, steady, blocks, note = self._trial(config, seconds)
        trial.release_memory()
        self.trials += 1
        self.overhead_s = max(0.2, 0.5 * self.overhead_s + 0.5 * (self.clock() - t0 - seconds))
        ok = not note and math.isfinite(steady.rate)
        return Tried("", config, steady.rate if ok else None, note, steady if ok else NOTHING, blocks)

    def ensure_rate(self) -> None:
        """The current config's rate, measured now when no race has measured it yet."""
        if math.isfinite(self.rate):
            return
        t = self.measure(self.current)
        if t is not None and t.samples_per_s:
            self.rate, self.start_rates = t.samples_per_s, t.blocks


@declare("checklist", "nbtrain.checklist", "the automated checklist walk: each item kept only when its head-to-head "
         "interval lies above the keep threshold; table and waterfall", (
             option("budget_s", "number", "seconds the walk may take", noun="a number of seconds", above=0,
                    flag="budget", metavar="S", panel="walk budget (s)"),
             option("keep_best", "switch", "leave the live model on the best config, and use it in "
                    "later cells", flag="keep_best"),
             option("target_global_batch", "whole", "global batch the walk "
                    "accumulates up to", low=1, nullable=True, flag="target_global_batch"),
             option("items", "names", "checklist items to try (default all): "
                    + ", ".join(ITEMS), choices=ITEMS, flag="items"),
             option("trial_s", "number", "seconds per screening trial", noun="a number of seconds",
                    none="from the budget", above=0, nullable=True),
             option("min_gain", "number", "smallest speed-up worth keeping", noun="a fraction",
                    note="smallest speed-up worth keeping", low=0, below=1),
             MEMORY_BUDGET,
             option("clock", "function", "the walk's clock",
                    allowed="a function returning seconds, like time.monotonic")),
         label="Checklist walk", figsize=(9, 3.8))
def checklist(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
              budget_s: float = 60.0, keep_best: bool = False, target_global_batch: int | None = None,
              items=ITEMS, trial_s: float | None = None, min_gain: float = 0.03, memory_budget=None,
              clock=time.monotonic, **parts) -> ChecklistResult:
    """Walk the checklist on the live model within `budget_s` seconds of `clock`; see the module docstring."""
    t0 = clock()  # the budget counts from here: finding the engine is part of the walk
    engine = trial.resolve(model, train_data, recipe=recipe, config=config, **parts)
    start = trial.plain_config(engine.config)
    # Blocks are short: a race's pairs of blocks, not one long trial, decide what is kept.
    trial_s = trial_s or min(max(budget_s / 20, 0.5), 3.0)
    walk = _Walk(engine, float(budget_s), trial_s, memory_budget, min_gain, clock, t0)
    if walk.left() < 2 * _ROUNDS[0] * walk.block_cost_s():  # the least that can keep anything
        raise ToolRefusal(lambda spell: f"{spell('budget_s', budget_s)} left no time to measure the starting "
                                        f"config against one candidate for {_ROUNDS[0]} rounds; allow more "
                                        f"(e.g. {spell('budget_s', 30)})")
    skipped, results, lr_checks = [], [], []
    current, finished = start, False
    try:
        for name in items:
            walk.current = current
            try:
                outcome = _ITEM_FUNCTIONS[name](walk, engine, start, current, target_global_batch)
            except Exception as error:  # noqa: BLE001 - an item that fails is a row; the walk goes on
                walk.snapshot.restore()
                results.append(ItemResult(name, [], walk.rate, walk.rate, False, "", note=trial.failed(error)))
                continue
            if isinstance(outcome, str):
                skipped.append((name, outcome))
                continue
            tried = [t for t in outcome if t.samples_per_s is not None or t.note]
            if not tried:
                left = max(walk.left(), 0)
                skipped.append((name, f"time budget: {left:.1f} s left" + (
                    f"; its first round needs about {(len(outcome) + 1) * walk.block_cost_s():.1f} s"
                    if left > 0 and outcome else "")))
                continue
            item = _decide(walk, name, tried)
            results.append(item)
            if name == "batch_size":
                walk.retry_batch = batch_to_retry(item, tried)
            if item.kept:
                chosen = next(t.config for t in tried if t.label == item.chosen)
                if chosen.scale_lr != "none" and chosen.lr_factor() != current.lr_factor():
                    chosen, notes = checked_lr(engine, chosen)  # the walk never hands over a diverging rate
                    lr_checks += notes
                current = chosen
                walk.rate = item.after
        walk.current = start
        if not walk.start_rates:  # no item raced: the start is measured on its own
            walk.rate = float("nan")
            walk.ensure_rate()
        finished = True
    finally:
        walk.snapshot.restore(current if keep_best and finished else None)
    if not walk.start_rates:
        raise ToolRefusal(lambda spell: f"{spell('budget_s', budget_s)} left no time to measure the starting "
                                        f"config; allow more (e.g. {spell('budget_s', 30)})")
    base = Tried("steady rate", start, float(np.median(walk.start_rates)), blocks=walk.start_rates)
    lr_note = ""
    if current.scale_lr != "none":
        lr_note = (f"{current.scale_lr} rule: x{current.lr_factor():.3g} for global batch {current.global_batch_size} "
                   f"vs {current.base_batch_size}" + (f", linear warm-up over {current.warmup_steps} steps"
                                                      if current.warmup_steps else
                                                      "; add warmup_steps (linear warm-up) for large scale-ups"))
    if keep_best and finished and engine.schedule is not None and current.lr_factor() != start.lr_factor():
        lr_note += f"; the live {type(engine.schedule.scheduler).__name__}'s rates rescaled by the same factor"
    lr_note = "; ".join(filter(None, [lr_note] + lr_checks))
    return ChecklistResult(start, current, base.samples_per_s, results, skipped, float(budget_s), clock() - t0,
                           walk.trials, str(engine.device), lr_note, keep_best, walk.blocks, base, walk.rounds)


def _decide(walk, name: str, tried: list) -> ItemResult:
    """The item's leading candidate and its verdict over the current config; kept when the paired
    interval lies above min_gain (accumulation, asked for by target_global_batch, is kept regardless;
    DDP, whose processes cannot alternate with the live model, on its interval measured apart)."""
    rate = walk.rate
    ran = [t for t in tried if t.samples_per_s and math.isfinite(t.verdict.ratio)]
    # The race's leader: a candidate still in it, else the one that stayed longest (its verdict rests on
    # the most pairs), then the higher ratio.
    best = max(ran, key=lambda t: (not t.left.startswith("left"), t.verdict.pairs, t.verdict.ratio), default=None)
    if best is None:
        note = "no candidate ran" if not any(t.samples_per_s for t in tried) else \
            "no time left to measure the current config beside it"
        return ItemResult(name, tried, rate, rate, False, "", note=note)
    verdict = best.verdict
    paired_enough = verdict.paired and verdict.pairs >= _ROUNDS[0]  # screens and two pairs only ever drop
    keep = name == "accumulation" or (verdict.above(walk.min_gain) and (paired_enough or best.apart))
    ratio = verdict.ratio
    return ItemResult(name, tried, rate, rate * ratio if keep else rate, keep, best.label if keep else "",
                      verdict, best.label, apart=best.apart)
