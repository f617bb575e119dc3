"""What each of two configs learns in the same wall time: the reading behind a verdict on a change that alters what
is learned (rule 11), the walk's (walk/quality.py) and nbtrain.ab's.

A change of the global batch, a learning-rate rule, accumulation, precision, a warm-up or clipping can be faster per
sample and learn worse per second. Both sides train from the same weights on the same data for the same wall time,
in turn, and are scored on held-out data (tools/equal_time.py); `Quality` holds their losses, its paired verdict and
the horizon it speaks for (a higher rate can lose early and win later). A race in which neither side's held-out loss
left the starting weights' is too short to tell anything (`Quality.unlearned`), never "learns as well". Where each
side was also scored along the way (nbtrain.ab), `Reaching` is the time each took to reach the worse side's final
loss, round by round, each time known only to within the evaluations around it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .verdict import MIN_EFFECT, UNMEASURED, Verdict, paired

QUALITY_ROUNDS = 3  # pairs of equal-time trainings behind a verdict: the fewest a paired interval comes from
_OPTIONS = ("batch_size", "accumulate_grad_batches", "lr", "scale_lr", "base_batch_size", "warmup_steps",
            "precision", "gradient_clip_val")  # each changes the updates a step makes, or how many steps


def alters_learning(config, current) -> list:
    """The options of `config` that change what is learned from `current`'s (devices and nodes count where they
    change the global batch: more ranks at the same per-rank batch average more samples per step)."""
    changed = [name for name in config.changed_from(current) if name in _OPTIONS]
    if config.global_batch_size != current.global_batch_size and "batch_size" not in changed:
        changed.append("global batch")
    return changed


@dataclass
class Learned:
    """One side of one equal-time training: its score on held-out data, and what that data was."""
    loss: float
    held_out: str = "held-out"  # e.g. "held-out (val_data)" or what the bench scored on instead
    note: str = ""              # why no loss (it did not run)
    start: float = math.nan     # the same score of the weights it trained from (nan: not read)
    curve: tuple = ()           # ((training seconds, loss), ...) scored along the way; the last is `loss`'s


@dataclass
class Quality:
    """A candidate's losses against the current config's, each trained `seconds` from the same weights."""
    current: list = field(default_factory=list)
    candidate: list = field(default_factory=list)
    seconds: float = 0.0
    held_out: str = "held-out"
    note: str = ""  # why it was not measured
    longer: str = "a longer budget races a longer horizon"  # how the user lengthens the horizon
    start: float = math.nan  # the held-out loss of the weights both sides trained from (nan: not read)
    curves_current: list = field(default_factory=list)  # per round, where scored along the way: Learned.curve
    curves_candidate: list = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        """The current config's loss over the candidate's, paired by round (> 1: the candidate learns better)."""
        return paired(self.candidate, self.current) if self.current else UNMEASURED

    @property
    def measured(self) -> bool:
        return math.isfinite(self.verdict.low) and not self.unlearned

    @property
    def unlearned(self) -> bool:
        """Neither side's held-out loss fell below the starting weights' (by more than MIN_EFFECT) in any round: the
        race was too short to tell (a config that learns nothing and one that has not learned yet read alike)."""
        if not (math.isfinite(self.start) and self.start > 0 and self.current):
            return False  # the start unread: what the losses say is all there is
        bar = self.start * (1 - MIN_EFFECT)
        return not any(x < bar for x in self.current + self.candidate)

    @property
    def diverged(self) -> bool:
        """The candidate's held-out loss was not a number (or it failed) where the current config's always was."""
        return (any(not math.isfinite(x) for x in self.candidate) and bool(self.current)
                and all(math.isfinite(x) for x in self.current))

    @property
    def stalled(self) -> bool:
        """The candidate's held-out loss never fell below the starting weights' (by more than MIN_EFFECT) where the
        current config's did in every round: a config that learns nothing (a rate that killed its units) beside one
        that learns, however wide the paired interval of three rounds is."""
        if not (math.isfinite(self.start) and self.start > 0 and self.current):
            return False
        bar = self.start * (1 - MIN_EFFECT)
        return all(x < bar for x in self.current) and not any(x < bar for x in self.candidate)

    @property
    def worse(self) -> bool:
        """The candidate learns measurably worse in the same time, diverged where the current did not, or never left
        the start where the current always did."""
        if self.diverged or self.stalled:
            return True
        v = self.verdict
        return v.measurable and v.ratio < 1

    def horizon(self) -> str:
        n = len(self.current)
        return (f"{self.seconds:.2g} s of training each from the same weights, {n} time{'s' if n != 1 else ''}; "
                f"{self.longer}")

    def losses(self) -> str:
        cand, cur = np.median(self.candidate), np.median(self.current)
        return f"{self.held_out} {cand:.3g} vs {cur:.3g}"

    def text(self) -> str:
        if self.unlearned:
            return (f"too short to tell: neither side learned in {self.seconds:.2g} s ({self.losses()}, "
                    f"{self.start:.3g} before training; {self.longer})")
        if self.diverged and not self.unlearned:
            why = f" ({self.note})" if self.note else ""
            return (f"learns worse in the same time: its {self.held_out} loss was not a number{why} where the current "
                    f"config's was {np.median(self.current):.3g} ({self.horizon()})")
        if not self.measured:
            return f"what it learns was not measured: {self.note or 'too few equal-time races'}"
        v = self.verdict
        if self.stalled:
            head = (f"learns worse in the same time: it never got {MIN_EFFECT:.0%} below the starting weights' "
                    f"{self.start:.3g}, where the current config did every time")
        elif self.worse:
            head = "learns worse in the same time"
        elif v.measurable:
            head = "learns better in the same time"
        else:
            head = "learns as well in the same time (no measurable difference in loss)"
        return f"{head} ({self.losses()}; {self.horizon()})"

    def reaching(self) -> Reaching | None:
        """The time each side took to reach the worse side's final loss, where both were scored along the way."""
        pairs = list(zip(self.curves_current, self.curves_candidate))
        return reaching(pairs, self.start) if pairs and all(a and b for a, b in pairs) else None


def reached(curve, target: float, start: float = math.nan) -> tuple[float, float, float] | None:
    """(last time scored above `target`, first time at or below it, the crossing between them, linear in the loss)
    on `curve` ((seconds, loss), ...) from `start` at 0 s; None where it never reached `target`."""
    if math.isfinite(start) and start <= target:
        return 0.0, 0.0, 0.0  # there before training: the round says nothing of time
    before = (0.0, start)
    for t, loss in curve:
        if loss <= target:
            t0, loss0 = before
            if t0 == t:
                return t, t, t
            inside = (loss0 - target) / (loss0 - loss) if math.isfinite(loss0) and loss0 > loss else 0.5
            return t0, t, t0 + (t - t0) * inside
        before = (t, loss)
    return None


@dataclass
class Reaching:
    """Per round: the worse side's final loss (`targets`) and (low, high, crossing) seconds each side took to reach it;
    `verdict`: the current side's time over the candidate's (> 1: the candidate reaches it sooner), the median of the
    rounds' crossings, its interval the rounds' whole range with each time anywhere between its two evaluations. A
    side there by its first evaluation in a round (a low of 0 s) leaves that range open; `text` then says so in words
    and gives only the bound the brackets allow (`open_ratio`)."""
    targets: list
    current: list
    candidate: list
    verdict: Verdict

    @property
    def measurable(self) -> bool:
        """Every round's crossing, anywhere between its evaluations, on one side of 1 by more than MIN_EFFECT (an
        unbounded high: the candidate was there by its first evaluation; a low of 0: the current side was)."""
        v = self.verdict
        return v.low > 1 + MIN_EFFECT or v.high < 1 / (1 + MIN_EFFECT)

    def text(self, current: str = "A", candidate: str = "B") -> str:
        """'to held-out 0.52 (the worse side's final): A 0.93 s, B 0.41 s (...); B 2.3x sooner (1.6-3.2 ...)'."""
        v, n = self.verdict, len(self.targets)
        cur, cand = (np.median([c for _, _, c in side]) for side in (self.current, self.candidate))
        head = (f"to the worse side's final held-out {np.median(self.targets):.3g}: {current} {cur:.2g} s, "
                f"{candidate} {cand:.2g} s (medians of {n} round{'s' if n != 1 else ''})")
        if v.low <= 0 and not math.isfinite(v.high):
            return (f"{head}; no measurable difference in that time (each side was there by its first evaluation "
                    "in a round, so their times cannot be told apart)")
        if v.low <= 0 or not math.isfinite(v.high):  # one side there by its first evaluation: the ratio is open
            known = f"in {n} round{'s' if n != 1 else ''}: {_took(current, self.current)}, " \
                    f"{_took(candidate, self.candidate)}"
            way, words = open_ratio(v.low, v.high)
            return f"{head}; {candidate} {words} ({known})" if way else \
                f"{head}; no measurable difference in that time ({known}, {words})"
        known = " over the rounds, each time known to within its evaluations"
        if not self.measurable:
            return (f"{head}; no measurable difference in that time ({current}'s over {candidate}'s "
                    f"{_spread(v.low, v.high)}{known})")
        if v.low > 1:
            return f"{head}; {candidate} {v.ratio:.2g}x sooner ({_spread(v.low, v.high)}{known})"
        return f"{head}; {candidate} {1 / v.ratio:.2g}x later ({_spread(1 / v.high, 1 / v.low)}{known})"


def _spread(low: float, high: float) -> str:
    return f"{low:.2f}-{high:.2f}"


def open_ratio(low: float, high: float) -> tuple[int, str]:
    """Where a side was at the target by its first evaluation (its time anywhere from 0 to that evaluation's), the
    ratio of the other's time over its own, `low`-`high`, is open on one side (0 below, or no bound above). Sooner
    (1) or later (-1) only where the brackets part by more than MIN_EFFECT, by the bound they give ('at least 6x
    sooner'), else (0) 'so their times cannot be told apart' (and 'by more than 2%' where they part by less).
    ab's time to quality (Reaching.text) and compare's held-out in time (runs/held_out_time.py) read it alike."""
    if low > 1 + MIN_EFFECT:
        return 1, f"at least {low:.2g}x sooner"
    if high < 1 / (1 + MIN_EFFECT):
        return -1, f"at least {1 / high:.2g}x later"
    return 0, "so their times cannot be told apart" + ("" if low <= 1 <= high else f" by more than {MIN_EFFECT:.0%}")


def _took(who: str, brackets: list) -> str:
    """When `who` reached the target over ab's rounds ((low, high, crossing) seconds each): 'A took 3-4 s', 'B was
    there by its first evaluation each time (by 0.5 s)', 'B took up to 1 s, there by its first evaluation in 2 of
    them'."""
    low, high = min(b[0] for b in brackets), max(b[1] for b in brackets)
    first = sum(b[0] <= 0 for b in brackets)
    if not first:
        return f"{who} took {low:.2g}-{high:.2g} s"
    if len(brackets) == 1:
        return f"{who} was there by its first evaluation (at {high:.2g} s)"
    if first == len(brackets):
        return f"{who} was there by its first evaluation each time (by {high:.2g} s)"
    return f"{who} took up to {high:.2g} s, there by its first evaluation in {first} of them"


def reaching(pairs, start: float = math.nan) -> Reaching | None:
    """Reaching over rounds of (current's curve, candidate's curve); None where no round has both sides reach the
    worse final below the start (a diverged side, or neither moved)."""
    targets, current, candidate, ratios, lows, highs = [], [], [], [], [], []
    for cur, cand in pairs:
        finals = cur[-1][1], cand[-1][1]
        if not all(math.isfinite(x) for x in finals):
            continue
        target = max(finals)
        a, b = reached(cur, target, start), reached(cand, target, start)
        if a is None or b is None or a[2] <= 0 or b[2] <= 0:
            continue
        targets.append(target)
        current.append(a)
        candidate.append(b)
        ratios.append(a[2] / b[2])
        lows.append(a[0] / b[1])
        highs.append(a[1] / b[0] if b[0] > 0 else math.inf)
    if not ratios:
        return None
    verdict = Verdict(float(np.median(ratios)), min(lows), max(highs), len(ratios))
    return Reaching(targets, current, candidate, verdict)


def equal_time_rounds(quality, config, current, seconds: float, rounds: int = QUALITY_ROUNDS) -> Quality:
    """`config` against `current`, each trained `seconds` by `quality(config, seconds, current)` (a Bench's: from
    the same weights on the same data, scored on held-out data), `rounds` rounds with the order turning, so a load
    that drifts falls on both (the walk's race of what is learned, and nbtrain.ab's). A first round in which
    neither side learned ends it (Quality.unlearned: too short to tell; the caller may race a longer horizon)."""
    out = Quality(seconds=seconds)
    for round_ in range(rounds):
        sides = [(current, out.current, out.curves_current), (config, out.candidate, out.curves_candidate)]
        for which, losses, curves in sides[::-1] if round_ % 2 else sides:
            learned = quality(which, seconds, current)
            losses.append(learned.loss if not learned.note else float("nan"))
            curves.append(learned.curve if not learned.note else ())
            out.held_out = learned.held_out
            out.note = learned.note or out.note
            out.start = learned.start if math.isfinite(learned.start) else out.start
        if out.unlearned:
            break
    return out
