"""Bottleneck breakdown: where a training step's time goes, measured on the live model, in words.

    d = nbtrain.profile(recipe, config=TrainConfig(batch_size=64), steps=20)
    print(d.table())      # per-phase ms/step and share, and the verdict
    d.plot("phases.png")  # one stacked bar

A few steps are trained with the engine's own loop and its per-phase clocks; on CUDA the
device is synchronised at every phase boundary while profiling (only then), so kernel time
is charged to the phase that launched it. The machine's ceilings are measured apart
(tools/ceilings.py: data, host, compute and memory, each a rate with its interval) and the
verdict says what both show: the binding ceiling and by how much, the share of the step it
costs, and the remedies in the order the numbers favour. It measures in a trial: the live engine is
never reached and the model is given back. With `trace="run.json"` a second, short trial runs
under torch.profiler and writes a Chrome trace (open it in Perfetto); its timings are not mixed
into the breakdown.
"""
from __future__ import annotations

import os
import textwrap
import time
import weakref
from dataclasses import dataclass, field

from .. import plotting
from . import trial
from ..config import TrainConfig
from ..format import PrintsAsTable
from ..hardware import usable_cores
from ..measure.ceilings import Ceilings
from ..measure.device_rates import union_length
from ..measure.steady import NOTHING, SteadyRate, of_columns
from ..metrics import MetricsLog
from ..records import samples_start
from .ceilings import measure_ceilings
from .tool_options import ToolRefusal, declare, option

PHASE_LABELS = {"data": "data wait", "h2d": "host-to-device", "forward": "forward", "backward": "backward",
                "optimizer": "optimizer", "grad_sync": "gradient sync", "other": "other (loop, logging)"}
PHASE_COLORS = {"data": "tab:red", "h2d": "tab:orange", "forward": "tab:blue", "backward": "tab:cyan",
                "optimizer": "tab:green", "grad_sync": "tab:purple", "other": "tab:grey"}
BOUND_SHARE = 0.3  # a phase with this share of the step (and the largest share) is the bottleneck


@dataclass
class Diagnosis(PrintsAsTable):
    config: TrainConfig
    device: str
    phase_ms: dict              # measured mean ms per optimizer step, by phase
    step_ms: float
    samples_per_s: float
    steps: int
    synced: bool                # phase clocks synchronised with the device
    kind: str                   # data-bound | transfer-bound | optimizer-bound | sync-bound | compute-bound, or
                                # with the ceilings: host-bound | compute-bound | memory-bound
    verdict: str
    suggestions: list = field(default_factory=list)
    trace_path: str | None = None
    grad_sync_ms: float | None = None  # DDP only: all-reduce in flight per step (overlaps backward)
    steady: SteadyRate = NOTHING       # the steps' steady rate with its interval (samples_per_s is its rate)
    ceilings: Ceilings | None = None   # measured apart: loader alone, model alone, FLOPs

    @property
    def fractions(self) -> dict:
        return {k: v / self.step_ms for k, v in self.phase_ms.items()} if self.step_ms > 0 else {}

    def table(self) -> str:
        lines = [f"nbtrain bottleneck breakdown ({self.steps} steps measured on {self.device}, "
                 f"batch {self.config.batch_size}, {self.config.num_workers} workers, {self.config.precision}"
                 f"{', device synchronised per phase' if self.synced else ''})"]
        width = max(len(label) for label in PHASE_LABELS.values())
        for name, ms in self.phase_ms.items():
            lines.append(f"  {PHASE_LABELS[name]:<{width}}  {ms:9.3f} ms  {100 * self.fractions[name]:5.1f}%")
        lines.append(f"  {'step':<{width}}  {self.step_ms:9.3f} ms  ({self.steady.text()})")
        if self.grad_sync_ms is not None:
            lines.append(f"  {PHASE_LABELS['grad_sync']:<{width}}  {self.grad_sync_ms:9.3f} ms  "
                         f"{100 * self.grad_sync_ms / self.step_ms:5.1f}% (all-reduce in flight, overlapping backward)")
        if self.ceilings is not None:
            lines.append("the four ceilings, each measured alone, binding first:")
            lines += self.ceilings.lines(self.samples_per_s)
        lines.append(f"verdict: {self.verdict}")
        lines += [f"  try: {s}" for s in self.suggestions[1:]]
        if self.trace_path:
            lines.append(f"torch.profiler trace: {self.trace_path} (open in https://ui.perfetto.dev)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Diagnosis({self.verdict!r})"

    def plot(self, path=None, ax=None):
        """One horizontal stacked bar of the step, by phase; saved to `path` when given."""
        with plotting.axes(path, ax, figsize=(8, 1.9)) as ax:
            left = 0.0
            for name, ms in self.phase_ms.items():
                ax.barh([0], [ms], left=left, color=PHASE_COLORS[name], label=f"{PHASE_LABELS[name]} {ms:.2f} ms")
                left += ms
            ax.set_yticks([])
            ax.set_xlabel("ms per optimizer step")
            # The verdict is a sentence or two: wrapped, so a narrow figure never cuts it off.
            ax.set_title(textwrap.fill(self.verdict, 110), fontsize=8, loc="left")
            # Below the bar, inside the figure: a constrained layout makes room for an "outside" legend.
            outside = ax.figure.get_layout_engine() is not None
            ax.figure.legend(ncol=4, fontsize=7, frameon=False,
                             loc="outside lower center" if outside else "lower center")
        return ax.figure


def verdict_for(phase_ms: dict, step_ms: float, config: TrainConfig, device: str, cores: int | None = None,
                ceilings: Ceilings | None = None):
    """(kind, verdict sentence, suggestions) from measured phase times, with the ceilings' evidence when given.

    The phases say where the step's time goes; the four ceilings say what bounds it. Where forward and
    backward take the step, the ceilings tell whose time that is (the host's fixed cost, the device's
    arithmetic or its memory traffic), and their remedies, in their order, replace the generic ones.
    """
    kind, verdict, tips = _phase_verdict(phase_ms, step_ms, config, device, cores)
    if ceilings is None:
        return kind, verdict, tips
    bound = ceilings.bottleneck()
    head, _, rest = verdict.partition(": ")
    remedies = [r.text for r in bound.remedies] or tips
    where = rest.partition("; try ")[0]
    if kind == "compute-bound" and bound.binding != "data":
        return bound.kind, (f"{bound.kind}: {ceilings.evidence()} ({ceilings.margin()}); {where}; "
                            f"try {remedies[0]}"), remedies
    if kind == "data-bound" and bound.binding == "data":  # the ceilings agree: they say by how much
        return kind, f"{head}: {ceilings.evidence()} ({ceilings.margin()}); {where}; try {remedies[0]}", remedies
    # Measured apart the other side binds; together they compete for the same cores (or a worker
    # restarts each epoch): say both, the training's own share first.
    if (bound.binding == "data") == (kind == "data-bound"):  # a transfer, optimizer or sync phase binds
        return kind, f"{verdict}; the ceilings: {ceilings.verdict}", tips
    return kind, (f"{head} in training: {rest}; measured alone the ceilings say {bound.kind} "
                  f"({ceilings.evidence()}): the loader and the model slow each other down when they run "
                  f"together on {cores or usable_cores()} cores"), tips


def _phase_verdict(phase_ms: dict, step_ms: float, config: TrainConfig, device: str, cores: int | None = None):
    cores = cores or usable_cores()
    share = {k: v / step_ms for k, v in phase_ms.items()} if step_ms > 0 else {}
    compute = share.get("forward", 0) + share.get("backward", 0)
    candidates = {"data": share.get("data", 0), "h2d": share.get("h2d", 0), "optimizer": share.get("optimizer", 0),
                  "grad_sync": share.get("grad_sync", 0), "compute": compute}
    top = max(candidates, key=candidates.get)
    pct = f"{100 * candidates[top]:.0f}%"
    workers = config.num_workers
    if top == "data" and candidates["data"] >= BOUND_SHARE:
        more = min(max(2, 2 * workers), max(cores - 1, 1))
        tips = []
        if more > workers:
            tips.append(f"num_workers={more}")
        if workers > 0:  # workers already run and still cannot keep up
            tips.append("precompute the deterministic per-sample work once: nbtrain.cache(dataset, path)")
        if not config.persistent_workers and workers > 0:
            tips.append("persistent_workers=True (no worker restart each epoch)")
        if not tips:
            tips.append("nbtrain.cache(dataset, path), or lighter per-sample work")
        return "data-bound", f"data-bound: {pct} of the step waits for the DataLoader; try {tips[0]}", tips
    if top == "h2d" and candidates["h2d"] >= BOUND_SHARE:
        tips = ["pin_memory=True (copies then overlap with compute)" if not config.pin else
                "send smaller tensors (e.g. uint8 images) and convert them on the device"]
        return "transfer-bound", f"transfer-bound: {pct} of the step copies batches to {device}; try {tips[0]}", tips
    if top == "optimizer" and candidates["optimizer"] >= BOUND_SHARE:
        tips = ["a larger batch_size (fewer optimizer steps per sample)",
                "a fused or foreach optimizer (e.g. torch.optim.AdamW(params, fused=True) on CUDA)"]
        return "optimizer-bound", f"optimizer-bound: {pct} of the step is the optimizer update; try {tips[0]}", tips
    if top == "grad_sync" and candidates["grad_sync"] >= BOUND_SHARE:
        tips = ["accumulate_grad_batches=2 (gradients sync once per optimizer step)", "a larger batch_size"]
        return "sync-bound", f"sync-bound: {pct} of the step synchronises gradients; try {tips[0]}", tips
    tips = []
    if device == "cpu":
        from ..hardware import inventory
        if "cuda" in inventory().accelerators():
            tips.append("accelerator='cuda'")
        tips.append("precision='bf16-mixed' (if this CPU has fast bf16)")
    elif config.precision == "32-true":
        tips.append("precision='bf16-mixed'")
    tips.append("a larger batch_size (nbtrain.tune.find_batch_size) with scale_lr='linear'")
    return ("compute-bound", f"compute-bound: {100 * compute:.0f}% of the step is forward and backward; "
            f"try {tips[0]}", tips)


class GradSyncClock:
    """Times DDP's gradient all-reduce through a communication hook (the default averaging, timed).

    Buckets are all-reduced while backward still runs, so the clock keeps the union of the
    intervals during which any bucket was in flight: "gradient sync in flight", which overlaps
    the backward phase rather than adding to it.
    """

    _clocks: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self):
        self.intervals: list[tuple[float, float]] = []
        self.active = False

    @classmethod
    def on(cls, ddp_model) -> "GradSyncClock":
        clock = cls._clocks.get(ddp_model)
        if clock is None:  # a DDP model takes one hook for its lifetime
            clock = cls._clocks[ddp_model] = cls()
            ddp_model.register_comm_hook(None, clock._hook)
        return clock

    def _hook(self, state, bucket):
        import torch.distributed as torch_dist
        start = time.perf_counter()
        tensor = bucket.buffer().div_(torch_dist.get_world_size())
        future = torch_dist.all_reduce(tensor, async_op=True).get_future()

        def done(f):
            if self.active:
                self.intervals.append((start, time.perf_counter()))
            return f.value()[0]
        return future.then(done)

    def seconds(self) -> float:
        return union_length(self.intervals)


@declare("profile", "nbtrain.profile", "bottleneck breakdown: per-phase step time as a stacked bar, the step's "
         "four ceilings (data, host, compute, memory), and a verdict in words with remedies in order", (
             option("steps", "whole", "optimizer steps to measure", note="optimizer steps to measure", low=1,
                    flag="steps"),
             option("warmup_steps", "whole", "steps not counted", note="steps not counted", low=0),
             option("seconds", "number", "stop measuring after this many seconds", noun="a number of seconds",
                    none="steps alone", above=0, nullable=True),
             option("trace", "path", "also write a torch.profiler trace (open in Perfetto)",
                    allowed="a file path, or None", flag="trace"),
             option("ceilings", "switch", "also measure the machine's ceilings")),
         label="Bottleneck breakdown", figsize=(8, 2.6))
def diagnose(model=None, train_data=None, *, recipe=None, config: TrainConfig | None = None, steps: int = 20,
             warmup_steps: int = 3, seconds: float | None = None, trace: str | os.PathLike | None = None,
             ceilings: bool = True, **parts) -> Diagnosis:
    """Measure where the step time goes for the current config, and (`ceilings`) the machine's ceilings
    for it, in a trial (the model is given back bit for bit)."""
    trace_path, ceiling, log = None, None, MetricsLog()
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        engine = lent.engine
        config = trial.plain_config(engine.config)
        clock = GradSyncClock.on(engine.train_model) if hasattr(engine.train_model, "register_comm_hook") else None
        if clock is not None:
            clock.intervals, clock.active = [], True
        m = trial.measure(engine, config, steps=steps + warmup_steps, seconds=seconds,
                          warmup_steps=warmup_steps, sync_phases=True, log=log)
        if clock is not None:
            clock.active = False
        lent.reset()
        if trace is not None:
            trace_path = _write_trace(engine, config, trace)
            lent.reset()
        # Ranks measuring apart would each stop at their own time; under DDP only the breakdown is shown.
        if ceilings and not engine.world.distributed and m.ok:
            ceiling = measure_ceilings(engine)
    if not m.ok:
        raise ToolRefusal(lambda spell: f"the step could not be measured: {m.error}")
    phases = dict(m.phase_ms)
    phases["other"] = max(m.step_ms - sum(phases.values()), 0.0)
    sync_ms = 1000 * clock.seconds() / max(m.steps, 1) if clock is not None else None
    device = engine.device.type
    kind, verdict, tips = verdict_for({**phases, **({"grad_sync": sync_ms} if sync_ms else {})}, m.step_ms,
                                      config, device, ceilings=ceiling)
    steady = of_columns(log.columns, samples_start(log))
    return Diagnosis(config, str(engine.device), phases, m.step_ms, steady.rate, max(m.steps - warmup_steps, 1),
                     device == "cuda", kind, verdict, tips, trace_path, sync_ms, steady, ceiling)


profile = diagnose


def _write_trace(engine, config: TrainConfig, path) -> str:
    from torch.profiler import ProfilerActivity, profile as torch_profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        trial.measure(engine, config, steps=3, warmup_steps=0)
    path = os.fspath(path)
    prof.export_chrome_trace(path)
    return path
