"""A race: several candidate configs against the current one, in rounds of short alternating blocks.

Comparing candidates one by one (a screening trial each, then the fastest head to head) measures
the current config again for every comparison and spends a whole trial on candidates that one
block already shows to be slower. A race measures each round the current config and every
candidate still in it, one short block each (their order turns from round to round), so every
candidate's block has a block of the current config beside it: the pairs give each candidate's
ratio and its 95% interval as the race goes, and the current config's blocks are shared by all.

After each round a candidate leaves the race when its ratio, from the pairs so far (or, before
there are enough pairs, from the sub-blocks of its blocks against the current config's), lies
wholly below 1 + `decide_at` (it would not be kept), or wholly below the leader's, or when, from
enough pairs, its ratio itself is below 1 + `decide_at` (more rounds would only narrow the
interval around a gain too small to keep), or it is a small gain (under twice `decide_at`) whose
interval, at the spread of its pairs so far, would not clear 1 + `decide_at` by `max_rounds`. The
race ends
when the leader's interval settles the keep-or-not question, is narrow enough to call "no
measurable difference", when no candidate is left, at `max_rounds`, or when the next round
would not fit the budget. Screens only ever drop a candidate: keeping one takes the paired
interval of at least `min_rounds` pairs.

The race knows nothing of engines: `measure(config)` trains one block and puts the state back,
returning a `Block`; the checklist walk passes one that trains on the live model.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.special import stdtrit

from .verdict import UNMEASURED, Verdict, paired, unpaired

_PAIRED_FROM = 3  # pairs from which the paired interval alone judges a candidate (before: a screen too)


@dataclass
class Block:
    """One block's steady samples/s, its sub-block rates (for a screen before pairs exist), or why it failed."""
    rate: float
    parts: list = field(default_factory=list)
    note: str = ""


@dataclass
class Entrant:
    label: str
    config: object
    rates: list = field(default_factory=list)   # one per round: nan for rounds it was out of the race
    parts: list = field(default_factory=list)   # every sub-block rate of its blocks
    note: str = ""                              # why it failed to run (out of memory, over budget, ...)
    left_at: int = 0                            # the round after which it left the race (0: still in)
    why_left: str = ""
    verdict: Verdict = UNMEASURED               # over the current config, from the pairs (or the screen)

    @property
    def running(self) -> bool:
        return not self.note and not self.left_at

    @property
    def rate(self) -> float | None:
        ok = [r for r in self.rates if math.isfinite(r)]
        return float(np.median(ok)) if ok and not self.note else None


@dataclass
class RaceResult:
    base_rates: list
    entrants: list
    rounds: int = 0
    blocks: int = 0
    seconds: float = 0.0
    stopped_by: str = ""   # "settled" | "interval" | "none left" | "max_rounds" | "budget"

    @property
    def base_rate(self) -> float:
        ok = [r for r in self.base_rates if math.isfinite(r)]
        return float(np.median(ok)) if ok else float("nan")

    def leader(self) -> Entrant | None:
        """The candidate with the highest ratio over the current config, preferring one still in the race."""
        ran = [e for e in self.entrants if not e.note and math.isfinite(e.verdict.ratio)]
        running = [e for e in ran if e.running]
        return max(running or ran, key=lambda e: e.verdict.ratio, default=None)


def race(measure, base, entrants: list, *, decide_at: float = 0.03, min_rounds: int = 3, max_rounds: int = 8,
         precision_target: float = 0.03, budget_s: float = 60.0, block_cost_s: float = 0.0,
         ordered: bool = False, clock=time.monotonic) -> RaceResult:
    """Race `entrants` (Entrant, each with its config) against `base`; see the module docstring.

    `block_cost_s`: the expected time of one block with its overhead, so a round is only started
    when it fits the budget (the first round always runs). `ordered`: the entrants are in rising
    size (batches), so one that fails to run takes the larger ones after it out as well.
    """
    start = clock()
    result = RaceResult([], list(entrants))
    base_parts: list[list] = []
    try:
        while True:
            running = [e for e in result.entrants if e.running]
            if not running:
                result.stopped_by = "none left"
                break
            order = [None] + running
            shift = result.rounds % len(order)  # the order turns each round, so drift falls on every config alike
            order = order[shift:] + order[:shift]
            if result.rounds and clock() - start + len(order) * block_cost_s > budget_s:
                result.stopped_by = "budget"
                break
            measured = {}
            for entrant in order:
                if entrant is not None and entrant.note:
                    continue  # taken out this round by a smaller one that did not run
                block = measure(base if entrant is None else entrant.config)
                result.blocks += 1
                measured[id(entrant)] = block
                if entrant is not None and block.note:
                    _fail(result.entrants, entrant, block.note, ordered)
            base_block = measured[id(None)]
            result.base_rates.append(base_block.rate if not base_block.note else float("nan"))
            base_parts.append(base_block.parts)
            for entrant in result.entrants:
                block = measured.get(id(entrant))
                entrant.rates.append(block.rate if block is not None and not block.note else float("nan"))
                if block is not None and not block.note:
                    entrant.parts.extend(block.parts)
            result.rounds += 1
            _judge(result, base_parts, decide_at, max_rounds)
            leader = result.leader()
            if leader is None or not leader.running:
                result.stopped_by = "none left"
                break
            v = leader.verdict
            if result.rounds >= min_rounds and v.paired and math.isfinite(v.low):
                if v.low > 1 + decide_at or v.high < 1 + decide_at:
                    result.stopped_by = "settled"
                    break
                if v.high / v.low <= 1 + 2 * precision_target:
                    result.stopped_by = "interval"
                    break
            if result.rounds >= max_rounds:
                result.stopped_by = "max_rounds"
                break
    finally:
        result.seconds = clock() - start
    return result


def _fail(entrants: list, entrant: Entrant, note: str, ordered: bool) -> None:
    entrant.note = note
    if ordered:  # a larger batch than one that did not fit will not fit either
        for later in entrants[entrants.index(entrant) + 1:]:
            if not later.note:
                later.note = f"not tried: {entrant.label} did not run ({note})"


def _futility(e: Entrant, decide_at: float, max_rounds: int) -> str:
    """Why more rounds are futile for it (empty: they are not), from at least _PAIRED_FROM pairs: its ratio
    so far is itself below 1 + decide_at (more rounds would narrow the interval around a gain too small to
    keep), or it is a small gain (below 1 + 2 * decide_at) whose interval, at the spread of its pairs so
    far, would still reach below 1 + decide_at at the last round. A wide interval around a large ratio is
    not futile: more rounds are what it needs."""
    v = e.verdict
    if not (v.paired and v.pairs >= _PAIRED_FROM and math.isfinite(v.low) and v.low <= 1 + decide_at):
        return ""
    if v.ratio <= 1 + decide_at:
        return "its ratio so far is below a gain worth keeping"
    if v.ratio > 1 + 2 * decide_at or v.pairs >= max_rounds:
        return ""
    # The t-interval's half-width (on the log scale) shrinks as t(n-1)/sqrt(n) with the pairs' spread held.
    half_now = math.log(v.ratio / v.low)
    n = v.pairs
    half_last = half_now * (stdtrit(max_rounds - 1, 0.975) / math.sqrt(max_rounds)) \
        / (stdtrit(n - 1, 0.975) / math.sqrt(n))
    if math.log(v.ratio) - half_last <= math.log(1 + decide_at):
        return f"a small gain that {max_rounds} rounds would not show"
    return ""


def _judge(result: RaceResult, base_parts: list, decide_at: float, max_rounds: int) -> None:
    """Each running candidate's verdict over the current config; drop those that cannot be kept."""
    base = np.asarray(result.base_rates)
    for e in result.entrants:
        if e.note or e.left_at:
            continue
        rounds = [i for i, r in enumerate(e.rates) if math.isfinite(r) and math.isfinite(base[i])]
        pairs = paired(base[rounds], np.asarray(e.rates)[rounds])
        if len(rounds) >= _PAIRED_FROM:
            e.verdict = pairs
            continue
        # Too few pairs for a useful interval: the sub-blocks of the same rounds screen it; from two
        # pairs on, the pairs' own (wide) interval may already say more, so the narrower one is used.
        screen = unpaired([p for i in rounds for p in base_parts[i]], e.parts)
        # One estimator for the ratio and its interval: the screen's own ratio where it has an interval (the
        # pairs' ratio beside the screen's interval printed "1.05x (0.81-0.87)", outside its own interval).
        ratio = screen.ratio if math.isfinite(screen.low) else pairs.ratio
        e.verdict = Verdict(ratio, screen.low, screen.high, len(rounds), paired=False)
        if len(rounds) == 2 and math.isfinite(pairs.low) and not (
                math.isfinite(screen.low) and screen.high / screen.low < pairs.high / pairs.low):
            e.verdict = pairs
    for e in result.entrants:
        if e.running and math.isfinite(e.verdict.high) and e.verdict.high < 1 + decide_at:
            e.left_at, e.why_left = result.rounds, "below a gain worth keeping"
        elif e.running and (futile := _futility(e, decide_at, max_rounds)):
            e.left_at, e.why_left = result.rounds, futile
    leader = result.leader()
    if leader is None or not leader.running:
        return
    for e in result.entrants:
        if e is leader or not e.running:
            continue
        against = paired(leader.rates, e.rates)  # over the rounds both ran
        if against.pairs < _PAIRED_FROM:
            against = unpaired(leader.parts, e.parts)
        if math.isfinite(against.high) and against.high < 1:
            e.left_at, e.why_left = result.rounds, f"slower than {leader.label}"

