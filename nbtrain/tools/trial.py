"""Trials on the live model: measure a config on an engine of the trial's own, which borrows the model.

Every checklist tool (diagnose, tune, leaks, checklist, ab, ceilings) tries settings by really training a
few steps on the user's own model. `borrow` gives the tool a trial (engine/borrow.py): an engine of its
own over the model, starting where the live engine stands, with copies of its optimizer, schedule and
config and a loader of its own; the model's weights, buffers, gradients and every RNG go back bit for bit
when the trial closes, and the live engine is never reached, so nothing of it needs putting back.
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import ctypes
import dataclasses
import gc
import threading
import time
from dataclasses import dataclass, field

import torch

from ..config import TrainConfig, option_names
from ..engine import imports
from ..engine.borrow import Trial, own_parts
from ..adapters.lightning import is_lightning_module
from ..options import Problem
from ..recipe import Recipe
from ..records import samples_start
from .failure_causes import explained
from .tool_options import ToolOptionError

# What a tool's **parts may hold besides training options: the parts of a recipe, as nbtrain.fit takes them.
RECIPE_PARTS = ("loss_fn", "training_step", "optimizer", "val_data", "collate_fn", "scheduler", "scheduler_interval",
                "metrics", "validation_step")


def borrow(model=None, train_data=None, *, recipe: Recipe | None = None, config: TrainConfig | None = None,
           **parts) -> Trial:
    """A trial on a model (or a model + data given like `nbtrain.fit`, or a recipe), to use in a `with` block.

    A tool starts from the live engine as it is: what the call leaves out (the data, optimizer, its
    schedule, loss, metrics and the config) is the live engine's own, not a default AdamW or TrainConfig();
    training options are taken as fit takes them (`batch_size=64`), over `config`. The trial's engine is a
    fork of the live one (a model nbtrain has not trained yet gets an engine of the trial's own, attached to
    nothing), so the live engine is never reached.
    """
    from ..adapters import recipe_for
    from ..engine.engine import Engine
    # Before anything is built: an interrupt cannot land inside torch's lazy imports. A tool that is the process's
    # first call says what they cost (its tables have no summary to say it in, as nbtrain.fit's has).
    imports.say_first_call(imports.settle(), stacklevel=4)  # at the tool's caller: tool -> borrow -> say
    options = {name: value for name, value in parts.items() if name not in RECIPE_PARTS}
    parts = {name: value for name, value in parts.items() if name in RECIPE_PARTS}
    check_option_names(options)
    if isinstance(model, Recipe):
        recipe, model = model, None
    live = live_engine_of(recipe.model if recipe is not None else model)
    if recipe is None and live is None:
        recipe = recipe_for(model, train_data, **parts)
    elif recipe is None and is_lightning_module(model):  # its own parts are the live ones (made once)
        live_data = live.recipe.fixed_loader or live.recipe.train_data
        recipe = recipe_for(model, train_data if train_data is not None else live_data, **parts)
    elif recipe is None:
        recipe = _live_recipe_with(live.recipe, train_data, parts)
    config = TrainConfig.of(config)
    if config is None:
        config = live.config if live is not None else TrainConfig()
    config = recipe.adopt_settings(config.replace(**options) if options else config)
    if live is not None:
        return live.trial(recipe, config)
    return Trial(recipe.model, lambda: Engine(own_parts(recipe), config), recipe=recipe)


def check_option_names(options: dict) -> None:
    """Refuse, in one message, keywords that are neither recipe parts nor training options."""
    known = option_names()
    unknown = [name for name in options if name not in known]
    if unknown:
        def allowed(name):
            near = difflib.get_close_matches(name, list(known) + list(RECIPE_PARTS), n=1)
            return (f"the tool's own options, a recipe part ({', '.join(RECIPE_PARTS)}) or a training option as "
                    f"nbtrain.fit takes it (batch_size, max_steps, ... or config=TrainConfig(...))"
                    + (f"; did you mean {near[0]!r}?" if near else ""))
        raise ToolOptionError([Problem(name, options[name], allowed(name)) for name in unknown])


def live_engine_of(model):
    """The live engine (not running) of a model or a LightningModule, or None."""
    from ..api import live_engine
    if model is not None and is_lightning_module(model):
        slot = model.__dict__.get("_nbtrain_training")
        model = slot.value if slot is not None else None
    engine = live_engine(model) if model is not None else None
    return engine if engine is not None and not engine.running else None


def run_apart(lent: Trial, config: TrainConfig, steps: int):
    """`steps` steps of `config` as DDP in processes of their own, from the borrowed model's weights (the
    trial's `reset()` puts them back). Through the launcher itself, not nbtrain.fit: fit continues the live
    engine across calls (distributed/carry.py), and a trial never reaches it. `config`: the trial's (lent.engine's)
    or one made from it, whose DataLoader settings borrow adopted once: the ranks run it as the trial's own engine
    would, refused as that engine refuses a switch (a batching change on a DataLoader whose own sampler decides,
    an epoch with no full batch), and checked against this machine."""
    from ..config import check_runnable
    from ..distributed.launch import fit_distributed
    from ..engine.changes import check_batches
    recipe = lent.recipe or lent.engine.recipe
    config = config.replace(max_steps=steps, max_epochs=None)
    check_batches(lent.engine, config, recipe)
    check_runnable(config)
    return fit_distributed(recipe, config, stop=tool_stop())  # a panel's Stop ends the ranks too


def keep(trial: Trial, config: TrainConfig) -> None:
    """Leave the live model on `config` (a walk's keep_best), through the call a user's change goes through:
    the live engine of the trial's recipe (made and attached where the model has none yet) takes it."""
    from ..api import engine_for
    engine_for(trial.recipe, config)


def _live_recipe_with(live: Recipe, train_data, parts: dict) -> Recipe:
    """The live recipe with the parts this call gave (data comes with its own loader settings and collate)."""
    given = {name: value for name, value in parts.items() if value is not None}
    if train_data is not None:
        given = {"loader_settings": {}, "fixed_loader": None, "order_note": None, "collate_fn": None, **given,
                 "train_data": train_data}
    if "loss_fn" in given or "training_step" in given:  # a loss given replaces the live way to the loss
        given = {"loss_fn": None, "training_step": None, **given}
    return dataclasses.replace(live, **given)


# The stop of the tool running in this thread (the panel's Stop button), None outside stoppable().
_TOOL_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("nbtrain_tool_stop",
                                                                                     default=None)


@contextlib.contextmanager
def stoppable(stop: threading.Event):
    """Run a tool in this block so that setting `stop`, from any thread, ends it without an exception
    from outside: the run a trial is training ends at its next step boundary (stop is its caller's event,
    which no run clears), and the tool at its next block edge, the start or end of a measurement, with a
    KeyboardInterrupt raised there in the tool's own thread, as a kernel interrupt ends a tool: every
    trial gives the model back on the way out."""
    token = _TOOL_STOP.set(stop)
    try:
        yield
    finally:
        _TOOL_STOP.reset(token)


def tool_stop() -> threading.Event | None:
    """The stop event of the tool running in this thread (for runs it starts itself, e.g. DDP's workers)."""
    return _TOOL_STOP.get()


def stop_at_block_edge() -> None:
    """End the tool here when its stop was asked for (see stoppable)."""
    stop = _TOOL_STOP.get()
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt


@dataclass
class Measurement:
    """Throughput of one trial, from the steps after the warm-up (worker start-up excluded)."""
    config: TrainConfig
    samples_per_s: float
    steps: int
    seconds: float          # wall time of the whole trial, start-up included
    phase_ms: dict = field(default_factory=dict)  # mean per measured step
    step_ms: float = float("nan")
    peak_bytes: int = 0
    status: str = "completed"
    error: str = ""
    diverged: bool = False  # the error is a NaN/inf loss: the steps timed NaN arithmetic, not the config
    device_tail_s: float = 0.0  # CUDA: how long after the last step's host timestamp the device finished it

    @property
    def ok(self) -> bool:
        return not self.error


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@contextlib.contextmanager
def exact_cpu_peaks():
    """Make the process's peak RSS follow the live tensors while memory trials run (glibc).

    glibc serves a freed large block's size from its heap afterwards (its mmap threshold
    rises dynamically), so one trial's freed memory shapes the next trial's peak. During the
    trials, large blocks always come from mmap and go back on free; afterwards the threshold
    is left where glibc's own dynamic threshold settles at most (32 MB), so training keeps
    reusing heap memory as before.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
    mallopt(_M_TRIM_THRESHOLD, 128 * 1024)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)
        mallopt(_M_TRIM_THRESHOLD, 64 * 2**20)


def release_memory() -> None:
    """Hand freed memory back before a memory trial, so one trial's peak does not carry into the next."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    try:  # glibc keeps freed heap pages; malloc_trim returns them so RSS reflects live memory
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class AnyEvent:
    """Set as soon as any of its events is: one stop for a run made of a trial's deadline and the tool's Stop
    (a run reads only is_set())."""

    def __init__(self, *events: threading.Event | None):
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def measure(engine, config: TrainConfig, *, seconds: float | None = None, steps: int | None = None,
            warmup_steps: int = 2, sync_phases: bool = False, log=None) -> Measurement:
    """Train `config` on a trial's engine for `steps` optimizer steps or `seconds` (whichever first).

    The caller resets the trial (Trial.reset); this only measures. Throughput counts the steps after
    `warmup_steps`, so worker start-up and first-call costs are not charged to a config. The steps are
    training only: held-out evaluation at epoch ends would be charged to them.
    """
    from ..engine.memory import PeakMemory
    stop_at_block_edge()
    cap = steps if steps is not None else 10**9
    engine.reconfigure(config.replace(max_steps=cap, max_epochs=None))
    # The time limit is an event the run reads, not a call to engine.stop(): a timer that fires before the run
    # has begun (a short block on a busy machine) would stop nothing, and the trial would train to `cap`.
    deadline = threading.Event()
    timer = threading.Timer(seconds, deadline.set) if seconds is not None else None
    peak = PeakMemory(engine.device)
    t0 = time.perf_counter()
    try:
        if timer is not None:
            timer.start()
        peak.start()
        result = engine.run(log=log, stop=AnyEvent(deadline, tool_stop()), validate=False, sync_phases=sync_phases)
        peak_bytes = peak.peak()
    finally:
        if timer is not None:
            timer.cancel()
    wall = time.perf_counter() - t0
    stop_at_block_edge()
    if result.status == "interrupted":
        # A kernel interrupt ends the whole tool, not just this trial: the engine turned it into a stop
        # at a step boundary; raised again, every tool's trial gives the model back on the way out.
        raise KeyboardInterrupt
    cols = result.log.columns
    n = len(cols["step"])
    first = min(warmup_steps, max(n - 2, 0))  # keep at least two measured steps when there are few
    if n == 0:
        return Measurement(config, float("nan"), 0, wall, peak_bytes=peak_bytes, status=result.status,
                           error="no optimizer step finished")
    start = samples_start(result.log)
    points = ([(0.0, start)] if first == 0 else []) + list(zip(cols["time"], cols["samples"]))[max(first - 1, 0):]
    measured = range(first, n)
    phase_ms = {name[:-2]: 1000 * sum(cols[name][i] for i in measured) / len(measured)
                for name in ("data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")}
    step_ms = 1000 * sum(cols["step_s"][i] for i in measured) / len(measured)
    done = result.summary.device_done_s  # None: no CUDA device finished after the host
    tail = 0.0 if done is None else max(done - cols["time"][-1], 0.0)
    return Measurement(config, robust_rate(points), n, wall, phase_ms, step_ms, peak_bytes, result.status,
                       device_tail_s=tail)


def robust_rate(points, pieces: int = 5) -> float:
    """Samples/s over (time, samples) points: the median of a few consecutive pieces' rates.

    Each piece spans several steps (so a loader's bursts average out) and the median drops a
    piece that a passing load spike on a shared machine slowed down.
    """
    k = min(pieces, (len(points) - 1) // 3)
    if k < 3:
        (t0, s0), (t1, s1) = points[0], points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else float("nan")
    edges = [round(i * (len(points) - 1) / k) for i in range(k + 1)]
    rates = sorted((points[b][1] - points[a][1]) / (points[b][0] - points[a][0])
                   for a, b in zip(edges, edges[1:]) if points[b][0] > points[a][0])
    return rates[len(rates) // 2] if rates else float("nan")


def plain_config(config: TrainConfig) -> TrainConfig:
    """The config a trial measures: no budget of its own (the trial sets one); trials never
    write checkpoints or resume from one, since what they train is thrown away."""
    changes = {"max_steps": None, "max_epochs": None}
    names = set(config.to_dict())
    changes.update({name: None for name in ("checkpoint_every", "resume") if name in names})
    return config.replace(**changes)


def is_oom(error: BaseException) -> bool:
    """The error is the device running out of memory (a config that does not fit is a result, not a crash)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def failed(error: BaseException) -> str:
    """One line for a candidate a tool chose that raised: the tool shows it as a row and goes on (a config
    the tool chose itself must never lose what the tool measured before it)."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error
    text = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if any("Traceback (most recent call last)" in line for line in text):  # a worker's error wraps its traceback: the cause is last
        return explained(f"failed: {text[-1][:200]}")
    return explained(f"failed: {type(error).__name__}" + (f": {text[0][:200]}" if text else ""))
