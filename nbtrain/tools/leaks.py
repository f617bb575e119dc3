"""Two detectors for the checklist's logging advice, run on the live model for a few steps.

- Graph retention: a step (or its logging) that keeps a loss *tensor* — e.g.
  `history.append(loss)` instead of `history.append(loss.item())` — keeps every step's
  autograd graph alive. While a few steps train, every tensor that carries a graph is
  tracked (a TorchFunctionMode notes where it was made); if the survivors grow with the
  steps, the report names where they are made, what holds them, and the line to change.
- Sync points: on CUDA, a few steps run under torch.cuda.set_sync_debug_mode("warn") and
  every synchronising call is attributed to the user's line that made it.

Both restore the model afterwards.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import linecache
import os
import re
import sys
import sysconfig
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from .. import plotting
from . import trial
from ..config import TrainConfig
from ..metrics import MetricsLog
from ..places import place
from .tool_options import declare, option

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_NBTRAIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
_INTERNALS = "nbtrain/torch internals (e.g. the log-window read-back)"


def _is_stdlib(filename: str) -> bool:
    # A conda or system Python keeps its site-packages inside the stdlib's folder: a package there is not
    # Python's own (a user's package may be installed there).
    if not filename.startswith(_STDLIB_DIR):
        return False
    return not filename[len(_STDLIB_DIR):].startswith(("site-packages", "dist-packages"))


def _user_frame(frames):
    """The innermost (file, line) of the user's code, walking out from where a call happened.

    Frames are told apart by what is nbtrain's, torch's and Python's own, never by where the user's
    file is (a notebook cell's temporary file, a test inside a repository, a module beside the
    notebook, a package in site-packages): torch's and Python's frames are passed through (a user's
    forward runs inside nn.Module.__call__); reaching nbtrain's own frames first means nbtrain made
    the call.
    """
    for filename, lineno in frames:
        if filename.startswith(_NBTRAIN_DIR):
            return None
        if filename.startswith((_TORCH_DIR, "<frozen")) or _is_stdlib(filename):
            continue
        return filename, lineno
    return None


def _stack_user_frame(skip: int = 2):
    """_user_frame of the stack from `skip` frames out (1: this function's caller), so that the frames of
    nbtrain's own hook (a TorchFunctionMode, a warning handler) are not what it finds first."""
    frame = sys._getframe(skip)
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return _user_frame(frames)


class _GraphTracker(TorchFunctionMode):
    """Notes every tensor that carries an autograd graph, with the user line that made it."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[weakref.ref, tuple | None, int]] = []
        self.step = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    self.made.append((weakref.ref(t), _stack_user_frame(), self.step))
        return out

    def alive(self):
        return [(ref(), site, step) for ref, site, step in self.made if ref() is not None]


@dataclass
class LeakReport:
    leaking: bool
    alive_per_step: list            # graph-carrying tensors alive after each step
    memory_per_step: list           # bytes (process RSS or CUDA allocated) after each step
    message: str
    sites: list = field(default_factory=list)   # (file, line, source text, count) where survivors were made
    holders: list = field(default_factory=list)  # descriptions of what holds them
    fix: str = ""

    def table(self) -> str:
        lines = [f"nbtrain graph-retention check: {self.message}"]
        lines.append("  graph tensors alive after each step: " + " ".join(map(str, self.alive_per_step)))
        if self.memory_per_step:
            growth = (self.memory_per_step[-1] - self.memory_per_step[0]) / 2**20
            lines.append(f"  memory after each step grew by {growth:+.2f} MB over {len(self.memory_per_step)} steps")
        for file, line, text, count in self.sites:
            lines.append(f"  made at {place(file, line)}  {text}  ({count} alive)")
        lines += [f"  held by {h}" for h in self.holders]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)

    def plot(self, path=None, ax=None):
        with plotting.axes(path, ax, figsize=(5, 3)) as ax:
            ax.plot(range(1, len(self.alive_per_step) + 1), self.alive_per_step, marker="o",
                    color="tab:red" if self.leaking else "tab:green")
            ax.set_xlabel("step")
            ax.set_ylabel("tensors holding a graph")
            ax.set_title(self.message[:80], fontsize=8)
        return ax.figure


@declare("find_leaks", "nbtrain.leaks.find_graph_leaks", "graph-retention detector: loss tensors kept across "
         "steps, and the line to change", (
             option("steps", "whole", "steps to watch", note="steps to watch", low=4, flag="steps"),),
         figsize=(5, 3))
def find_graph_leaks(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
                     steps: int = 10, **parts) -> LeakReport:
    """Train `steps` steps and report tensors that keep autograd graphs alive across steps."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        return _watch_graphs(lent.engine, steps)


def _watch_graphs(engine, steps: int) -> LeakReport:
    start = trial.plain_config(engine.config)
    tracker = _GraphTracker()
    alive, memory = [], []
    from ..engine.memory import current_rss

    def after_step(event, log):
        if event["type"] != "steps":
            return
        tracker.step += 1
        alive.append(len(tracker.alive()))
        memory.append(torch.cuda.memory_allocated(engine.device) if engine.device.type == "cuda" else current_rss())

    log = MetricsLog()
    log.subscribe(after_step)
    gc.collect()
    try:
        with tracker:
            trial.measure(engine, start.replace(log_every_n_steps=1), steps=steps, warmup_steps=0, log=log)
        gc.collect()
        survivors = [(t, site, step) for t, site, step in tracker.alive() if step >= 1]
        grew = len(alive) >= 4 and alive[-1] - alive[1] >= 0.5 * (len(alive) - 2) \
            and all(b >= a for a, b in zip(alive[1:], alive[2:]))
        return _report(grew, alive, memory, survivors, engine.recipe)
    finally:
        del tracker


def _report(leaking, alive, memory, survivors, recipe) -> LeakReport:
    if not leaking:
        return LeakReport(False, alive, memory, f"clean: tensors holding graphs do not accumulate over "
                                                f"{len(alive)} steps (at most {max(alive)} alive at a step end)")
    per_step = (alive[-1] - alive[1]) / (len(alive) - 2)
    counts: dict = {}
    for _, site, _ in survivors:
        counts[site] = counts.get(site, 0) + 1
    sites = [(s[0], s[1], linecache.getline(s[0], s[1]).strip(), n)
             for s, n in sorted(counts.items(), key=lambda kv: -kv[1]) if s is not None]
    holders, names = [], []
    for t, _, _ in survivors[-3:]:
        for description, name in _holders(t):
            if description not in holders:
                holders.append(description)
                names.append(name)
    fix = _fix_line(recipe, names, sites)
    message = (f"graph retention: tensors holding autograd graphs grow by {per_step:.1f} per step "
               f"({alive[-1]} alive after {len(alive)} steps); keep numbers with .item() or .detach()")
    return LeakReport(True, alive, memory, message, sites, holders, fix)


def _holders(tensor):
    """What keeps `tensor` alive: containers, and the global or attribute names they go by."""
    found = []
    for ref in gc.get_referrers(tensor):
        if isinstance(ref, (list, dict, set, tuple)) and not inspect.isframe(ref):
            for outer in gc.get_referrers(ref):
                if isinstance(outer, dict):
                    for key, value in outer.items():
                        if value is ref and isinstance(key, str):
                            scope = outer.get("__name__", "an object") if "__builtins__" in outer or \
                                "__name__" in outer else "an object"
                            found.append((f"{type(ref).__name__} `{key}` (in {scope})", key))
    return found


def _fix_line(recipe, names, sites) -> str:
    """The line in the user's step that stores the tensor, else the line that makes it."""
    functions = [f for f in (recipe.training_step, recipe.loss_fn, getattr(recipe.model, "forward", None))
                 if f is not None]
    for fn in functions:
        try:
            lines, first = inspect.getsourcelines(fn)
            file = inspect.getsourcefile(fn)
        except (OSError, TypeError):
            continue
        for offset, text in enumerate(lines):
            if any(re.search(rf"\b{re.escape(n)}\b", text) for n in names):
                return (f"{place(file, first + offset)}  `{text.strip()}` stores a tensor that holds its graph; "
                        "store `.item()` (a number) or `.detach()` instead")
    if sites:
        file, line, text, _ = sites[0]
        return f"{place(file, line)}  `{text}` makes the tensors that are kept; keep `.item()` or `.detach()` of them"
    return "keep `.item()` or `.detach()` of losses you log, never the loss tensor itself"


# --- sync points ------------------------------------------------------------------------------

@dataclass
class SyncReport:
    available: bool
    message: str
    sites: list = field(default_factory=list)   # (where, source text, count)

    def table(self) -> str:
        lines = [f"nbtrain sync-point check: {self.message}"]
        lines += [f"  {count:4d} x  {where}  {text}" for where, text, count in self.sites]
        return "\n".join(lines)

    def plot(self, path=None, ax=None):
        return plotting.bar_plot([w for w, _, _ in self.sites] or ["none"], [c for _, _, c in self.sites] or [0],
                         "host/device syncs per site", "syncs", path, ax)


class SyncCounter:
    """Counts torch's sync warnings ("called a synchronizing CUDA operation") by the user's line that made
    them; `watching()` handles every warning raised inside it."""

    def __init__(self):
        self.counts: dict = {}

    def note(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        # From the warnings module's frame out: this handler's own frame is nbtrain's, and would make
        # every sync nbtrain's.
        site = _stack_user_frame(skip=2)
        key = place(*site) if site else _INTERNALS
        text = linecache.getline(*site).strip() if site else ""
        self.counts[(key, text)] = self.counts.get((key, text), 0) + 1

    @contextlib.contextmanager
    def watching(self):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = self.note
            yield self

    def sites(self) -> list:
        """(where, source text, count), the most frequent first."""
        return [(k, t, n) for (k, t), n in sorted(self.counts.items(), key=lambda kv: -kv[1])]


@declare("find_sync", "nbtrain.leaks.find_sync_points", "sync-point detector (CUDA): where the step forces "
         "host/device synchronisation", (
             option("steps", "whole", "steps to watch", note="steps to watch", low=1, flag="steps"),),
         figsize=(7, 3))
def find_sync_points(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None,
                     steps: int = 5, **parts) -> SyncReport:
    """On CUDA: where the step forces host/device synchronisations (torch's sync debug mode)."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        engine = lent.engine
        if engine.device.type != "cuda":
            return SyncReport(False, f"needs CUDA: this model trains on {engine.device.type}, and "
                                     "torch.cuda.set_sync_debug_mode only watches CUDA synchronisations")
        counter = SyncCounter()
        previous = torch.cuda.get_sync_debug_mode()
        with counter.watching():
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trial.measure(engine, trial.plain_config(engine.config), steps=steps, warmup_steps=0)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
    sites = counter.sites()
    user = sum(n for k, _, n in sites if k != _INTERNALS)
    message = (f"{user} synchronisations from your code in {steps} steps" if user
               else f"no synchronisation from your code in {steps} steps")
    return SyncReport(True, message, sites)
