"""The automated checklist walk: follow the bottleneck, keep what the race shows (nbtrain.checklist: tool.py).

The walk reads the four ceilings at the current config (tools/ceilings.py, their verdict from
measure/bottleneck.py: the binding ceiling and its remedies in order), tries the items that answer
the binding ceiling (and any ceiling within `_NEAR` of it: a near one may bind after the next
change), in the remedies' order, and keeps the first whose race shows a gain; then it reads the
ceilings again at the config kept, and so on, until no item answering the binding ceiling gains or
the budget ends; then the items not tried yet are tried once each (a reading can be wrong where two
ceilings are close, and an item asked for is never left out silently), and one kept there resumes
the path; an item whose race ended too noisy to tell with a promising ratio gets one second look
from the same config while the budget lasts. An item rejected is tried again once the config moves
(a keep; the ceilings are read only then): a batch of 32 bound by the host cannot show what held data buys at a batch of 2048
bound by the loader, nor can workers that batch 16's steps could not keep busy show what they give
batch 256. Items with stage "first" (the GPU) come before the first reading, those with stage "last"
(accumulation to a target, DDP) once after the path ends. Where the ceilings cannot be read, every
item is tried once in the order registered (items.py). The walk never names an item.

An item's candidates race the current config (measure/race.py): rounds of short blocks, the
current config's block beside every candidate's, so each speed-up comes with the 95% interval of
its pairs; a candidate is kept only when that interval lies above `min_gain`. A race that ends
without a verdict says why (which side's blocks varied, by how much). Blocks never keep their
weights; no round starts that would pass the stated budget, read on the walk's own clock (`clock=`,
default time.monotonic). The measurements go through a bench (bench.py's Bench): a trial on the live
model here, a simulated machine in the tests (tests/simulated_machine.py).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..measure.race import Entrant, race
from ..measure.withheld import Withheld, undecided
from ..tools import trial
from ..tools.failure_causes import none_ran
from ..tools.tool_options import ToolRefusal
from .bench import Bench
from .headline import backing, head_to_head, head_to_head_reserve, overrun_s
from .items import ITEMS, REGISTRY, Tried
from ..measure.learned import alters_learning
from .quality import judged_by_learning, quality_cost
from .result import ChecklistResult, ItemResult
from .steps_note import steps_note

_ROUNDS = (3, 8)  # fewest rounds before a race may keep a candidate, and most rounds of one race
_BLOCKS_PER_TRIAL = 6  # a race block is a sixth of trial_s: short blocks pair closely in time (the
# machine's speed drifts within a second) and the walk does its work in a third of a grid's time
_NEAR = 1.5  # a ceiling within this factor of the binding one is answered too: the readings' error is of this order
_READING_S = 4.0  # first guess at one reading of the ceilings (3.4 s on this 2-core CPU: the peaks' matmuls, the
# bandwidth's copy, half a second each of the loader and of the model at two batches); re-estimated from each


class Walk:
    """The walk's state and its clock; measurements go through `bench` (bench.Bench)."""

    def __init__(self, bench: Bench, budget_s: float, trial_s: float, min_gain: float, clock, t0: float,
                 target: int | None = None):
        self.bench, self.here, self.clock, self.t0 = bench, bench.here, clock, t0
        self.budget_s, self.trial_s, self.min_gain, self.target = budget_s, trial_s, min_gain, target
        self.block_s = trial_s / _BLOCKS_PER_TRIAL
        self.overhead_s = 0.5  # start-up and restore of a whole trial (DDP's comparison); re-estimated
        self.block_overhead_s = 0.1  # the same per race block (no memory release); re-estimated from each block
        self.trials = self.blocks = self.rounds = 0
        self.rate = float("nan")  # samples/s of the config the walk has kept so far
        self.start = bench.start
        self.current = bench.start  # the config the walk has kept so far
        self.start_rates: list = []  # the starting config's block rates, from the first race
        self.results: list[ItemResult] = []  # each item's race, in the order walked: what later items read (outcome)
        self.seen: set = set()  # configs measured once already (their start-up paid)
        self.start_up_s = 0.5  # what a config's first block takes beyond the others; re-estimated
        self.reading_s = _READING_S
        self.race_base = float("nan")  # the current config's samples/s in the item's race (nan: not raced)
        self.held_back = lambda: 0.0  # seconds the items leave for the final head-to-head (headline.py)

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0) - self.held_back()

    def outcome(self, name: str) -> ItemResult | None:
        """Item `name`'s last race (None: it has not raced): what an item hands to the items after it is the
        result it returned (the workers item reads the batch item's), never a field set on the walk."""
        return next((r for r in reversed(self.results) if r.name == name and r.tried), None)

    def block_cost_s(self) -> float:
        return self.block_s + self.block_overhead_s

    def block(self, config):
        t0 = self.clock()
        block = self.bench.block(config, self.block_s, self.current)
        extra = self.clock() - t0 - self.block_s
        if config in self.seen:
            self.block_overhead_s = max(0.005, 0.5 * self.block_overhead_s + 0.5 * extra)
        else:  # a config's first block also pays its start-up (workers, autotuning), once
            self.seen.add(config)
            paid = extra - self.block_overhead_s  # up at once, down by halves: a budget errs on the safe side
            self.start_up_s = max(0.0, paid, 0.5 * self.start_up_s + 0.5 * paid)
        return block

    def race(self, candidates: list, ordered: bool = False, judged: bool = True) -> list[Tried]:
        """Race (label, config) candidates against the current config (measure/race.py), within the budget.

        Returns [] when not even one round fits what is left of the budget (with, where `judged` and a candidate
        changes what is learned, the race of what it learns that a keep takes: quality.py)."""
        new = sum(config not in self.seen for _, config in candidates) + (self.current not in self.seen)
        judged = judged and any(alters_learning(c, self.current) for _, c in candidates)
        judged = quality_cost(self) if judged else 0.0
        need = (len(candidates) + 1) * self.block_cost_s() + new * self.start_up_s
        if self.left() < need:
            return []
        if self.left() < need + judged:  # a race still measures (the start's rate), but leaves its keep unjudged
            judged = 0.0
        entrants = [Entrant(label, config) for label, config in candidates]
        result = race(self.block, self.current, entrants, decide_at=self.min_gain, min_rounds=_ROUNDS[0],
                      max_rounds=_ROUNDS[1], budget_s=max(self.left() - judged, 0.0), block_cost_s=self.block_cost_s(),
                      ordered=ordered, clock=self.clock)
        leader = result.leader()
        keep = [self.current] + ([leader.config] if leader is not None else [])
        self.bench.race_over(keep)  # the configs the walk goes on with keep their workers (bench.py)
        self.seen &= set(keep)  # the others pay their start-up again in a later race
        self.blocks += result.blocks
        self.rounds += result.rounds
        if not self.start_rates:
            self.start_rates = result.base_rates
        if not math.isfinite(self.rate):
            self.rate = result.base_rate
        out_of_time = result.stopped_by == "budget"
        tried = [Tried(e.label, e.config, e.rate, e.note, blocks=e.rates, verdict=e.verdict,
                       left=(f"left after round {e.left_at}: {e.why_left}" if e.left_at else
                             f"out of time after {result.rounds} round{'s' if result.rounds > 1 else ''}"
                             if out_of_time and not e.note else "")) for e in entrants]
        self.last_race = result
        self.race_base = result.base_rate  # the current config beside the candidates, in this race
        return tried

    def measure(self, config) -> Tried | None:
        """One timed trial of a whole trial_s (DDP's comparison); None when the budget has no room for it."""
        seconds = min(self.trial_s, self.left() - self.overhead_s)
        if seconds < 0.25 * self.trial_s:
            return None
        t0 = self.clock()
        tried = self.bench.trial(config, seconds, self.current)
        self.trials += 1
        self.overhead_s = max(0.2, 0.5 * self.overhead_s + 0.5 * (self.clock() - t0 - seconds))
        return tried

    def apart(self, label: str, config, steps: int) -> Tried:
        """`config` run in processes of its own (DDP's ranks), `steps` steps: one more trial of the walk's."""
        self.trials += 1
        return self.bench.apart(label, config, steps)

    def ensure_rate(self) -> None:
        """The current config's rate, measured now when no race has measured it yet."""
        if math.isfinite(self.rate):
            return
        t = self.measure(self.current)
        if t is not None and t.samples_per_s:
            self.rate, self.start_rates = t.samples_per_s, t.blocks

    def bottleneck(self):
        """The ceilings' verdict at the current config, or None where they cannot be read (or the budget has no
        room: a reading must leave room for another and for one race)."""
        if self.left() < 2 * self.reading_s + 2 * _ROUNDS[0] * self.block_cost_s():
            return None
        t0 = self.clock()
        try:
            return self.bench.bottleneck(self.current, self.block_s)
        except Exception:  # noqa: BLE001 - a walk without a reading walks every item once instead
            return None
        finally:
            self.reading_s = 0.5 * self.reading_s + 0.5 * (self.clock() - t0)


def answering(bottleneck, items) -> list:
    """The items that answer the binding ceiling (or one within _NEAR of it), in the order of its remedies."""
    near = _near(bottleneck)
    options = [r.item for r in bottleneck.remedies if r.ceiling in near]
    ranked = [i for i in items if i.stage == "bottleneck" and any(a in options for a in i.answers)]
    return sorted(ranked, key=lambda i: min(options.index(a) for a in i.answers if a in options))


def _near(bottleneck) -> set:
    """The binding ceiling and those within _NEAR of it."""
    return {k for k, r in bottleneck.ratios.items() if r <= _NEAR or k == bottleneck.binding}


def _undecided(results: list, name: str) -> bool:
    """The item's last race, run from the current config (after the last keep), ended too noisy to tell with a
    ratio above the bar."""
    kept_at = max((k for k, r in enumerate(results) if r.kept), default=-1)
    last = max((k for k, r in enumerate(results) if r.name == name), default=-1)
    return last > kept_at and (held := results[last].withheld) is not None and held.kind == "undecided"


def walk_items(walk: Walk, items: list, skipped: dict, lr_checks: list) -> list:
    """Walk `items` (Item) along the bottleneck; returns the path: (config, Bottleneck or None) per reading.

    When nothing that answers the binding ceiling gains, the items not yet tried at all are tried once
    each (a reading can be wrong where two ceilings are close, and an item the user named is never
    left out silently); one kept there resumes the path."""
    for item in (i for i in items if i.stage == "first"):
        _try(walk, item, None, skipped, lr_checks)
    second: set = set()  # (item name, config) given a second look
    path, tried = [], set()

    def attempt(item, binding) -> bool:
        tried.add(item.name)
        return _try(walk, item, binding, skipped, lr_checks)

    # A new reading comes only after a keep, and every item answering it is raced at the config kept, those
    # rejected before included: a race run at the old config says nothing of the new (workers that could not
    # keep up with batch 16's steps feed batch 256's; held data that a host-bound batch 32 could not use pays
    # at 2048).
    while True:
        b = walk.bottleneck()
        binding = b.binding if b is not None else ""
        path.append((walk.current, b))
        answers = answering(b, items) if b is not None else []
        if any(attempt(i, binding) for i in answers):
            continue
        rest = [i for i in items if i.stage == "bottleneck" and i.name not in tried]
        if any(attempt(i, binding) for i in rest):
            continue
        # A second look, while the budget lasts, at the items whose race ended too noisy to tell with a
        # promising ratio: a passing load decides one race, rarely two. Once per item and config.
        looks = [i for i in items if i.stage == "bottleneck" and (i.name, walk.current) not in second
                 and _undecided(walk.results, i.name)]
        second.update((i.name, walk.current) for i in looks)
        if not any(attempt(i, binding) for i in looks):
            break  # nothing gained: the path ends here
    for item in (i for i in items if i.stage == "last"):
        _try(walk, item, None, skipped, lr_checks)
    return path


def _try(walk: Walk, item, binding: str | None, skipped: dict, lr_checks: list) -> bool:
    """Race one item's candidates against the current config; True when one was kept."""
    current = walk.current
    walk.race_base = float("nan")
    try:
        outcome = item.candidates(walk, current)
        about = item.reads(walk, current) if item.reads is not None and not isinstance(outcome, str) else ""
        if isinstance(outcome, list) and outcome and not isinstance(outcome[0], Tried):
            outcome = walk.race(outcome, ordered=item.ordered)
    except Exception as error:  # noqa: BLE001 - an item that fails is a row; the walk goes on
        walk.bench.restore()
        walk.results.append(ItemResult(item.name, [], walk.rate, walk.rate, False, "", note=trial.failed(error),
                                       bottleneck=binding or ""))
        return False
    if isinstance(outcome, str):
        if not any(r.name == item.name for r in walk.results):  # one raced before keeps its row, not a skip too
            skipped[item.name] = outcome
        return False
    tried = [t for t in outcome if t.samples_per_s is not None or t.note]
    if not tried:
        left = max(walk.left(), 0)
        skipped[item.name] = f"time budget: {left:.1f} s left" + (
            f"; its first round needs about {(len(outcome) + 1) * walk.block_cost_s():.1f} s" if left > 0 and outcome
            else "")
        return False
    skipped.pop(item.name, None)
    doing = "its verdict"
    try:
        result = _decide(walk, item, tried)
        chosen = next(t.config for t in tried if t.label == result.chosen) if result.kept else None
        if chosen is not None:
            doing = f"the learning-rate check of {result.chosen}"
            chosen = _handed_over(walk, chosen, current, lr_checks)
        if chosen is not None and not item.keep_regardless:  # faster per sample; as good per second? (quality.py)
            doing = f"the equal-time race of {result.chosen}"
            result, chosen = judged_by_learning(walk, tried, result, chosen, current,
                                                lambda config: _handed_over(walk, config, current, lr_checks))
    except Exception as error:  # noqa: BLE001 - a keep that cannot be checked is a row, never the walk's end
        walk.bench.restore()
        walk.results.append(ItemResult(item.name, tried, walk.rate, walk.rate, False, "",
                                       note=f"not kept: {doing} could not run ({trial.failed(error)})",
                                       bottleneck=binding or ""))
        return False
    result.bottleneck, result.about = binding or "", about
    walk.results.append(result)
    if result.kept:
        walk.current = chosen
        walk.rate = result.after
    return result.kept


def _handed_over(walk: Walk, config, current, lr_checks: list):
    """`config` as the walk would keep it: a scaled learning rate checked, and lowered where it diverges."""
    if config.scale_lr != "none" and config.lr_factor() != current.lr_factor():
        config, notes = walk.bench.checked_lr(config)  # the walk never hands over a diverging rate
        lr_checks += notes
    return config


def _decide(walk: Walk, item, tried: list) -> ItemResult:
    """The item's leading candidate and its verdict over the current config; kept when the paired
    interval lies above min_gain (an item kept regardless, asked for by the user, is kept without a gain;
    DDP, whose processes cannot alternate with the live model, on its interval measured apart)."""
    rate = walk.rate
    ran = [t for t in tried if t.samples_per_s and math.isfinite(t.verdict.ratio)]
    # The race's leader: a candidate still in it, else the one that stayed longest (its verdict rests on
    # the most pairs), then the higher ratio.
    best = max(ran, key=lambda t: (not t.left.startswith("left"), t.verdict.pairs, t.verdict.ratio), default=None)
    if best is None:
        note = none_ran([t.note for t in tried]) if not any(t.samples_per_s for t in tried) else \
            "no time left to measure the current config beside it"
        return ItemResult(item.name, tried, rate, rate, False, "", note=note)
    verdict = best.verdict
    if not best.config.changed_from(walk.current):  # one config against itself: an A/A race, never a gain
        verdict = dataclasses.replace(verdict, one_config=True)
    paired_enough = verdict.paired and verdict.pairs >= _ROUNDS[0]  # screens and two pairs only ever drop
    keep = item.keep_regardless or (verdict.above(walk.min_gain) and (paired_enough or best.apart))
    held = None if keep or best.apart else _why_undecided(walk, best)
    # Rates measured in this race (or trial), never carried over from earlier ones: the current config's beside
    # the candidates, and the kept candidate's own; no product of earlier ratios.
    before = walk.race_base if math.isfinite(walk.race_base) else rate
    return ItemResult(item.name, tried, before, best.samples_per_s if keep else before, keep,
                      best.label if keep else "", verdict, best.label, note=held.words if held else "",
                      withheld=held, apart=best.apart, current_rate=walk.race_base)


def _spread(rates) -> float:
    """Interquartile range over median of finite block rates (0.05: 5%)."""
    ok = [r for r in rates if math.isfinite(r)]
    if len(ok) < 2:
        return float("nan")
    q1, q2, q3 = np.percentile(ok, [25, 50, 75])
    return (q3 - q1) / q2 if q2 else float("nan")


def _why_undecided(walk: Walk, best: Tried) -> Withheld | None:
    """Why a leader whose interval straddles the bar stayed undecided (withheld.undecided decides; None where the
    verdict is clear), from the walk's last race: how it ended and how much each side's blocks varied."""
    race = getattr(walk, "last_race", None)
    if race is None:
        return None
    why = "the budget ended the race" if race.stopped_by == "budget" else f"{race.rounds} rounds did not settle it"
    return undecided(best.verdict, walk.min_gain, why, (_spread(race.base_rates), _spread(best.blocks)))


def run_walk(bench: Bench, *, budget_s: float, trial_s: float | None = None, min_gain: float = 0.03,
             items=ITEMS, target_global_batch: int | None = None, keep_best: bool = False,
             clock=time.monotonic, t0: float | None = None) -> ChecklistResult:
    """The walk on `bench` (bench.Bench: the live engine, or a simulated machine); see the module doc."""
    t0 = clock() if t0 is None else t0
    trial_s = trial_s or min(max(budget_s / 20, 0.5), 3.0)  # blocks are short: a race's pairs decide
    walk = Walk(bench, float(budget_s), trial_s, min_gain, clock, t0, target_global_batch)
    if walk.left() < 2 * _ROUNDS[0] * walk.block_cost_s():  # the least that can keep anything
        raise ToolRefusal(lambda spell: f"{spell('budget_s', budget_s)} left no time to measure the starting "
                                        f"config against one candidate for {_ROUNDS[0]} rounds; allow more "
                                        f"(e.g. {spell('budget_s', 30)})")
    skipped, lr_checks, finished = {}, [], False
    start = current = chosen = walk.start
    final, final_start, final_note, withdrawn, learned = None, float("nan"), "", "", None
    try:
        # The items leave room for the headline's own measurement, at the block and start-up costs seen so far.
        walk.held_back = lambda: head_to_head_reserve(walk)
        path = walk_items(walk, [REGISTRY[name] for name in ITEMS if name in items], skipped, lr_checks)
        walk.held_back = lambda: 0.0
        current = walk.current
        if current != start:  # the closing race runs from the start, on the reserve the items left it
            walk.current = start
            overrun = overrun_s(walk)
            walk.held_back = lambda: overrun
        final, final_start, final_note = head_to_head(walk, start, current)
        claims = any(r.kept and not REGISTRY[r.name].keep_regardless for r in walk.results)  # the walk's own keeps
        withdrawn, learned = backing(walk, start, current, final, final_note) if claims else ("", None)
        if withdrawn:  # the closing race backs everything kept, or nothing is (rule 11)
            chosen, current, lr_checks = current, start, []
        walk.current = start
        if not walk.start_rates:  # no item raced: the start is measured on its own
            walk.rate = float("nan")
            walk.ensure_rate()
        finished = True
    finally:
        bench.restore(current if keep_best and finished else None)
    if not walk.start_rates:
        raise ToolRefusal(lambda spell: f"{spell('budget_s', budget_s)} left no time to measure the starting "
                                        f"config; allow more (e.g. {spell('budget_s', 30)})")
    base = Tried("steady rate", start, float(np.median(walk.start_rates)), blocks=walk.start_rates)
    if final is not None:  # the start as the headline measured it, beside the walk's choice
        base = Tried("beside the walk's choice", start, final_start, blocks=walk.last_race.base_rates)
    lr_note = ""
    if current.scale_lr != "none":
        lr_note = (f"{current.scale_lr} rule: x{current.lr_factor():.3g} for global batch {current.global_batch_size} "
                   f"vs {current.base_batch_size}" + (f", linear warm-up over {current.warmup_steps} steps"
                                                      if current.warmup_steps else
                                                      "; add warmup_steps (linear warm-up) for large scale-ups"))
    if keep_best and finished and current.lr_factor() != start.lr_factor():
        lr_note += bench.schedule_note()
    lr_note = "; ".join(filter(None, [lr_note, steps_note(start, current, *bench.schedule_stepping())]))
    lr_note = "; ".join(filter(None, [lr_note] + lr_checks))
    return ChecklistResult(start_config=start, best_config=current, baseline=base.samples_per_s, items=walk.results,
                           skipped=list(skipped.items()), budget_s=float(budget_s), elapsed_s=clock() - t0,
                           trials=walk.trials, device=bench.device, lr_note=lr_note, kept_on_engine=keep_best,
                           blocks=walk.blocks, start=base, rounds=walk.rounds, path=path, head_to_head=final,
                           head_to_head_note=final_note, chosen_config=chosen if withdrawn else current,
                           withdrawn=withdrawn, learned=learned, min_gain=min_gain)
