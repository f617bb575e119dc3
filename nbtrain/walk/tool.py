"""The walk as a checklist tool: `nbtrain.checklist`, the `%%nbtrain --checklist` flag, the panel's Checklist
walk button. It borrows the live model in a trial (tools/trial.borrow), walks on a bench over the trial's
engine (bench.py: EngineBench), and hands a kept config to the live engine once the model is given back
(trial.keep, the call a user's change goes through). The walk itself is walker.py's.

    walk = nbtrain.checklist(recipe, config=cfg, budget_s=60)
    print(walk.table())       # the path: each step's bottleneck, what was tried, the verdict, what was kept
    walk.plot("walk.png")     # waterfall of the measured speed-ups, in the order walked
    cfg = walk.best_config    # or checklist(..., keep_best=True) leaves the live engine on it
"""
from __future__ import annotations

import time

from ..tools import trial
from ..tools.tool_options import ToolRefusal, declare, option
from ..tools.tune import MEMORY_BUDGET, samples_per_rank
from .bench import EngineBench
from .items import ITEMS
from .result import ChecklistResult
from .walker import run_walk


@declare("checklist", "nbtrain.checklist", "the automated checklist walk along the bottleneck: each item kept only "
         "when its head-to-head interval lies above the keep threshold; table and waterfall", (
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
def checklist(model=None, train_data=None, *, recipe=None, config=None, budget_s: float = 60.0, keep_best: bool = False,
              target_global_batch: int | None = None, items=ITEMS, trial_s: float | None = None,
              min_gain: float = 0.03, memory_budget=None, clock=time.monotonic, **parts) -> ChecklistResult:
    """Walk the checklist on the live model within `budget_s` seconds of `clock`; see the module docstring."""
    t0 = clock()  # the budget counts from here: finding the engine is part of the walk
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        if samples_per_rank(lent.engine) is None:
            raise ToolRefusal(lambda spell: "the training data is a stream (IterableDataset) without a length, and "
                                            "the walk's items count samples (batch sizes, held data); measure one "
                                            "change with nbtrain.ab, or give a map-style Dataset")
        bench = EngineBench(lent, memory_budget)
        result = run_walk(bench, budget_s=budget_s, trial_s=trial_s, min_gain=min_gain, items=items,
                          target_global_batch=target_global_batch, keep_best=keep_best, clock=clock, t0=t0)
    if bench.kept is not None:  # the model is given back first; the live engine then takes the kept config
        trial.keep(lent, bench.kept)
    return result
