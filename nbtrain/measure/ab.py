"""A/B on the live model: two configs trained in alternating short blocks, then a verdict.

    v = nbtrain.ab(model, train_data, loss_fn=..., a={}, b={"precision": "bf16-mixed"})
    print(v.text())   # "precision=bf16-mixed: 1.31x faster (95% interval 1.24-1.38)"
                      # or "... no measurable difference (0.97-1.04)"

Each block trains a few steps from the same saved state (a trial: weights, optimizer, RNG
and position are put back after every block), so neither config learns from the other's
steps, and the user's model ends exactly as it was. Blocks alternate A B, B A, ... so a
load that drifts on a shared machine falls on both; pairs are added until the ratio's 95%
interval is narrower than `precision_target` or the time budget (measured by `clock`) ends.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .. import trial
from ..config import TrainConfig
from ..metrics import MetricsLog
from .steady import columns_series, steady_rate
from .verdict import UNMEASURED, Verdict, paired


@dataclass
class ABResult:
    a: TrainConfig
    b: TrainConfig
    verdict: Verdict
    rates_a: list = field(default_factory=list)
    rates_b: list = field(default_factory=list)
    seconds: float = 0.0
    stopped_by: str = ""     # "interval" | "budget" | "max_pairs"

    @property
    def label(self) -> str:
        return describe_change(self.a, self.b)

    def text(self) -> str:
        return self.verdict.text(self.label) + f" [{self.verdict.pairs} pairs of blocks, {self.seconds:.0f} s]"

    def __repr__(self) -> str:
        return f"ABResult({self.text()})"


def describe_change(a: TrainConfig, b: TrainConfig) -> str:
    """What B changes from A, as option=value words ('precision=bf16-mixed, batch_size=256')."""
    changes = b.changed_from(a)
    return ", ".join(f"{name}={new}" for name, (_, new) in changes.items()) or "the same config"


def block_rate(engine, config: TrainConfig, steps: int) -> float:
    """Steady samples/s of `steps` steps of `config` on the engine (the caller restores state)."""
    log = MetricsLog()
    trial.measure(engine, config, steps=steps, log=log)
    start = log.last("start")
    rate = steady_rate(*columns_series(log.columns, start["info"].get("samples_start", 0) if start else 0))
    return rate.rate


def ab(model=None, train_data=None, *, a: dict | TrainConfig | None = None, b: dict | TrainConfig | None = None,
       recipe=None, config: TrainConfig | None = None, block_steps: int = 20, min_pairs: int = 4,
       max_pairs: int = 30, precision_target: float = 0.05, budget_s: float = 60.0, clock=time.monotonic,
       **recipe_parts) -> ABResult:
    """Measure config B against config A on the live model; see the module doc."""
    for name, value, low in (("block_steps", block_steps, 2), ("min_pairs", min_pairs, 2), ("max_pairs", max_pairs, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r}: a whole number >= {low}")
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s={budget_s!r}: a number of seconds > 0")
    engine = trial.resolve(model, train_data, recipe=recipe, config=config, **recipe_parts)
    base = trial.plain_config(config or engine.config)
    config_a = a if isinstance(a, TrainConfig) else base.replace(**(a or {}))
    config_b = b if isinstance(b, TrainConfig) else base.replace(**(b or {}))
    snapshot = trial.Snapshot(engine)
    start = clock()
    result = ABResult(config_a, config_b, UNMEASURED)
    try:
        for config_x in (config_a, config_b):  # one discarded block each: loader start-up, compile, caches
            block_rate(engine, config_x, block_steps)
            snapshot.restore()
        while True:
            order = (config_a, config_b) if len(result.rates_a) % 2 == 0 else (config_b, config_a)
            for config_x in order:
                rate = block_rate(engine, config_x, block_steps)
                snapshot.restore()
                (result.rates_a if config_x is config_a else result.rates_b).append(rate)
            result.verdict = paired(result.rates_a, result.rates_b)
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
        snapshot.restore()
        result.seconds = clock() - start
    return result
