"""Tuning by measurement on the live model: DataLoader workers, the largest batch, the LR.

    w = nbtrain.tune.find_workers(recipe, config=cfg)          # steady rate per worker setting (tune_workers.py)
    b = nbtrain.tune.find_batch_size(recipe, config=cfg)       # largest batch under a memory budget
    print(b.table()); cfg = b.config                           # batch, LR rule and warm-up applied; its speed
    lr = nbtrain.tune.find_lr(recipe, config=cfg); lr.plot()   # exponential sweep, steepest descent

Every trial trains real steps on the user's model on an engine of the trial's own (trial.borrow): the live
engine is never reached, and the model is given back bit for bit. The batch found is
then measured against the starting batch head to head, in alternating blocks (tools/ab.py):
a larger batch fits, but whether it trains faster on this machine is a measurement.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import psutil
import torch

from .. import plotting
from . import trial
from .trial import is_oom
from ..config import TrainConfig
from ..engine.state import Snapshot
from ..metrics import MetricsLog
from ..options import Problem
from ..user_loader import fixed_reason
from .tool_options import ToolOptionError, ToolRefusal, declare, option
from .lr_finder import find_lr
from .tune_workers import find_workers
from ..measure.ab import ABResult
from .ab import compare_on

# The toolbox as users call it, nbtrain.tune.X (README): the LR finder and the worker search live in modules of
# their own; nbtrain's own code imports each from there.
__all__ = ["find_batch_size", "find_lr", "find_workers", "BatchSearch", "memory_limit"]


# --- largest batch --------------------------------------------------------------------------

@dataclass
class BatchTrial:
    batch_size: int
    fits: bool
    peak_bytes: int | None
    reason: str = ""


@dataclass
class BatchSearch:
    batch_size: int              # largest batch that fit
    trials: list                 # BatchTrial, in the order tried
    max_trials: int
    limit_bytes: int | None      # the enforced peak-memory budget (None: out-of-memory only)
    memory_kind: str
    config: TrainConfig          # the starting config with the batch, LR rule and warm-up applied
    lr_base: float
    lr_scaled: float
    warmup_suggested: bool
    notes: list = field(default_factory=list)
    speed: ABResult | None = None    # the batch found against the starting batch, head to head
    speed_note: str = ""             # why the speed was not compared

    def summary(self) -> str:
        c = self.config
        warm = (f"linear warm-up over {c.warmup_steps} steps"
                + (" (suggested: one epoch at the new batch)" if self.warmup_suggested else "")
                if c.warmup_steps else "no warm-up")
        return (f"largest batch {self.batch_size} in {len(self.trials)} trials (at most {self.max_trials}); "
                f"learning rate {self.lr_base:.4g} -> {self.lr_scaled:.4g} by the {c.scale_lr} rule "
                f"(global batch {c.global_batch_size} vs base {c.base_batch_size}), {warm}")

    def table(self) -> str:
        limit = "out-of-memory only" if self.limit_bytes is None else f"{self.limit_bytes / 2**20:,.0f} MB"
        lines = [f"nbtrain batch-size search (peak {self.memory_kind}, budget {limit})"]
        for i, t in enumerate(self.trials, 1):
            peak = "-" if t.peak_bytes is None else f"{t.peak_bytes / 2**20:,.1f} MB"
            lines.append(f"  {i:2d}. batch {t.batch_size:>8,}  {'fits' if t.fits else 'too big':<8} peak {peak:>12}"
                         + (f"  ({t.reason})" if t.reason else ""))
        lines.append(self.summary())
        lines.append(self.speed_text())
        lines += self.notes
        return "\n".join(lines)

    def speed_text(self) -> str:
        """The found batch's speed against the starting batch's, with its interval."""
        if self.speed is None:
            return f"speed: {self.speed_note}"
        v, (a, b) = self.speed.verdict, (self.speed.a, self.speed.b)
        medians = [sorted(r)[len(r) // 2] for r in (self.speed.rates_a, self.speed.rates_b)]
        return (v.text(f"speed, batch {b.batch_size} against batch {a.batch_size} head to head") +
                f"; {medians[1]:,.0f} vs {medians[0]:,.0f} samples/s (median blocks, {v.pairs} pairs)")

    def plot(self, path=None, ax=None):
        with plotting.axes(path, ax, figsize=(6, 3.2)) as ax:
            for fits, color in ((True, "tab:green"), (False, "tab:red")):
                pts = [(t.batch_size, t.peak_bytes / 2**20) for t in self.trials if t.fits == fits and t.peak_bytes]
                if pts:
                    ax.scatter(*zip(*pts), color=color, label="fits" if fits else "too big")
            if self.limit_bytes is not None:
                ax.axhline(self.limit_bytes / 2**20, color="grey", ls="--", label="budget")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel(f"peak {self.memory_kind} (MB)")
            ax.set_title(f"largest batch {self.batch_size}", fontsize=9)
            ax.legend(fontsize=7)
        return ax.figure


def _agree(fits: bool, peak: int, device) -> tuple[bool, int]:
    """Under DDP every rank must pick the same batch: it fits only where it fits on every rank."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return fits, peak
    t = torch.tensor([0 if fits else 1, peak], dtype=torch.float64,
                     device=device if device.type == "cuda" else "cpu")
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t[0].item() == 0, int(t[1].item())


# One declaration for both tools that take it (the batch search and the checklist walk).
MEMORY_BUDGET = option(
    "memory_budget", "memory", "peak memory a trial may reach: a fraction of free memory (0.3) or a size (512MB, "
    "2GB); CPU default 0.5", allowed="a fraction in (0, 1] of the free memory (e.g. 0.3), a size such as 512MB or "
    "2GB, a whole number of bytes, or None (CPU: 0.5; CUDA: out-of-memory only)", flag="memory_budget",
    panel="memory fraction", panel_value=0.5)


def memory_limit(memory_budget, device) -> tuple[int | None, str]:
    """Peak bytes a trial may reach (`memory_budget` as MEMORY_BUDGET reads it): a fraction (0, 1] of free
    memory above what is held now, or bytes."""
    if device.type == "cuda":
        if memory_budget is None:
            return None, "CUDA allocated"
        free, _ = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_allocated(device)
        return (held + int(memory_budget * free) if isinstance(memory_budget, float) else int(memory_budget),
                "CUDA allocated")
    from ..engine.memory import current_rss
    budget = 0.5 if memory_budget is None else memory_budget
    if isinstance(budget, float):
        return current_rss() + int(budget * psutil.virtual_memory().available), "process RSS"
    return int(budget), "process RSS"


@declare("find_batch_size", "nbtrain.tune.find_batch_size", "largest batch that fits the memory budget, with the "
         "learning rate scaled, and its speed against the starting batch (head to head, 95% interval)", (
             option("max_batch", "whole", "largest batch to try (default: the samples per process)",
                    note="largest batch to try", none="the samples per process", low=1, nullable=True,
                    flag="max_batch"),
             MEMORY_BUDGET,
             option("rule", "choice", "how the learning rate follows the batch found",
                    note="how the learning rate follows the batch", choices=("linear", "sqrt", "none"),
                    flag="lr_rule", metavar="linear|sqrt|none"),
             option("steps", "whole", "steps per trial", note="steps per trial", low=1),
             option("tolerance", "number", "relative gap at which the search stops",
                    note="relative gap at which the search stops", above=0, high=0.1),
             option("speed_s", "number", "seconds comparing the batch found with the starting one", noun="seconds",
                    note="0: the speed is not compared", low=0),
             option("clock", "function", "the clock", allowed="a function returning seconds, like time.monotonic")),
         label="Find batch size", figsize=(6, 3.2))
def find_batch_size(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
                    max_batch: int | None = None, memory_budget=None, rule: str = "linear", steps: int = 1,
                    tolerance: float = 0.05, speed_s: float = 6.0, clock=time.monotonic, **parts) -> BatchSearch:
    """Largest batch whose training step fits: doubling, then an interpolating bisection.

    A trial trains `steps` real steps at a batch size; it is too big on CUDA out-of-memory or when
    its measured peak (CUDA allocated, or the process's peak RSS on the CPU) passes the budget.
    At most ceil(log2(max_batch)) + 4 trials; the found batch is within `tolerance` of the largest.
    Then, for about `speed_s` seconds of `clock` (0: not at all), its speed against the starting batch.
    """
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        return _search(lent, max_batch, memory_budget, rule, steps, tolerance, speed_s, clock)


def _search(lent, max_batch, memory_budget, rule, steps, tolerance, speed_s, clock) -> BatchSearch:
    engine = lent.engine
    start = trial.plain_config(engine.config)
    if engine.recipe.fixed_loader is not None:  # every other batch size would be refused, one trial at a time
        why = fixed_reason(engine.recipe.fixed_loader)
        raise ToolRefusal(lambda spell: f"the batch size cannot change: {why}")
    per_rank = samples_per_rank(engine)
    if per_rank is None and max_batch is None:
        raise ToolOptionError([Problem("max_batch", max_batch, "a whole number >= 1: the training data is a stream "
                                                               "(IterableDataset), whose length is unknown")])
    max_batch = per_rank if max_batch is None else max_batch
    if per_rank is not None and max_batch > per_rank:  # the one bound that needs the data
        raise ToolOptionError([Problem("max_batch", max_batch, f"at most {per_rank} (samples per process in "
                                                               "train_data)")])
    limit, kind = memory_limit(memory_budget, engine.device)
    max_trials = math.ceil(math.log2(max_batch)) + 4 if max_batch > 1 else 1
    trials: list[BatchTrial] = []

    def attempt(b: int) -> BatchTrial:
        trial.release_memory()
        try:
            m = trial.measure(engine, start.replace(batch_size=b), steps=steps, warmup_steps=0)
            fits, peak, reason = m.ok, m.peak_bytes, m.error
        except Exception as error:  # noqa: BLE001 - the user's own batch raises; a batch the search chose is a row
            if not is_oom(error) and b == start.batch_size:
                raise
            fits, peak, reason = False, None, "out of memory" if is_oom(error) else trial.failed(error)
        finally:
            lent.reset()
            trial.release_memory()
        if fits and limit is not None and peak > limit:
            fits, reason = False, "over budget"
        fits, peak = _agree(fits, peak or 0, engine.device)
        t = BatchTrial(b, fits, peak or None, reason if not fits else "")
        trials.append(t)
        return t

    exact = trial.exact_cpu_peaks() if engine.device.type == "cpu" else contextlib.nullcontext()
    with exact:
        b = min(start.batch_size, max_batch)
        lo, hi = None, None  # largest trial that fit, smallest that did not
        while len(trials) < max_trials:  # doubling (or halving while even the start is too big)
            t = attempt(b)
            if t.fits:
                lo = t
                if hi is not None or b >= max_batch:
                    break
                b = min(2 * b, max_batch)
            else:
                hi = t
                if lo is not None or b == 1:
                    break
                b = max(b // 2, 1)
        while lo is not None and hi is not None and len(trials) < max_trials \
                and hi.batch_size - lo.batch_size > max(1, tolerance * lo.batch_size):
            b = _next_probe(lo, hi, limit)
            t = attempt(b)
            if t.fits:
                lo = t
            else:
                hi = t
    found = lo.batch_size if lo is not None else 0
    if not found:
        raise ToolRefusal(lambda spell: f"even batch_size=1 does not fit ({hi.reason}); raise "
                                        f"{spell('memory_budget')} or make the model smaller")
    search = _with_lr(engine, start, found, rule, trials, max_trials, limit, kind)
    search.speed, search.speed_note = _speed(engine, lent, start, search.config, speed_s, clock)
    return search


def samples_per_rank(engine) -> int | None:
    """Training samples each process reads in an epoch, or None for a stream without a length."""
    try:
        return math.ceil(len(engine.recipe.train_data) / engine.world.size)
    except TypeError:  # an IterableDataset: its length is known only when it ends
        return None


def _speed(engine, lent, start: TrainConfig, found: TrainConfig, seconds: float, clock):
    """(the found config against the start in alternating blocks, or None and why not)."""
    if found.batch_size == start.batch_size:
        return None, "the starting batch is the largest found; nothing to compare"
    if not seconds:
        return None, "not compared (speed_s=0)"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Each rank would stop comparing at its own time, and the others would wait in an all-reduce.
        return None, "compared in single-process runs only (ranks would stop at different times)"
    try:
        return compare_on(engine, lent, start, found, block_steps=4, block_s=seconds / 24, min_pairs=3,
                          max_pairs=10, budget_s=seconds, clock=clock), ""
    except Exception as error:  # noqa: BLE001 - out of memory over several steps is a result
        if not is_oom(error):
            raise
        return None, "out of memory over several steps at the batch found"
    finally:
        lent.reset()
        trial.release_memory()


def _next_probe(lo: BatchTrial, hi: BatchTrial, limit: int | None) -> int:
    """Bisect, guided by the measured peaks: peak memory grows about linearly with the batch."""
    a, b = lo.batch_size, hi.batch_size
    guess = (a + b) / 2
    if limit is not None and lo.peak_bytes and hi.peak_bytes and hi.peak_bytes > lo.peak_bytes:
        guess = a + (limit - lo.peak_bytes) * (b - a) / (hi.peak_bytes - lo.peak_bytes)
        guess *= 0.99  # land just inside the budget, so the next trial tends to fit
    gap = b - a
    guess = min(max(guess, a + gap / 16), b - gap / 16)  # always shrink the interval
    return min(max(int(round(guess)), a + 1), b - 1)


def _with_lr(engine, start: TrainConfig, batch: int, rule: str, trials, max_trials, limit, kind) -> BatchSearch:
    """The found batch with the learning rate scaled from the starting global batch, and a warm-up."""
    base_batch = start.base_batch_size or start.global_batch_size
    changes = {"batch_size": batch}
    if rule != "none":
        changes.update(scale_lr=rule, base_batch_size=base_batch)
    suggested = False
    per_rank = samples_per_rank(engine)
    if rule != "none" and not start.warmup_steps and batch > start.batch_size and per_rank is not None:
        per_epoch = math.ceil(per_rank / batch / start.accumulate_grad_batches)
        changes["warmup_steps"], suggested = max(per_epoch, 1), True
    config, notes = checked_lr(engine, start.replace(**changes))
    rule = config.scale_lr
    base_lr = start.lr if start.lr is not None else engine.base_lrs[0]
    base_lr *= start.lr_factor()  # the rate in use now
    scaled = (start.lr if start.lr is not None else engine.base_lrs[0]) * config.lr_factor()
    if rule != "none":
        notes.append(f"apply it: config = config.replace(batch_size={batch}, scale_lr={rule!r}, "
                     f"base_batch_size={config.base_batch_size}, warmup_steps={config.warmup_steps})")
    return BatchSearch(batch, trials, max_trials, limit, kind, config, base_lr, scaled, suggested, notes)


def checked_lr(engine, config: TrainConfig, diverges=None) -> tuple[TrainConfig, list[str]]:
    """`config` with a scaled learning rate it can train with, and what was changed. A scaled rate is
    advice the user will follow (the batch search's, the checklist walk's): a short check that it does
    not make the loss diverge, falling back to the gentler sqrt rule, then to the unscaled rate.
    `diverges(engine, config)` runs the check (default: a trial in this process; DDP's ranks run apart)."""
    notes, rule, diverges = [], config.scale_lr, diverges or _diverges
    for fallback in (("sqrt", "none") if rule == "linear" else ("none",) if rule == "sqrt" else ()):
        diverged = diverges(engine, config)
        if not diverged:
            break
        notes.append(f"the {config.scale_lr} rule's learning rate made the loss diverge in a short check "
                     f"({diverged}); suggesting scale_lr={fallback!r} instead")
        config = config.replace(scale_lr=fallback)
    return config, notes


def _diverges(engine, config: TrainConfig, steps: int = 30) -> str | None:
    """'loss a -> b' when `steps` steps of `config` (in a trial: the model is put back) end with a
    non-finite loss or one well above where they started; None when the loss holds or falls."""
    log = MetricsLog()
    snapshot = Snapshot(engine)  # a trial's engine (the walk's, the batch search's): its state back after
    try:
        trial.measure(engine, config.replace(log_every_n_steps=1), steps=steps, log=log)
    finally:
        snapshot.restore()
    return worse(list(log.columns["loss"]))


def worse(losses: list[float]) -> str | None:
    """'loss a -> b' when a loss curve ends non-finite or 1.5x above its start, else None."""
    if not losses:
        return None
    window = max(1, len(losses) // 5)
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    if not all(math.isfinite(x) for x in losses) or last > 1.5 * first:
        return f"loss {first:.3g} -> {last:.3g}"
    return None

