"""The checklist walk's items: each one's candidates from the current config, or why it does not apply.

Each item is one `Item`, registered once by the `@item(...)` decorator on its candidates function:
its name, the remedies of the four ceilings it answers (measure/bottleneck.py: `Remedy.item`; every
remedy the bottleneck can name is answered by an item or said in NOT_AN_ITEM, test_checklist_parts.py), when
it is tried (`stage`), and its candidates. The function takes (walk, current) and returns
(label, config) pairs that the walk races against the current config, candidates already measured
(`Tried`, DDP's processes measured apart), or a string saying why the item does not apply here. What an
item hands to the items after it is the result its race returned (`walk.outcome(name)`: the workers item
reads the batch item's), never state set on the walk.
The walk (walker.py) never names an item: it reads these fields. What an item needs to know of
the machine it asks `walk.here` (bench.Here: the live engine's, or a simulated machine's).
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Callable

from .. import hardware
from ..config import TrainConfig, runnable_problems
from ..options import ConfigError
from ..hardware import usable_cores
from ..measure.steady import NOTHING, SteadyRate
from ..measure.verdict import UNMEASURED, Verdict, unpaired


@dataclass(frozen=True)
class Item:
    """One checklist item: see the module doc."""
    name: str
    candidates: Callable          # (walk, current) -> [(label, config)] | [Tried] | "why it does not apply"
    answers: tuple = ()           # the bottleneck remedies (Remedy.item) it tries; tried when one of them is
    stage: str = "bottleneck"     # "first": before any bottleneck is read; "last": once, after the path ends
    ordered: bool = False         # candidates in rising size: one that does not fit takes the larger ones out
    keep_regardless: bool = False  # asked for by the user (accumulation to a target): kept without a gain
    reads: Callable | None = None  # (walk, current) -> a reading said in its row (the batch: the critical batch size)


REGISTRY: dict[str, Item] = {}
# Remedies the bottleneck can name (measure/bottleneck.py) that no item races, and why (the ceilings' table still
# says them): each remedy is an item's answer or one of these (test_checklist_parts.py).
NOT_AN_ITEM = {"pin_memory": "batches are pinned on CUDA unless pin_memory=False was given; no item races it yet",
               "cache": "a tool of its own: nbtrain.cache writes the preprocessed samples to disk once"}


def item(name: str, **fields):
    """Register the decorated candidates function as checklist item `name` (in the order of registration:
    the order of the walk where no bottleneck was read)."""
    def register(function):
        REGISTRY[name] = Item(name, function, **fields)
        return function
    return register

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


def batch_to_retry(item) -> int | None:
    """A larger batch than the batch item's outcome for the workers item to race as well: workers pay only
    once a batch keeps them busy, and a larger batch may pay only once workers feed it. It is the largest
    batch the race did not show slower than the config it started from. Where loading bounds the speed,
    every batch runs at one speed without workers and the race's leader is noise; the largest batch is
    the one that workers feed best. `item`: the batch item's result (ItemResult), its candidates as raced."""
    floor = next(t.config.batch_size for t in item.tried if t.label == item.chosen) if item.kept else 0
    return max((t.config.batch_size for t in item.tried  # a candidate that did not run has no finite verdict
                if t.config.batch_size > floor and math.isfinite(t.verdict.high) and t.verdict.high >= 1),
               default=None)


@item("preload_data", answers=("preload_data",))
def preload_data(walk, current):
    """Batches cut from the data held in memory against the DataLoader's; the label states what holding costs.
    Held data is tried only where the held-data rule (engine/data.py) holds it, so the walk never keeps a
    frozen read of samples that change (an augmentation): it says why instead."""
    on, cost, why = walk.here.holding(current)
    if cost is None:
        return why
    if on:  # already held (auto): measure what it buys against the DataLoader
        return [(f"preload_data=False (held now: {cost})", current.replace(preload_data=False))]
    held = current.replace(preload_data=True, num_workers=0, persistent_workers=False, prefetch_factor=None)
    return [(f"preload_data=True ({cost})", held)]


# Batch before workers: more workers only pay once a batch is big enough to keep them busy, and a
# larger batch is the cheaper change; a coordinate search that tries workers first keeps too few.
def critical_batch(walk, current) -> str:
    """The gradient noise scale at the current batch (tools/gradient_noise.py), said in the batch item's row: the
    batch beyond which a larger one costs samples for the same loss (McCandlish et al. 2018)."""
    if walk.left() < 4 * walk.block_cost_s():
        return "critical batch size not read: no time left in the budget"
    return walk.bench.noise_scale(current, walk.block_s).text()


@item("batch_size", answers=("batch_size",), ordered=True, reads=critical_batch)
def batch_size(walk, current):
    target = walk.target
    sizes = [b for b in batch_candidates(current, walk.here.samples, target) if b > current.batch_size]
    if not sizes:
        return "no larger batch fits 8 batches per epoch" + (" within the target global batch" if target else "")
    return [(f"batch_size={b}", with_batch(current, b, walk.start)) for b in sizes]


@item("workers", answers=("num_workers",))
def workers(walk, current):
    """Other worker counts at the current batch — and the most workers at a larger batch, the two tried together:
    the batch item's batch to retry (batch_to_retry), or, before any batch was raced, the largest batch the
    batch item would try (workers pay once a batch keeps them busy: on 2 cores, two workers gained nothing at
    batch 16 and 1.7x at 256, so a race at 16 alone rejects them and a race of batches alone keeps 1.1x)."""
    if current.preload_data:
        return "the data is held in memory (preload_data): no DataLoader workers to change"
    counts = [n for n in worker_candidates(current, walk.here.cores) if n != current.num_workers]
    if not counts:
        return "no other worker count to try on this machine"
    candidates = [(f"num_workers={n}", with_workers(current, n)) for n in counts]
    raced = walk.outcome("batch_size")
    batch = batch_to_retry(raced) if raced is not None else max(batch_candidates(current, walk.here.samples,
                                                                                 walk.target))
    if batch and batch > current.batch_size and max(counts) > 0:
        n = max(counts)  # the most workers: the count that feeds a larger batch best, one more candidate only
        candidates.append((f"num_workers={n}, batch_size={batch}",
                           with_workers(with_batch(current, batch, walk.start), n)))
    return candidates


@item("accumulation", stage="last", keep_regardless=True)
def accumulation(walk, current):
    target = walk.target
    if not target:
        return "no target_global_batch given"
    k = math.ceil(target / (current.batch_size * current.world_size))
    if k <= current.accumulate_grad_batches:
        return f"global batch {current.global_batch_size} already reaches the target {target}"
    c = current.replace(accumulate_grad_batches=k)
    if c.scale_lr == "none":
        c = c.replace(scale_lr="linear", base_batch_size=walk.start.global_batch_size)
    return [(f"accumulate_grad_batches={k}", c)]


@item("device", stage="first")
def device(walk, current):
    if not walk.here.cuda:
        return "no GPU (CUDA is not available on this machine)"
    if current.device_type == "cuda":
        return "already on the GPU"
    return [("accelerator='cuda'", current.replace(accelerator="cuda"))]


def thread_candidates(now: int, default: int, cores: int) -> list[int | None]:
    """The num_threads values to race against a run at `now` threads: one thread, half the cores and torch's
    default (None), each at a count other than `now`. Never more than the default: where OMP_NUM_THREADS set
    it (a notebook kernel, a batch job's share of a node), more threads than it are not the walk's to take."""
    counts = {1: 1, max(min(cores // 2, default), 1): max(min(cores // 2, default), 1), default: None}
    return [value for count, value in sorted(counts.items()) if count != now]


# First, before any reading: on a CPU shared with other work, torch's default of a thread per core leaves threads
# waiting for a busy core and stalling the others (29x slower than one thread on a 2-core laptop with one core
# busy), and every later race and reading would time that noise rather than the item it tries.
@item("threads", stage="first")
def threads(walk, current):
    """torch's intra-op thread counts (num_threads: 1, half the cores, torch's default) on the CPU. Threads change
    no math beyond the order of float sums (a reduction split across threads adds in another order)."""
    if current.device_type != "cpu":
        return f"torch's CPU threads pace a run on the CPU; this run is on {current.device_type}"
    default = walk.here.threads  # what a run at num_threads=None trains at
    now = current.num_threads or default
    values = thread_candidates(now, default, walk.here.cores)
    if not values:
        return f"no other thread count to try: one thread, half the cores and torch's default ({default}) are {now}"
    return [(f"num_threads={v if v is not None else f'None ({default})'} (was {now}; same math, float sums "
             "reordered)", current.replace(num_threads=v)) for v in values]


@item("precision", answers=("precision",))
def precision(walk, current):
    runnable, refused = [], []
    for p in precision_candidates(current):
        if p == current.precision:
            continue
        try:
            runnable.append((f"precision={p!r}", current.replace(precision=p)))
        except ConfigError as error:  # e.g. 16-mixed off CUDA: say why, from the config's own check
            refused.append(error.render())
    return runnable or "; ".join(refused) or "no other precision"


@item("optimizer_impl", answers=("optimizer_impl",))
def optimizer_impl(walk, current):
    runnable, refused = [], []
    for impl in ("foreach", "fused"):
        if impl == current.optimizer_impl:
            continue
        note = walk.here.optimizer_refusal(impl)
        if note:
            refused.append(note)
        else:
            runnable.append((f"optimizer_impl={impl!r}", current.replace(optimizer_impl=impl)))
    return runnable or "; ".join(refused) or "already on the other kernels"


@item("channels_last", answers=("channels_last",))
def channels_last(walk, current):
    if current.channels_last:
        return "already channels_last"
    if not walk.here.has_conv2d:
        return "the model has no 2-D convolutions, so its activations are not 4-D images"
    return [("channels_last=True", current.replace(channels_last=True))]


@item("matmul_precision", answers=("matmul_precision",))
def matmul_precision(walk, current):
    if current.device_type != "cuda":
        return f"TF32 matmuls are a CUDA feature; this run is on {current.device_type}"
    if current.matmul_precision == "high":
        return "already matmul_precision='high'"
    return [("matmul_precision='high'", current.replace(matmul_precision="high"))]


@item("compile", answers=("compile",))
def compile(walk, current):  # noqa: A001 - the item's name
    if current.compile != "none":
        return f"already compiled (mode {current.compile!r})"
    if walk.left() < _COMPILE_MIN_LEFT_S:
        return (f"compiling does not fit the {max(walk.left(), 0):.0f} s left of the budget; train once with "
                f"compile='default' alone: its summary measures the compile cost and the step count at which it pays off")
    return [("compile='default'", current.replace(compile="default"))]


@item("activation_checkpointing", stage="last")
def activation_checkpointing(walk, current):
    return ("it trades speed for memory (activations recomputed in backward), so it cannot speed up a run that fits; "
            "use it with find_batch_size when the batch is memory-bound")


def ddp_candidate(current: TrainConfig, processes: int = 2) -> tuple[str, TrainConfig]:
    """(label, config) of `processes` DDP ranks holding the current total of DataLoader workers between them."""
    each = current.num_workers // processes
    config = (current if each == current.num_workers else with_workers(current, each)).replace(devices=processes)
    label = f"devices={processes} ({each} DataLoader worker{'s' if each != 1 else ''} each"
    label += (f", {processes * each} in all as before)" if processes * each == current.num_workers else
              f"; {current.num_workers} cannot be split evenly over {processes} processes)")
    return label, config


def ddp_processes(current: TrainConfig) -> int:
    """How many DDP processes the walk tries: one per GPU on a machine of several, else two (CPU processes)."""
    gpus = hardware.inventory().cuda_devices
    return gpus if current.device_type == "cuda" and gpus >= 2 else 2


def cannot_run_ddp_here(c: TrainConfig) -> str:
    """Why this machine cannot run DDP config `c` (empty: it can)."""
    inv = hardware.inventory()
    if c.device_type == "cuda" and inv.cuda_devices < 2:
        return (f"{inv.cuda_devices} CUDA device{'s' if inv.cuda_devices != 1 else ''} on this machine: "
                f"{c.devices} DDP processes would share one GPU, which is slower by construction")
    problems = runnable_problems(c, inv)
    return ConfigError(problems).render() if problems else ""


@item("ddp", stage="last")
def ddp(walk, current):
    """DDP (one process per GPU on a machine of several, else two) against the current config, at the same
    total of DataLoader workers.

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
        label, c = ddp_candidate(current, ddp_processes(current))
    except ConfigError as error:
        return error.render()
    cannot = walk.here.ddp_refusal(c)
    if cannot:
        return cannot
    needed = 2 * walk.trial_s + max(walk.overhead_s, _DDP_START_S)
    walk.ensure_rate()
    if walk.left() < needed:
        return f"time budget: starting 2 worker processes needs about {needed:.0f} s, {max(walk.left(), 0):.0f} s left"
    # Half the steps the current config trains in one trial's time: DDP on a busy machine may be
    # slower, and its workers' start-up comes on top (the workers measure their own rate).
    steps = max(10, int(walk.rate * walk.trial_s / c.global_batch_size / 2))
    tried = walk.apart(label, c, steps)
    if tried.samples_per_s is None:
        return [tried]
    now = walk.measure(current)  # the current config, right after: the nearest load to compare under
    ok = now is not None and now.samples_per_s is not None
    tried.verdict = unpaired(now.blocks, tried.blocks) if ok else UNMEASURED
    return [tried]


ITEMS = tuple(REGISTRY)
