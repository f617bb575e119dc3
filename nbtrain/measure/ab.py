"""A/B on the live model: two configs trained in alternating short blocks, then a verdict.

    v = nbtrain.ab(model, train_data, loss_fn=..., a={}, b={"precision": "bf16-mixed"})
    print(v)          # "precision=bf16-mixed: 1.31x faster (95% interval 1.24-1.38)"
                      # or "... no measurable difference (0.97-1.04)"

Each block trains for about a quarter second from the same saved state, on a trial's engine of its own
(tools/trial.borrow: the trial's weights, optimizer, RNG and position are put back after every block),
so neither config learns from the other's steps; the live engine is never reached and the user's model
is given back exactly as it was. Blocks alternate A B, B A, ... so a
load that drifts on a shared machine falls on both; pairs are added until the ratio's 95%
interval is narrower than `precision_target` or the time budget (measured by `clock`) ends.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from ..tools import trial
from ..tools.tool_options import ToolRefusal
from ..config import TrainConfig
from ..format import PrintsAsTable
from ..metrics import MetricsLog
from ..records import samples_start
from .load import Load, of_device
from .steady import block_rates, columns_series, steady_rate
from .verdict import UNMEASURED, Verdict, paired


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
    live: TrainConfig | None = None  # the live config a and b were resolved from, when they were
    inherited: dict = field(default_factory=dict)  # options b gives at the live value that a left to it

    @property
    def label(self) -> str:
        return describe_change(self.a, self.b)

    @property
    def same(self) -> bool:
        """a and b resolved to one config: what it measures is an A/A check, never a speed difference."""
        return not self.b.changed_from(self.a)

    def sides(self) -> str:
        """What each side is, as changes from the live config ('A: the live config with batch_size=128')."""
        if self.live is None:
            return ""
        if self.same:
            return f"a and b are both {describe_side(self.live, self.a)}"
        return f"A: {describe_side(self.live, self.a)}; B: {describe_side(self.live, self.b)}"

    def table(self) -> str:
        """One line: B against A, its verdict and how it was measured (a head to head's whole table)."""
        tail = f" [{self.verdict.pairs} pairs of blocks, {self.seconds:.0f} s" \
            + (self.load.beside() if self.load else "") + "]"
        if not self.same:
            sides = self.sides()
            return self.verdict.text(self.label) + (f" ({sides})" if sides else "") + tail
        inherits = ", ".join(f"{name}={value}" for name, value in self.inherited.items())
        hint = (f"; a inherits {inherits} from the live config: give it in a to measure another value"
                if inherits else "")
        return self.verdict.text(self.sides() or "a and b are one config") + hint + tail

    text = table  # the name notebooks 02, 06 and 07 print it by

    def __repr__(self) -> str:
        return f"ABResult({self.table()})"


_SIZING_STEPS = 20  # the uncounted first block of each config, whose rate sizes the timed blocks


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


def trial_rate(engine, config: TrainConfig, *, steps: int | None = None, seconds: float | None = None,
               **options):
    """(trial.Measurement, SteadyRate, block rates) of one trial of `config` (the caller restores state).

    The steady rate sets the trial's own warm-up apart; the block rates are what an unpaired
    verdict against another trial resamples. `options` go to trial.measure.
    """
    log = MetricsLog()
    m = trial.measure(engine, config, steps=steps, seconds=seconds, log=log, **options)
    if not m.error and (diverged := nonfinite_loss(log)):  # a diverged block's rate is no speed of the config
        m = dataclasses.replace(m, error=diverged, diverged=True)
    durations, samples = columns_series(log.columns, samples_start(log))
    if durations:  # a block ends when the device has done its last step (CUDA), not when the host queued it
        durations[-1] += m.device_tail_s
    return m, steady_rate(durations, samples), block_rates(durations, samples)


def nonfinite_loss(log: MetricsLog) -> str:
    """'the loss became nan at step 12' where a trial's loss was NaN or infinite (whatever
    on_nonfinite_loss says: a diverged run's steps time NaN arithmetic, not the config), else ''."""
    cols = log.columns
    bad = next(((s, v) for s, v in zip(cols["step"], cols["loss"]) if not math.isfinite(v)), None)
    return "" if bad is None else f"the loss became {bad[1]} at step {int(bad[0])}"


def block_rate(engine, config: TrainConfig, steps: int, side: str = "") -> float:
    """Steady samples/s of `steps` steps of `config` on the engine (the caller restores state).

    A block whose loss diverged ends the comparison (ToolRefusal naming `side` and why): its rate
    would be a speed-up of NaN arithmetic, not of the config."""
    m, steady, _ = trial_rate(engine, config, steps=steps)
    if m.diverged:
        raise diverged_refusal(side or "a block", m.error)
    return steady.rate


def diverged_refusal(who: str, why: str) -> ToolRefusal:
    """The verdict of a tool whose reference config's loss diverged while it was timed."""
    return ToolRefusal(lambda spell: f"{who}: {why} in a timed block, so no speed is compared; lower the "
                                     f"learning rate or check the data, then measure again")


def steps_lasting(rate: float, config: TrainConfig, seconds: float, low: int = 6, high: int = 2000) -> int:
    """Optimizer steps of `config` that take about `seconds` at `rate` samples/s (within [low, high])."""
    if not (rate > 0 and math.isfinite(rate)):
        return low
    per_step = config.batch_size * config.accumulate_grad_batches
    return int(min(max(round(rate * seconds / per_step), low), high))


def ab(model=None, train_data=None, *, a: dict | TrainConfig | None = None, b: dict | TrainConfig | None = None,
       recipe=None, config: TrainConfig | None = None, block_steps: int | None = None, block_s: float = 0.25,
       min_pairs: int = 4, max_pairs: int = 30, precision_target: float = 0.05, budget_s: float = 60.0,
       clock=time.monotonic, **recipe_parts) -> ABResult:
    """Measure config B against config A on the live model; see the module doc.

    Blocks last about `block_s` seconds each (sized from a first, uncounted block of each config), or
    `block_steps` optimizer steps when given. Blocks of a fixed time, not of fixed steps: a block of a
    fast step lasting a few milliseconds sees a passing load on a shared machine all or nothing, and
    a handful of such blocks can agree by chance on a difference that is not there.
    """
    wholes = [("min_pairs", min_pairs, 2), ("max_pairs", max_pairs, 2)]
    for name, value, low in wholes + ([("block_steps", block_steps, 2)] if block_steps is not None else []):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r}: a whole number >= {low}")
    for name, value in (("budget_s", budget_s), ("block_s", block_s)):
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name}={value!r}: a number of seconds > 0")
    with trial.borrow(model, train_data, recipe=recipe, config=config, **recipe_parts) as lent:
        base = trial.plain_config(lent.engine.config)
        config_a = a if isinstance(a, TrainConfig) else base.replace(**(a or {}))
        config_b = b if isinstance(b, TrainConfig) else base.replace(**(b or {}))
        with of_device(lent.engine.device) as load:
            result = compare_on(lent.engine, lent, config_a, config_b, block_steps=block_steps or _SIZING_STEPS,
                                block_s=None if block_steps else block_s, min_pairs=min_pairs,
                                max_pairs=max_pairs, precision_target=precision_target, budget_s=budget_s,
                                clock=clock)
        return dataclasses.replace(result, load=load.last, live=base, inherited=inherited_options(base, a, b))


def compare_on(engine, lent, config_a: TrainConfig, config_b: TrainConfig, *, block_steps=20,
               block_s: float | None = None, discard: bool = True, min_pairs: int = 4, max_pairs: int = 30,
               precision_target: float = 0.05, budget_s: float = 60.0, clock=time.monotonic) -> ABResult:
    """The alternating A/B loop on a trial's engine, which `lent.reset()` puts back after every block.

    `block_steps`: steps per block, one number or (A's, B's). `discard`: one block of each first,
    not counted (loader start-up, compile, caches; a caller that has just measured both may skip
    it); with `block_s`, those blocks' rates also size each config's blocks to about `block_s`
    seconds. The budget is read on `clock`.

    A and B that are one config are still measured, as an A/A check: its verdict is never faster or
    slower (what its pairs differ by is this machine's noise between blocks, shown as that), and a user
    who meant two configs is told what each side resolved to (ABResult.text).
    """
    steps = dict(zip((0, 1), block_steps if isinstance(block_steps, (tuple, list)) else (block_steps,) * 2))
    configs = (config_a, config_b)
    sides = ("config A", f"config B ({describe_change(config_a, config_b)})")
    start = clock()
    result = ABResult(config_a, config_b, UNMEASURED)
    # Each config's DataLoader workers stay up from block to block (Engine.keeping_workers): restarted in
    # every block, their start-up fell inside the timed steps, and two workers read as no faster than none.
    try:
        with engine.keeping_workers():
            if discard:
                for i in (0, 1):
                    rate = block_rate(engine, configs[i], steps[i], sides[i])
                    lent.reset()
                    if block_s is not None:
                        steps[i] = steps_lasting(rate, configs[i], block_s)
            result.block_steps = (steps[0], steps[1])
            while True:
                order = (0, 1) if len(result.rates_a) % 2 == 0 else (1, 0)
                for i in order:
                    rate = block_rate(engine, configs[i], steps[i], sides[i])
                    lent.reset()
                    (result.rates_a if i == 0 else result.rates_b).append(rate)
                result.verdict = dataclasses.replace(paired(result.rates_a, result.rates_b),
                                                     one_config=result.same)
                pairs, v = len(result.rates_a), result.verdict
                if pairs >= min_pairs and math.isfinite(v.low) and v.high / v.low <= 1 + 2 * precision_target:
                    result.stopped_by = "interval"
                elif clock() - start >= budget_s and pairs >= 2:
                    result.stopped_by = "budget"
                elif pairs >= max_pairs:
                    result.stopped_by = "max_pairs"
                if result.stopped_by:
                    break
    finally:
        result.seconds = clock() - start
    return result
