"""The checklist walk's items: each one's candidates from the current config, or why it does not apply.

An item function takes (walk, engine, start, current, target_global_batch) and returns its
candidates as measured (`Tried`: each raced against the current config in alternating blocks on
the live model, measure/race.py, with its ratio and interval) or a string saying why it was
skipped. Which candidate is kept is decided by the walk (checklist.py).
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

import torch

from .. import hardware
from ..config import ConfigError, TrainConfig, runnable_problems
from . import trial
from .diagnose import usable_cores
from ..measure.steady import NOTHING, SteadyRate, block_rates, columns_series
from ..measure.verdict import UNMEASURED, Verdict, unpaired
from ..records import samples_start

# Batch before workers: more workers only pay once a batch is big enough to keep them busy, and a
# larger batch is the cheaper change; a coordinate search that tries workers first keeps too few.
ITEMS = ("preload_data", "batch_size", "workers", "accumulation", "device", "precision", "optimizer_impl",
         "channels_last", "matmul_precision", "compile", "activation_checkpointing", "ddp")
_COMPILE_MIN_LEFT_S = 120  # compiling alone takes longer than a short walk has; below this it is only explained
_DDP_START_S = 8.0  # first guess at starting worker interpreters, before any is measured


@dataclass
class Tried:
    """One candidate as measured: its samples/s (None when it did not run, and why not), its verdict
    over the current config, and why it left the race early, if it did."""
    label: str
    config: TrainConfig
    samples_per_s: float | None
    note: str = ""
    steady: SteadyRate = NOTHING
    blocks: list = field(default_factory=list)  # block rates, for an unpaired verdict
    verdict: Verdict = UNMEASURED               # over the current config
    left: str = ""                              # e.g. "left after round 1: below a gain worth keeping"
    apart: bool = False                         # measured apart from the current config (DDP's processes)

    def text(self) -> str:
        if self.samples_per_s is None:
            return f"{self.label}: {self.note}"
        s = self.steady
        interval = f" ({s.low:,.0f}-{s.high:,.0f})" if math.isfinite(s.low) and math.isfinite(s.high) else ""
        return f"{self.label}: {self.samples_per_s:,.0f}{interval}" + (f" ({self.left})" if self.left else "")


def worker_candidates(start: TrainConfig, cores: int | None = None) -> list[int]:
    cores = cores or usable_cores()
    return sorted({start.num_workers} | {n for n in (0, 1, 2, 4, 8) if n <= cores})


def batch_candidates(start: TrainConfig, samples: int, target_global_batch: int | None = None) -> list[int]:
    """Doublings of the current batch, while an epoch still has 8 batches (and within the target)."""
    cap = max(samples // 8, start.batch_size)
    if target_global_batch:
        cap = min(cap, max(target_global_batch // (start.accumulate_grad_batches * start.world_size),
                           start.batch_size))
    out, b = [start.batch_size], start.batch_size
    while 2 * b <= cap:
        b *= 2
        out.append(b)
    return out


def precision_candidates(start: TrainConfig) -> list[str]:
    return ["32-true", "bf16-mixed"] + (["16-mixed"] if start.device_type == "cuda" else [])


def with_batch(start: TrainConfig, batch: int, base: TrainConfig) -> TrainConfig:
    """`batch` with the learning rate scaled (linear rule) from the walk's starting global batch."""
    if batch == base.batch_size and start.scale_lr == base.scale_lr:
        return start.replace(batch_size=batch)
    if base.scale_lr != "none":
        return start.replace(batch_size=batch)
    return start.replace(batch_size=batch, scale_lr="linear", base_batch_size=base.global_batch_size)


def with_workers(start: TrainConfig, n: int) -> TrainConfig:
    # Persistent workers: a trained config reuses its workers across epochs.
    return start.replace(num_workers=n, persistent_workers=n > 0, prefetch_factor=start.prefetch_factor if n else None)


def try_all(walk, configs_and_labels, ordered: bool = False) -> list[Tried]:
    """Race the candidates against the walk's current config (walk.race); `ordered`: in rising size,
    so one that does not fit takes the larger ones with it."""
    return walk.race(list(configs_and_labels), ordered=ordered)


def batch_to_retry(item, tried: list) -> int | None:
    """A larger batch than the batch item's outcome for the workers item to race as well: workers pay only
    once a batch keeps them busy, and a larger batch may pay only once workers feed it. It is the largest
    batch the race did not show slower than the config it started from. Where loading bounds the speed,
    every batch runs at one speed without workers and the race's leader is noise; the largest batch is
    the one that workers feed best."""
    floor = next(t.config.batch_size for t in tried if t.label == item.chosen) if item.kept else 0
    return max((t.config.batch_size for t in tried  # a candidate that did not run has no finite verdict
                if t.config.batch_size > floor and math.isfinite(t.verdict.high) and t.verdict.high >= 1),
               default=None)


def workers(walk, engine, start, current, target):
    """Other worker counts at the current batch — and the most workers at the batch item's batch to retry
    (batch_to_retry), the two tried together."""
    counts = [n for n in worker_candidates(current) if n != current.num_workers]
    if not counts:
        return "no other worker count to try on this machine"
    candidates = [(f"num_workers={n}", with_workers(current, n)) for n in counts]
    batch = walk.retry_batch
    if batch and batch != current.batch_size and max(counts) > 0:
        n = max(counts)  # the most workers: the count that feeds a larger batch best, one more candidate only
        candidates.append((f"num_workers={n}, batch_size={batch}",
                           with_workers(with_batch(current, batch, start), n)))
    return try_all(walk, candidates)


def batch_size(walk, engine, start, current, target):
    sizes = [b for b in batch_candidates(current, len(engine.recipe.train_data) // engine.world.size, target)
             if b > current.batch_size]
    if not sizes:
        return "no larger batch fits 8 batches per epoch" + (" within the target global batch" if target else "")
    return try_all(walk, [(f"batch_size={b}", with_batch(current, b, start)) for b in sizes], ordered=True)


def accumulation(walk, engine, start, current, target):
    if not target:
        return "no target_global_batch given"
    k = math.ceil(target / (current.batch_size * current.world_size))
    if k <= current.accumulate_grad_batches:
        return f"global batch {current.global_batch_size} already reaches the target {target}"
    c = current.replace(accumulate_grad_batches=k)
    if c.scale_lr == "none":
        c = c.replace(scale_lr="linear", base_batch_size=start.global_batch_size)
    return try_all(walk, [(f"accumulate_grad_batches={k}", c)])


def device(walk, engine, start, current, target):
    if not torch.cuda.is_available():
        return "no GPU (CUDA is not available on this machine)"
    if current.device_type == "cuda":
        return "already on the GPU"
    return try_all(walk, [("accelerator='cuda'", current.replace(accelerator="cuda"))])


def precision(walk, engine, start, current, target):
    runnable, refused = [], []
    for p in precision_candidates(current):
        if p == current.precision:
            continue
        try:
            runnable.append((f"precision={p!r}", current.replace(precision=p)))
        except ConfigError as error:  # e.g. 16-mixed off CUDA: say why, from the config's own check
            refused.append(error.render())
    if not runnable:
        return "; ".join(refused) or "no other precision"
    return try_all(walk, runnable)


def ddp_candidate(current: TrainConfig, processes: int = 2) -> tuple[str, TrainConfig]:
    """(label, config) of `processes` DDP ranks holding the current total of DataLoader workers between them."""
    each = current.num_workers // processes
    config = (current if each == current.num_workers else with_workers(current, each)).replace(devices=processes)
    label = f"devices={processes} ({each} DataLoader worker{'s' if each != 1 else ''} each"
    label += (f", {processes * each} in all as before)" if processes * each == current.num_workers else
              f"; {current.num_workers} cannot be split evenly over {processes} processes)")
    return label, config


def _cannot_run_here(c: TrainConfig) -> str:
    """Why this machine cannot run DDP config `c` (empty: it can)."""
    inv = hardware.inventory()
    if c.device_type == "cuda" and inv.cuda_devices < 2:
        return (f"{inv.cuda_devices} CUDA device{'s' if inv.cuda_devices != 1 else ''} on this machine: "
                f"{c.devices} DDP processes would share one GPU, which is slower by construction")
    problems = runnable_problems(c, inv)
    return ConfigError(problems).render() if problems else ""


def ddp(walk, engine, start, current, target):
    """Two processes against the current config, at the same total of DataLoader workers.

    Each rank builds its own loader: two ranks keeping the current count each would load with
    twice the workers, and credit DDP with what more workers did. The ranks run in fresh
    processes, so the comparison cannot alternate blocks on the live engine: the current config
    is measured right after them, and the verdict is unpaired (it says so).
    """
    if importlib.util.find_spec("nbtrain.distributed.launch") is None:
        return "the DDP launcher (nbtrain.distributed) is not part of this install"
    try:
        from ..distributed import launch  # noqa: F401
    except ImportError as error:
        return f"the DDP launcher (nbtrain.distributed) does not import: {error}"
    try:
        label, c = ddp_candidate(current)
    except ConfigError as error:
        return error.render()
    cannot = _cannot_run_here(c)
    if cannot:
        return cannot
    needed = 2 * walk.trial_s + max(walk.overhead_s, _DDP_START_S)
    walk.ensure_rate()
    if walk.left() < needed:
        return f"time budget: starting 2 worker processes needs about {needed:.0f} s, {max(walk.left(), 0):.0f} s left"
    from ..api import fit
    # Half the steps the current config trains in one trial's time: DDP on a busy machine may be
    # slower, and its workers' start-up comes on top (the workers measure their own rate).
    steps = max(10, int(walk.rate * walk.trial_s / c.global_batch_size / 2))
    try:
        result = fit(recipe=engine.recipe, config=c.replace(max_steps=steps, max_epochs=None),
                     stop=trial.tool_stop())  # a panel's Stop ends the workers' run too
    except Exception as error:  # noqa: BLE001 - a candidate the walk chose is a row, never the walk's end
        return [Tried(label, c, None, trial.failed(error))]
    finally:
        walk.snapshot.restore()
        walk.trials += 1
    if result.status != "completed":
        return [Tried(label, c, None, result.status)]
    series = columns_series(result.log.columns, samples_start(result.log))
    tried = Tried(label, c, result.steady().rate, steady=result.steady(), blocks=block_rates(*series), apart=True)
    now = walk.measure(current)  # the current config, right after: the nearest load to compare under
    ok = now is not None and now.samples_per_s is not None
    tried.verdict = unpaired(now.blocks, tried.blocks) if ok else UNMEASURED
    return [tried]


def optimizer_impl(walk, engine, start, current, target):
    from ..engine.toggles import with_implementation
    runnable, refused = [], []
    for impl in ("foreach", "fused"):
        if impl == current.optimizer_impl:
            continue
        _, note = with_implementation(engine.optimizer, impl)
        if note:
            refused.append(note)
        else:
            runnable.append((f"optimizer_impl={impl!r}", current.replace(optimizer_impl=impl)))
    if not runnable:
        return "; ".join(refused) or "already on the other kernels"
    return try_all(walk, runnable)


def channels_last(walk, engine, start, current, target):
    from ..engine.toggles import has_conv2d
    if current.channels_last:
        return "already channels_last"
    if not has_conv2d(engine.model):
        return "the model has no 2-D convolutions, so its activations are not 4-D images"
    return try_all(walk, [("channels_last=True", current.replace(channels_last=True))])


def matmul_precision(walk, engine, start, current, target):
    if current.device_type != "cuda":
        return f"TF32 matmuls are a CUDA feature; this run is on {current.device_type}"
    if current.matmul_precision == "high":
        return "already matmul_precision='high'"
    return try_all(walk, [("matmul_precision='high'", current.replace(matmul_precision="high"))])


def compile(walk, engine, start, current, target):  # noqa: A001 - the item's name
    if current.compile != "none":
        return f"already compiled (mode {current.compile!r})"
    if walk.left() < _COMPILE_MIN_LEFT_S:
        return (f"compiling does not fit the {max(walk.left(), 0):.0f} s left of the budget; train once with "
                f"compile='default' alone: its summary measures the compile cost and the step count at which it pays off")
    return try_all(walk, [("compile='default'", current.replace(compile="default"))])


def activation_checkpointing(walk, engine, start, current, target):
    return ("it trades speed for memory (activations recomputed in backward), so it cannot speed up a run that fits; "
            "use it with find_batch_size when the batch is memory-bound")


FUNCTIONS = {"workers": workers, "batch_size": batch_size, "accumulation": accumulation, "device": device,
             "precision": precision, "optimizer_impl": optimizer_impl, "channels_last": channels_last,
             "matmul_precision": matmul_precision, "compile": compile,
             "activation_checkpointing": activation_checkpointing, "ddp": ddp}


def preload_data(walk, engine, start, current, target):
    """Batches cut from the data held in memory against the DataLoader's; the label states what holding costs.
    Held data is tried only where the held-data rule (engine/data.py) holds it, so the walk never keeps a
    frozen read of samples that change (an augmentation): it says why instead."""
    from ..engine.data import hold, size_text
    recipe = engine.recipe
    held, _ = hold(recipe.train_data, current, engine.world, engine.device, recipe.collate_fn,
                   previous=engine.held_data, own_loader=recipe.fixed_loader)
    on = held is not None
    if not on:
        current = current.replace(preload_data=True, num_workers=0, persistent_workers=False, prefetch_factor=None)
        held, why = hold(recipe.train_data, current, engine.world, engine.device, recipe.collate_fn,
                         own_loader=recipe.fixed_loader)
        if held is None:
            return why
    cost = f"{size_text(held.copied)} held on {held.device}" if held.copied else \
        "no copy: the TensorDataset's own tensors"
    if on:  # already held (auto): measure what it buys against the DataLoader
        return try_all(walk, [(f"preload_data=False (held now: {cost})", current.replace(preload_data=False))])
    return try_all(walk, [(f"preload_data=True ({cost})", current)])


FUNCTIONS["preload_data"] = preload_data
