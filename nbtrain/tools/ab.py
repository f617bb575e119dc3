"""A/B on the live model: two configs trained in alternating short blocks, then a verdict (nbtrain.ab).

    v = nbtrain.ab(model, train_data, loss_fn=..., a={}, b={"precision": "bf16-mixed"})
    print(v)          # "precision=bf16-mixed: 1.31x faster (95% interval 1.24-1.38)"

Each block trains for about a quarter second from the same saved state, on a trial's engine of its own
(tools/trial.borrow: the trial's weights, optimizer, RNG and position are put back after every block),
so neither config learns from the other's steps; the live engine is never reached and the user's model
is given back exactly as it was. Blocks alternate A B, B A, ... so a load that drifts on a shared machine
falls on both; pairs are added until the ratio's 95% interval is narrower than `precision_target` or the
time budget (measured by `clock`) ends. Its options are declared once (tool_options.declare), as every
tool's are; the result and its words are measure/ab.py's.
"""
from __future__ import annotations

import dataclasses
import math
import time

from ..config import TrainConfig
from ..engine import threads
from ..measure.ab import ABResult, describe_change, inherited_options, nonfinite_loss, steps_lasting
from ..measure.load import Meter, of_device
from ..measure.steady import block_rates, columns_series, steady_rate
from ..measure.verdict import UNMEASURED
from ..metrics import MetricsLog
from ..records import samples_start
from ..measure.learned import Quality, alters_learning, equal_time_rounds
from . import trial
from .equal_time import EqualTimeScorer
from .tool_options import ToolRefusal, declare, option

_SIZING_STEPS = 20  # the uncounted first block of each config, whose rate sizes the timed blocks
_EVALUATIONS = 8  # held-out scores along each side's equal-time training: the time to a loss is known to an eighth
_PART_S = 0.1  # ... of parts no shorter than this (a part must hold optimizer steps on a busy machine)


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


@declare("ab", "nbtrain.ab", "A/B on the live model: config B against config A in alternating short blocks, "
         "then a verdict with its 95% interval", (
             option("block_steps", "whole", "optimizer steps per block (default: blocks of block_s seconds)",
                    low=2, nullable=True, none="blocks of block_s seconds"),
             option("block_s", "number", "seconds per block", noun="a number of seconds", above=0),
             option("min_pairs", "whole", "fewest pairs of blocks", low=2),
             option("max_pairs", "whole", "most pairs of blocks", low=2),
             option("precision_target", "number", "the interval's half-width at which pairs stop being added",
                    noun="a fraction", above=0),
             option("budget_s", "number", "seconds the comparison may take", noun="a number of seconds", above=0),
             option("learn_s", "number", "seconds each side trains from the same weights in the race of what "
                    "is learned, run where B changes what is learned (default: four blocks; 0: not raced, and the "
                    "verdict says so)", noun="a number of seconds", low=0, nullable=True, none="four blocks' time"),
             option("clock", "function", "the budget's clock",
                    allowed="a function returning seconds, like time.monotonic")), magic=False)
def ab(model=None, train_data=None, *, a: dict | TrainConfig | None = None, b: dict | TrainConfig | None = None,
       recipe=None, config: TrainConfig | None = None, block_steps: int | None = None, block_s: float = 0.25,
       min_pairs: int = 4, max_pairs: int = 30, precision_target: float = 0.05, budget_s: float = 60.0,
       learn_s: float | None = None, clock=time.monotonic, **recipe_parts) -> ABResult:
    """Measure config B against config A on the live model; see the module doc.

    Blocks last about `block_s` seconds each (sized from a first, uncounted block of each config), or
    `block_steps` optimizer steps when given. Blocks of a fixed time, not of fixed steps: a block of a
    fast step lasting a few milliseconds sees a passing load on a shared machine all or nothing, and
    a handful of such blocks can agree by chance on a difference that is not there.

    Where B changes what is learned (a batch size, a learning rate or its rule, accumulation, precision, clipping:
    measure/learned.alters_learning), samples/s alone would call a change that learns worse per second a win (rule
    11): A and B then also train `learn_s` seconds each from the same weights on the same data, three times in
    turn, and are scored on held-out data (val_data, else a slice of the training data set aside), the walk's
    race (walk/quality.py); the verdict is then which learns better in the same time. Each side is also scored
    _EVALUATIONS times along the way, so the verdict gives the time each took to reach the worse side's final loss
    (measure/learned.Reaching). `learn_s=0` races nothing, and the verdict says what it learns was not measured.
    """
    with trial.borrow(model, train_data, recipe=recipe, config=config, **recipe_parts) as lent:
        base = trial.plain_config(lent.engine.config)
        config_a = a if isinstance(a, TrainConfig) else base.replace(**(a or {}))
        config_b = b if isinstance(b, TrainConfig) else base.replace(**(b or {}))
        with of_device(lent.engine.device) as load:
            result = compare_on(lent.engine, lent, config_a, config_b, block_steps=block_steps or _SIZING_STEPS,
                                block_s=None if block_steps else block_s, min_pairs=min_pairs,
                                max_pairs=max_pairs, precision_target=precision_target, budget_s=budget_s,
                                clock=clock)
        result = dataclasses.replace(result, load=load.last, live=base, inherited=inherited_options(base, a, b))
        if alters_learning(config_b, config_a):
            seconds = learn_s if learn_s is not None else 4 * (block_s if block_s and not block_steps
                                                               else _steps_seconds(result))
            result.learned = learned_in_equal_time(lent, config_a, config_b, seconds)
        return result


def _steps_seconds(result: ABResult) -> float:
    """Seconds a block of fixed steps lasted, from A's median rate (a quarter second where none was read)."""
    rates = sorted(r for r in result.rates_a if r > 0 and math.isfinite(r))
    if not rates:
        return 0.25
    a = result.a
    return result.block_steps[0] * a.batch_size * a.accumulate_grad_batches / rates[len(rates) // 2]


def learned_in_equal_time(lent, config_a: TrainConfig, config_b: TrainConfig, seconds: float) -> Quality:
    """B against A for what each learns in `seconds` of training from the trial's starting weights (measure/learned.py's
    race, each side scored by tools/equal_time.py _EVALUATIONS times along the way; the trial's engine is put back
    after each); `seconds` 0: not raced."""
    if seconds <= 0:
        return Quality(note="not raced (learn_s=0)", longer="learn_s= lengthens it")
    scorer, parts = EqualTimeScorer(lent), max(1, min(_EVALUATIONS, int(seconds / _PART_S)))
    quality = equal_time_rounds(lambda config, s, current: scorer.quality(config, s, current, parts),
                                config_b, config_a, seconds)
    quality.longer = "learn_s= lengthens it"
    return quality


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
                    with threads.held(configs[i].num_threads):  # the block's load records its thread count
                        meter = Meter()  # each block's load: a pair whose blocks ran under unlike loads is set aside
                        rate = block_rate(engine, configs[i], steps[i], sides[i])
                        (result.loads_a if i == 0 else result.loads_b).append(meter.reading())
                    lent.reset()
                    (result.rates_a if i == 0 else result.rates_b).append(rate)
                result.verdict = result.judged()
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
