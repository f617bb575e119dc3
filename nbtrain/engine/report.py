"""What a run states about itself: its plan, its device and strategy, compile costs. Plain functions of
what they read; the run (loop.py) calls them at its start and end."""
from __future__ import annotations

import math
import statistics

import torch
from torch.utils.data import IterableDataset

from . import data, fsdp
from ..format import ratio as ratio_text
from ..records import EngineInfo


class CompileCost:
    """Compile time apart from step time, and the step count at which compiling pays off: the Engine keeps
    one across runs (an eager run's step time is what a later compiled run is compared with)."""

    def __init__(self):
        self.eager_step_s: float | None = None
        self.fresh = False  # compiled since the last run's accounting: its cost is in the next run's steps

    def notes(self, steps: list[float], compile_mode: str, extra: dict) -> list[str]:
        """The compile note of a run whose step times are `steps`; puts its cost in `extra` (compile_s)."""
        if len(steps) < 3:
            return []
        steady = statistics.median(steps[1:])
        if compile_mode == "none":
            self.eager_step_s = steady
            return []
        if not self.fresh:
            return []
        self.fresh = False
        # Everything above the steady step time is compilation (the first step, and any recompiles).
        # Never below zero: with the graph already cached (another model of the class compiled in this
        # process) there is no cost to see, only the steps' own noise.
        cost = max(sum(steps) - steady * len(steps), 0.0)
        extra["compile_s"] = cost
        note = (f"compile cost {cost:.1f} s" if cost >= 0.05 else "compile cost none to see (already cached)") \
            + f"; compiled step {1000 * steady:.2f} ms"
        if self.eager_step_s is None:
            return [note + "; run once without compile on this model to see when it pays off"]
        gain = self.eager_step_s - steady
        if gain <= 0:
            return [note + f" vs {1000 * self.eager_step_s:.2f} ms eager: no speed-up at this size, it never pays off"]
        pays = f"pays off after ~{math.ceil(cost / gain):,} steps" if cost >= 0.05 else "pays off at once"
        return [note + f" vs {1000 * self.eager_step_s:.2f} ms eager ({ratio_text(self.eager_step_s / steady)}): {pays}"]


def planned_steps(c, loader) -> int:
    """The optimizer steps a run under config `c` takes on `loader` (the least of its budgets)."""
    if loader.sampler.per_epoch is None:
        passes = getattr(loader, "batches_per_pass", None)
        by_epochs = math.ceil(passes() / c.accumulate_grad_batches) * c.epochs_budget \
            if passes is not None and c.epochs_budget is not None else None
        return min(x for x in (by_epochs, c.max_steps) if x is not None)
    per_epoch = math.ceil(len(data.batch_sizes(loader.sampler.per_epoch, loader.batch_size, c.drop_last))
                          / c.accumulate_grad_batches)
    by_epochs = per_epoch * c.epochs_budget if c.epochs_budget is not None else None
    return min(x for x in (by_epochs, c.max_steps) if x is not None)


def info(engine, workload: str | None = None) -> EngineInfo:
    """What the engine runs with; `workload`: the run's digest of what it trains (engine/workload.py)."""
    c = engine.config
    return EngineInfo(device=str(engine.device), strategy=strategy(engine), world_size=engine.world.size,
                      global_batch=c.global_batch_size,
                      lr=engine.target_lrs()[0], lr_note=engine.lr_note(), precision=c.precision,
                      scaler=engine.precision.scaler.is_enabled(), pin_memory=c.pin, seed=engine.seed,
                      workload=workload, inert=inert_options(engine.recipe), threads=torch.get_num_threads())


def inert_options(recipe) -> tuple[str, ...]:
    """The options this run's data cannot use, so that no comparison calls a difference in them one: shuffle
    where the order is not nbtrain's to choose (a stream read as it comes, a DataLoader whose sampler decides)."""
    ordered_here = recipe.fixed_loader is None and not isinstance(recipe.train_data, IterableDataset)
    return () if ordered_here else ("shuffle",)


def strategy(engine) -> str:
    if fsdp.is_sharded(engine.model):
        return "fsdp"
    if engine.config.strategy == "dp" and engine.device.type == "cuda":
        return "dp"
    return "ddp" if engine.world.distributed else "single process"


def time_split(started: float, clock, warmup_s: float, train_s: float, closing_validation_s: float) -> dict:
    """Where a run's time went, in seconds: start-up (from the run's start until its clock started: a
    resume's checkpoint, the loader's set-up), warm-up and training (the clock's time, split where its
    steady rate sets the warm-up apart), validation and checkpointing (paused out of that clock)."""
    return {"start-up": clock.started - started, "warm-up": warmup_s, "training": max(train_s - warmup_s, 0.0),
            "validation": clock.apart.get("validation", 0.0) + closing_validation_s,
            "checkpointing": clock.apart.get("checkpointing", 0.0)}


def with_call(split: dict, before_s: float, call_s: float) -> dict:
    """A run's time split within the call that made it (nbtrain.fit): what the call spent before the run
    (building the recipe and the engine) is start-up too, and "other" is whatever no part holds, so the
    parts sum to the call's wall time."""
    split = dict(split, **{"start-up": split.get("start-up", 0.0) + before_s})
    split["other"] = call_s - sum(v for k, v in split.items() if k != "other")
    return split
