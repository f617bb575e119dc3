"""A/B's numbers: the result of two configs measured in alternation, and the words for what B changes.

    v = nbtrain.ab(model, train_data, loss_fn=..., a={}, b={"precision": "bf16-mixed"})
    print(v)          # "precision=bf16-mixed: 1.31x faster (95% interval 1.24-1.38)"
                      # or "... no measurable difference (0.97-1.04)"

The measurement (blocks alternated in a trial on the live model) is the tool's: tools/ab.py. This module
holds what it yields: ABResult (the verdict, the block rates, how the comparison stopped), the words for a
change ('precision=bf16-mixed'), a block's length in steps from a rate, and a diverged loss found in a log.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..format import PrintsAsTable
from ..metrics import MetricsLog
from .load import Load
from .verdict import Verdict, paired
from .withheld import comparable_pairs, set_aside


@dataclass
class ABResult(PrintsAsTable):
    a: TrainConfig
    b: TrainConfig
    verdict: Verdict
    rates_a: list = field(default_factory=list)
    rates_b: list = field(default_factory=list)
    seconds: float = 0.0
    stopped_by: str = ""     # "interval" | "budget" | "max_pairs"
    block_steps: tuple = ()  # optimizer steps in each of A's and B's blocks
    load: Load | None = None  # other processes' share of the machine while the blocks ran
    loads_a: list = field(default_factory=list)  # each block's Load, beside rates_a and rates_b
    loads_b: list = field(default_factory=list)
    live: TrainConfig | None = None  # the live config a and b were resolved from, when they were
    inherited: dict = field(default_factory=dict)  # options b gives at the live value that a left to it
    learned: object = None  # measure/learned.Quality where B changes what is learned: held-out loss at equal time

    def learning(self) -> str:
        """'batch_size=128: learns worse in the same time (held-out 3.0 vs 2.8; ...); to the worse side's final
        held-out 3.0: A 0.4 s, B 1 s (...); B 2.5x later (...); in samples/s ...' where B changes what is learned: its
        verdict (rule 11) before its samples/s, which alone would call it a win."""
        if self.learned is None:
            return self.verdict.text(self.label)
        reaching = self.learned.reaching() if self.learned.measured else None
        soon = f"; {reaching.text()}" if reaching is not None else ""  # the time each took to the worse final loss
        return f"{self.label}: {self.learned.text()}{soon}; in samples/s {self.verdict.text()}"

    @property
    def label(self) -> str:
        return describe_change(self.a, self.b)

    @property
    def same(self) -> bool:
        """a and b resolved to one config: what it measures is an A/A check, never a speed difference."""
        return not self.b.changed_from(self.a)

    def comparable(self) -> list[bool]:
        """Per pair: whether its two blocks ran under loads alike enough to compare (withheld.comparable_pairs)."""
        return comparable_pairs(self.rates_a, self.rates_b, self.loads_a, self.loads_b) if self.loads_a \
            else [True] * min(len(self.rates_a), len(self.rates_b))

    def judged(self) -> Verdict:
        """The verdict of the pairs whose blocks ran under alike loads; an A/A check never says faster or slower."""
        keep = self.comparable()
        rates = [[r for r, k in zip(side, keep) if k] for side in (self.rates_a, self.rates_b)]
        return dataclasses.replace(paired(*rates), one_config=self.same)

    def sides(self) -> str:
        """What each side is, as changes from the live config ('A: the live config with batch_size=128')."""
        if self.live is None:
            return ""
        if self.same:
            return f"a and b are both {describe_side(self.live, self.a)}"
        return f"A: {describe_side(self.live, self.a)}; B: {describe_side(self.live, self.b)}"

    def table(self) -> str:
        """One line: B against A, its verdict and how it was measured (a head to head's whole table)."""
        allowed = ": all the budget allowed" if self.stopped_by == "budget" and self.verdict.too_few_pairs else ""
        aside = f"; {held.words}" if (held := set_aside(self.comparable())) else ""  # pairs left out of the verdict
        tail = f" [{self.verdict.pairs} pairs of blocks, {self.seconds:.0f} s{allowed}" + aside \
            + (self.load.beside() if self.load else "") + "]"
        if not self.same:
            sides = self.sides()
            return self.learning() + (f" ({sides})" if sides else "") + tail
        inherits = ", ".join(f"{name}={value}" for name, value in self.inherited.items())
        hint = (f"; a inherits {inherits} from the live config: give it in a to measure another value"
                if inherits else "")
        return self.verdict.text(self.sides() or "a and b are one config") + hint + tail

    text = table  # the name notebooks 02, 06 and 07 print it by

    def __repr__(self) -> str:
        return f"ABResult({self.table()})"


def describe_change(a: TrainConfig, b: TrainConfig) -> str:
    """What B changes from A, as option=value words ('precision=bf16-mixed, batch_size=256')."""
    changes = b.changed_from(a)
    return ", ".join(f"{name}={new}" for name, (_, new) in changes.items()) or "the same config"


def describe_side(live: TrainConfig, config: TrainConfig) -> str:
    """One side of a comparison as changes from the live config: 'the live config with batch_size=128'."""
    changes = describe_change(live, config)
    return "the live config" if changes == "the same config" else f"the live config with {changes}"


def inherited_options(live: TrainConfig, a, b) -> dict:
    """Options b gives at the live config's value that a leaves to the live config: a inherits them, so
    they change nothing between the sides (after fit(precision='bf16-mixed'), b={'precision':
    'bf16-mixed'} against a={} compares bf16 with bf16)."""
    if not isinstance(b, dict) or isinstance(a, TrainConfig):
        return {}
    return {name: value for name, value in b.items()
            if name not in (a or {}) and getattr(live, name, None) == value}


def nonfinite_loss(log: MetricsLog) -> str:
    """'the loss became nan at step 12' where a trial's loss was NaN or infinite (whatever
    on_nonfinite_loss says: a diverged run's steps time NaN arithmetic, not the config), else ''."""
    cols = log.columns
    bad = next(((s, v) for s, v in zip(cols["step"], cols["loss"]) if not math.isfinite(v)), None)
    return "" if bad is None else f"the loss became {bad[1]} at step {int(bad[0])}"


def steps_lasting(rate: float, config: TrainConfig, seconds: float, low: int = 6, high: int = 2000) -> int:
    """Optimizer steps of `config` that take about `seconds` at `rate` samples/s (within [low, high])."""
    if not (rate > 0 and math.isfinite(rate)):
        return low
    per_step = config.batch_size * config.accumulate_grad_batches
    return int(min(max(round(rate * seconds / per_step), low), high))
