"""The automated checklist walk: try each applicable speed item on the live model, keep what helps.

    walk = nbtrain.checklist(recipe, config=cfg, budget_s=60)
    print(walk.table())       # every item: what was tried, measured samples/s, kept or not, skipped and why
    walk.plot("walk.png")     # waterfall of the measured speed-ups
    cfg = walk.best_config    # or checklist(..., keep_best=True) leaves the live engine on it

Starting from the current config, items are tried in order — DataLoader workers, batch size
(learning rate scaled by the linear rule), accumulation to a target global batch, device,
precision, optimizer kernels, channels_last, TF32 matmuls, torch.compile, activation
checkpointing, DDP processes — each item either measured or skipped with the reason, each candidate a short timed trial on the user's own engine. An
item's best candidate is kept when it beats the current config by `min_gain`, and the next
item starts from there. Trials never keep their weights (each is undone by a Snapshot); the
walk stops starting trials when the stated budget would be passed. The budget is read on the
walk's own clock (`clock=`, default time.monotonic), so a test can run it on a fake one.
"""
from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import dataclass, field

import torch

from . import trial
from .config import ConfigError, TrainConfig
from .diagnose import usable_cores
from .tune import _is_oom, memory_limit

ITEMS = ("workers", "batch_size", "accumulation", "device", "precision", "optimizer_impl", "channels_last",
         "matmul_precision", "compile", "activation_checkpointing", "ddp")
_COMPILE_MIN_LEFT_S = 120  # compiling alone takes longer than a short walk has; below this it is only explained
_DDP_START_S = 8.0  # first guess at starting worker interpreters, before any is measured


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


@dataclass
class Tried:
    label: str
    config: TrainConfig
    samples_per_s: float | None
    note: str = ""


@dataclass
class ItemResult:
    name: str
    tried: list
    before: float
    after: float
    kept: bool
    chosen: str

    @property
    def speedup(self) -> float:
        return self.after / self.before if self.before else float("nan")


@dataclass
class ChecklistResult:
    start_config: TrainConfig
    best_config: TrainConfig
    baseline: float
    items: list
    skipped: list                 # (item, reason)
    budget_s: float
    elapsed_s: float
    trials: int
    device: str
    lr_note: str = ""
    kept_on_engine: bool = False

    @property
    def final(self) -> float:
        return self.items[-1].after if self.items else self.baseline

    def changes(self) -> dict:
        return {k: v for k, (_, v) in self.best_config.changed_from(self.start_config).items()}

    def table(self) -> str:
        lines = [f"nbtrain checklist walk on {self.device}: {self.baseline:,.0f} -> {self.final:,.0f} samples/s "
                 f"(x{self.final / self.baseline:.2f}), {self.trials} trials in {self.elapsed_s:.1f} s "
                 f"of a {self.budget_s:.0f} s budget"]
        lines.append(f"  {'item':<13} {'samples/s':>10} {'x':>6}  {'kept':<4}  tried (samples/s)")
        lines.append(f"  {'start':<13} {self.baseline:>10,.0f} {'':>6}  {'':<4}  {_describe(self.start_config)}")
        for item in self.items:
            tried = "; ".join(f"{t.label}: " + (f"{t.samples_per_s:,.0f}" if t.samples_per_s else t.note)
                              for t in item.tried)
            lines.append(f"  {item.name:<13} {item.after:>10,.0f} {item.speedup:>6.2f}  "
                         f"{'yes' if item.kept else 'no':<4}  {tried}" + (f" -> {item.chosen}" if item.kept else ""))
        for name, reason in self.skipped:
            lines.append(f"  {name:<13} {'skipped':>10}                {reason}")
        changes = self.changes()
        lines.append("best config: " + (", ".join(f"{k}={v!r}" for k, v in changes.items()) or "the starting one"))
        if self.lr_note:
            lines.append(f"learning rate: {self.lr_note}")
        lines.append("the live engine now uses the best config" if self.kept_on_engine
                     else "model and config restored (keep_best=True keeps the best config)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ChecklistResult(x{self.final / self.baseline:.2f}: {self.changes()})"

    def plot(self, path=None, ax=None):
        """Waterfall: the starting throughput, each item's measured change, the result."""
        from .waterfall import waterfall
        return waterfall(self, path=path, ax=ax)


def _describe(c: TrainConfig) -> str:
    return (f"batch {c.batch_size} x accumulate {c.accumulate_grad_batches}, {c.num_workers} workers, "
            f"{c.device_type}, {c.precision}, {c.world_size} process(es)")


class _Walk:
    def __init__(self, engine, budget_s: float, trial_s: float, memory_budget, min_gain: float, clock, t0: float):
        self.engine, self.clock, self.t0 = engine, clock, t0
        self.budget_s, self.trial_s, self.min_gain = budget_s, trial_s, min_gain
        self.overhead_s = 0.5  # start-up and restore per trial; re-estimated from each trial
        self.trials = 0
        self.rate = float("nan")  # samples/s of the config the walk has kept so far
        self.snapshot = trial.Snapshot(engine)
        self.limit, _ = memory_limit(memory_budget, engine.device) if engine.device.type == "cpu" \
            else (None, "")

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0)

    def measure(self, config: TrainConfig) -> Tried | None:
        """One timed trial; None when the budget has no room left for it."""
        seconds = min(self.trial_s, self.left() - self.overhead_s)
        if seconds < 0.25 * self.trial_s:
            return None
        t0 = self.clock()
        try:
            m = trial.measure(self.engine, config, seconds=seconds)
            note = m.error
            if not note and self.limit is not None and config.device_type == "cpu" and m.peak_bytes > self.limit:
                note = f"over the memory budget (peak {m.peak_bytes / 2**20:,.0f} MB)"
        except Exception as error:  # noqa: BLE001 - out of memory is a result; anything else is raised
            if not _is_oom(error):
                raise
            note = "out of memory"
            m = None
        finally:
            self.snapshot.restore()
            trial.release_memory()
        self.trials += 1
        self.overhead_s = max(0.2, 0.5 * self.overhead_s + 0.5 * (self.clock() - t0 - seconds))
        ok = m is not None and not note and m.samples_per_s == m.samples_per_s
        return Tried("", config, m.samples_per_s if ok else None, note)


def checklist(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
              budget_s: float = 60.0, keep_best: bool = False, target_global_batch: int | None = None,
              items=ITEMS, trial_s: float | None = None, min_gain: float = 0.03, memory_budget=None,
              clock=time.monotonic, **parts) -> ChecklistResult:
    """Walk the checklist on the live model within `budget_s` seconds of `clock`; see the module docstring."""
    problems = []
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        problems.append(f"budget_s={budget_s!r}: a number of seconds > 0")
    unknown = [i for i in items if i not in ITEMS]
    if unknown:
        problems.append(f"items={list(items)!r}: each one of {', '.join(ITEMS)}")
    if target_global_batch is not None and (isinstance(target_global_batch, bool)
                                            or not isinstance(target_global_batch, int) or target_global_batch < 1):
        problems.append(f"target_global_batch={target_global_batch!r}: a whole number >= 1, or None")
    if not 0 <= min_gain < 1:
        problems.append(f"min_gain={min_gain!r}: a fraction in [0, 1) (smallest speed-up worth keeping)")
    if not callable(clock):
        problems.append(f"clock={clock!r}: a function returning seconds, like time.monotonic")
    if problems:
        raise ValueError("nbtrain.checklist: " + "; ".join(problems))
    t0 = clock()  # the budget counts from here: finding the engine is part of the walk
    engine = trial.resolve(model, train_data, recipe=recipe, config=config, **parts)
    start = trial.plain_config(engine.config)
    trial_s = trial_s or min(max(budget_s / 14, 0.5), 5.0)
    walk = _Walk(engine, float(budget_s), trial_s, memory_budget, min_gain, clock, t0)
    skipped, results = [], []
    current, finished = start, False
    try:
        base = walk.measure(start)
        if base is None or base.samples_per_s is None:
            raise RuntimeError(f"nbtrain.checklist: budget_s={budget_s:g} left no time to measure the starting "
                               f"config; allow more (e.g. budget_s=30)" if base is None else
                               f"nbtrain.checklist: the starting config could not be measured ({base.note})")
        current, rate = start, base.samples_per_s
        for name in items:
            walk.rate = rate
            outcome = _ITEM_FUNCTIONS[name](walk, engine, start, current, target_global_batch)
            if isinstance(outcome, str):
                skipped.append((name, outcome))
                continue
            tried = [t for t in outcome if t.samples_per_s is not None or t.note]
            if not tried:
                skipped.append((name, f"time budget: {max(walk.left(), 0):.1f} s left"))
                continue
            best = max((t for t in tried if t.samples_per_s), key=lambda t: t.samples_per_s, default=None)
            required = name == "accumulation"  # asked for by target_global_batch, kept for its own sake
            keep = best is not None and (required or best.samples_per_s > rate * (1 + min_gain))
            after = best.samples_per_s if keep else rate
            results.append(ItemResult(name, tried, rate, after, keep, best.label if keep else ""))
            if keep:
                current, rate = best.config, best.samples_per_s
        finished = True
    finally:
        walk.snapshot.restore(current if keep_best and finished else None)
    lr_note = ""
    if current.scale_lr != "none":
        lr_note = (f"{current.scale_lr} rule: x{current.lr_factor():.3g} for global batch {current.global_batch_size} "
                   f"vs {current.base_batch_size}" + (f", linear warm-up over {current.warmup_steps} steps"
                                                      if current.warmup_steps else
                                                      "; add warmup_steps (linear warm-up) for large scale-ups"))
    return ChecklistResult(start, current, base.samples_per_s, results, skipped, float(budget_s),
                           clock() - t0, walk.trials, str(engine.device), lr_note, keep_best)


# --- the items: each returns the candidates it measured, or a reason it did not apply ----------

def _try_all(walk, configs_and_labels, stop_when_worse: bool = False):
    """Measure candidates in order; stop at one that does not fit, or (when asked) past the peak:
    two candidates in a row slower than the best so far by more than min_gain."""
    tried = []
    for label, config in configs_and_labels:
        t = walk.measure(config)
        if t is None:
            break
        t.label = label
        tried.append(t)
        if t.samples_per_s is None:
            break  # too big / out of memory: larger candidates will not fit either
        best = max([walk.rate] + [x.samples_per_s for x in tried if x.samples_per_s])
        behind = best * (1 - walk.min_gain)
        if stop_when_worse and len(tried) >= 2 and all(x.samples_per_s < behind for x in tried[-2:]):
            break  # two in a row behind the best: one slow trial on a busy machine is not enough
    return tried


def _workers(walk, engine, start, current, target):
    counts = [n for n in worker_candidates(current) if n != current.num_workers]
    if not counts:
        return "no other worker count to try on this machine"
    return _try_all(walk, [(f"num_workers={n}", with_workers(current, n)) for n in counts])


def _batch_size(walk, engine, start, current, target):
    sizes = [b for b in batch_candidates(current, len(engine.recipe.train_data) // engine.world.size, target)
             if b > current.batch_size]
    if not sizes:
        return "no larger batch fits 8 batches per epoch" + (" within the target global batch" if target else "")
    return _try_all(walk, [(f"batch_size={b}", with_batch(current, b, start)) for b in sizes],
                    stop_when_worse=True)


def _accumulation(walk, engine, start, current, target):
    if not target:
        return "no target_global_batch given"
    k = math.ceil(target / (current.batch_size * current.world_size))
    if k <= current.accumulate_grad_batches:
        return f"global batch {current.global_batch_size} already reaches the target {target}"
    c = current.replace(accumulate_grad_batches=k)
    if c.scale_lr == "none":
        c = c.replace(scale_lr="linear", base_batch_size=start.global_batch_size)
    return _try_all(walk, [(f"accumulate_grad_batches={k}", c)])


def _device(walk, engine, start, current, target):
    if not torch.cuda.is_available():
        return "no GPU (CUDA is not available on this machine)"
    if current.device_type == "cuda":
        return "already on the GPU"
    return _try_all(walk, [("accelerator='cuda'", current.replace(accelerator="cuda"))])


def _precision(walk, engine, start, current, target):
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
    return _try_all(walk, runnable)


def _ddp(walk, engine, start, current, target):
    if importlib.util.find_spec(f"{__package__}.launch") is None:
        return "the DDP launcher (nbtrain.launch) is not part of this install"
    try:
        from . import launch  # noqa: F401
    except ImportError as error:
        return f"the DDP launcher (nbtrain.launch) does not import: {error}"
    try:
        c = current.replace(devices=2)
    except ConfigError as error:
        return error.render()
    needed = walk.trial_s + max(walk.overhead_s, _DDP_START_S)
    if walk.left() < needed:
        return f"time budget: starting 2 worker processes needs about {needed:.0f} s, {max(walk.left(), 0):.0f} s left"
    from .api import fit
    # Half the steps the current config trains in one trial's time: DDP on a busy machine may be
    # slower, and its workers' start-up comes on top (the workers measure their own rate).
    steps = max(10, int(walk.rate * walk.trial_s / c.global_batch_size / 2))
    try:
        result = fit(recipe=engine.recipe, config=c.replace(max_steps=steps, max_epochs=None))
        rate = result.summary.get("samples_per_s")
        tried = Tried("devices=2", c, rate if result.status == "completed" else None,
                      "" if result.status == "completed" else result.status)
    finally:
        walk.snapshot.restore()
        walk.trials += 1
    return [tried]


def _optimizer_impl(walk, engine, start, current, target):
    from .toggles import with_implementation
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
    return _try_all(walk, runnable)


def _channels_last(walk, engine, start, current, target):
    from .toggles import has_conv2d
    if current.channels_last:
        return "already channels_last"
    if not has_conv2d(engine.model):
        return "the model has no 2-D convolutions, so its activations are not 4-D images"
    return _try_all(walk, [("channels_last=True", current.replace(channels_last=True))])


def _matmul_precision(walk, engine, start, current, target):
    if current.device_type != "cuda":
        return f"TF32 matmuls are a CUDA feature; this run is on {current.device_type}"
    if current.matmul_precision == "high":
        return "already matmul_precision='high'"
    return _try_all(walk, [("matmul_precision='high'", current.replace(matmul_precision="high"))])


def _compile(walk, engine, start, current, target):
    if current.compile != "none":
        return f"already compiled (mode {current.compile!r})"
    if walk.left() < _COMPILE_MIN_LEFT_S:
        return (f"compiling does not fit the {max(walk.left(), 0):.0f} s left of the budget; train once with "
                f"compile='default' alone: its summary measures the compile cost and the step count at which it pays off")
    return _try_all(walk, [("compile='default'", current.replace(compile="default"))])


def _activation_checkpointing(walk, engine, start, current, target):
    return ("it trades speed for memory (activations recomputed in backward), so it cannot speed up a run that fits; "
            "use it with find_batch_size when the batch is memory-bound")


_ITEM_FUNCTIONS = {"workers": _workers, "batch_size": _batch_size, "accumulation": _accumulation,
                   "device": _device, "precision": _precision, "optimizer_impl": _optimizer_impl,
                   "channels_last": _channels_last, "matmul_precision": _matmul_precision, "compile": _compile,
                   "activation_checkpointing": _activation_checkpointing, "ddp": _ddp}
