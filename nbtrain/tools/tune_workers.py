"""DataLoader worker search on the live model: each setting's steady rate, and a verdict against the start.

    w = nbtrain.tune.find_workers(recipe, config=cfg)
    print(w.table())   # each setting: steady samples/s (95% interval), vs the starting setting
    cfg = w.best       # the starting setting unless another is measurably faster, head to head

Each setting is trained for `seconds` in a trial (trial.borrow: the live engine is never reached). The
fastest is then measured against the starting setting in alternating blocks (tools/ab.py):
one trial each on a shared machine can differ by tens of percent with nothing changed, so the
search only moves off the starting setting when the head-to-head interval says it is faster.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .. import plotting
from . import trial
from ..config import TrainConfig
from ..hardware import usable_cores
from ..measure.ab import ABResult, steps_lasting
from ..measure.steady import NOTHING
from ..measure.verdict import UNMEASURED, unpaired
from .ab import compare_on, trial_rate
from .tool_options import declare, option


@dataclass
class WorkerSearch:
    measurements: list          # trial.Measurement per setting tried
    best: TrainConfig           # the fastest, when measurably faster than the start head to head; else the start
    baseline: float             # steady samples/s of the starting config
    steady: list = field(default_factory=list)   # SteadyRate per measurement
    versus: list = field(default_factory=list)   # unpaired Verdict of each measurement against the start's
    start: TrainConfig | None = None
    head_to_head: ABResult | None = None          # the fastest against the start, in alternating blocks

    @staticmethod
    def label(c: TrainConfig) -> str:
        text = f"num_workers={c.num_workers}"
        if c.num_workers:
            text += f", persistent_workers={c.persistent_workers}"
        return text + (f", pin_memory={c.pin}" if c.device_type == "cuda" else "")

    def table(self) -> str:
        lines = ["nbtrain DataLoader worker search (steady training samples/s, warm-up set apart, 95% interval; "
                 "each against the starting setting)"]
        for m, rate, v in zip(self.measurements, self.steady, self.versus):
            mark = "  <- best" if m.config == self.best else ""
            against = "start" if m.config == self.start else m.error or v.short() + ", measured apart"
            lines.append(f"  {self.label(m.config):<58} {rate.text(''):<34} {against}{mark}")
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        h = self.head_to_head
        if h is None:
            return "the starting setting is the fastest measured"
        words = h.verdict.text(f"head to head, {self.label(h.b)} against {self.label(h.a)}")
        return words + (f" [{h.verdict.pairs} pairs of blocks]; " +
                        ("use it" if self.best == h.b else "keeping the starting setting"))

    def plot(self, path=None, ax=None):
        labels = [self.label(m.config) for m in self.measurements]
        best = next(i for i, m in enumerate(self.measurements) if m.config == self.best)
        return plotting.bar_plot(labels, [r.rate for r in self.steady], "DataLoader worker search (steady samples/s)",
                         "samples/s", path, ax, best)


@declare("find_workers", "nbtrain.tune.find_workers", "DataLoader worker counts measured (steady rate, 95% "
         "interval); the fastest kept only when measurably faster than the start head to head", (
             option("candidates", "whole_list", "worker counts to try (default 0,1,2,4,... up to the cores)",
                    allowed="a list of whole numbers >= 0 (worker counts to try, e.g. 0,1,2)", flag="workers",
                    low=0, nullable=True),
             option("seconds", "number", "measuring time per worker setting", note="measuring time per setting",
                    above=0, flag="seconds", metavar="S", panel="s per worker setting"),
             option("warmup_steps", "whole", "steps not counted", note="steps not counted", low=0),
             option("clock", "function", "the clock", allowed="a function returning seconds, like time.monotonic")),
         label="Find workers", figsize=(7, 3))
def find_workers(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
                 candidates=None, seconds: float = 2.0, warmup_steps: int = 2, clock=time.monotonic,
                 **parts) -> WorkerSearch:
    """Measure training throughput for a few worker counts (the starting one always among them), then
    persistent workers (and pinning on CUDA); the fastest against the start head to head, for about
    4 x `seconds` on `clock`."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        return _search(lent, candidates, seconds, warmup_steps, clock)


def _search(lent, candidates, seconds: float, warmup_steps: int, clock) -> WorkerSearch:
    engine = lent.engine
    start = trial.plain_config(engine.config)
    if candidates is None:
        candidates = [n for n in (0, 1, 2, 4, 8, 16) if n <= usable_cores()]
    measured, rates, blocks = [], [], []

    def run(c: TrainConfig):
        try:
            m, rate, block = trial_rate(engine, c, seconds=seconds, warmup_steps=warmup_steps)
        except Exception as error:  # noqa: BLE001 - a setting the search chose that fails is a row
            if c == start:
                raise
            m, rate, block = trial.Measurement(c, float("nan"), 0, 0.0, status="failed", error=trial.failed(error)), \
                NOTHING, []
        finally:
            lent.reset()
        measured.append(m)
        rates.append(rate)
        blocks.append(block)

    def fastest() -> int:
        return max(range(len(rates)), key=lambda i: rates[i].rate if math.isfinite(rates[i].rate) else -math.inf)

    head_to_head = None
    for n in sorted(set(candidates) | {start.num_workers}):  # the start is what every setting is held against
        run(start if n == start.num_workers else
            start.replace(num_workers=n, persistent_workers=start.persistent_workers and n > 0,
                          prefetch_factor=start.prefetch_factor if n > 0 else None))
    top = measured[fastest()].config
    if top.num_workers:
        run(top.replace(persistent_workers=not top.persistent_workers))
    if top.device_type == "cuda":
        run(top.replace(pin_memory=not top.pin))
    i, s = fastest(), next(k for k, m in enumerate(measured) if m.config == start)
    if i != s:
        block_s = seconds / 2
        head_to_head = compare_on(engine, lent, start, measured[i].config, discard=False,
                                  block_steps=(steps_lasting(rates[s].rate, start, block_s),
                                               steps_lasting(rates[i].rate, measured[i].config, block_s)),
                                  min_pairs=3, max_pairs=8, budget_s=4 * seconds, clock=clock)
    s = next(k for k, m in enumerate(measured) if m.config == start)
    versus = [unpaired(blocks[s], b) if b else UNMEASURED for b in blocks]
    best = head_to_head.b if head_to_head is not None and head_to_head.verdict.faster else start
    return WorkerSearch(measured, best, rates[s].rate, rates, versus, start, head_to_head)
