"""The four ceilings of a training step for one config: data, host, compute, memory, as numbers.

    c = nbtrain.ceilings(recipe, config=TrainConfig(batch_size=64))
    print(c.table())   # each ceiling in samples/s with its interval, the binding one first, the verdict
    c.bottleneck()     # the verdict as data (measure/bottleneck.py): binding ceiling, ratios, remedies

Each ceiling is what the step could reach if only that limit were left, in samples/s:
- data: the engine's loader alone with the config's workers and batch, no model;
- host: the fixed per-step cost alone: the intercept of t(b) = host + device * b, from steps timed at the
  config's batch and at 2 samples of it;
- compute: the step's FLOPs at the peak FLOP/s of a matmul in the step's dtype, measured now;
- memory: the bytes the step's operations read and write, at the bandwidth of a large copy, measured now.
On CUDA the GPU's busy fraction says directly how much of the step the GPU waited for the host.

This module holds the readings (Ceilings) and what they say: each ceiling with its interval, the verdict
(bottleneck.py names the binding ceiling, by how much, and the remedies in the order the numbers favour),
its table and its figure. How they are read, in a trial that never reaches the live engine, is the
tool's: tools/ceilings.py.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

from ..config import TrainConfig
from ..format import PrintsAsTable, si
from .bottleneck import CEILINGS, LOOK_AT, Bottleneck, bottleneck
from .device_rates import Busy, HostSplit, Rate, StepCount
from .load import Load
from .noise_scale import NoiseScale
from .steady import SteadyRate
from .verdict import Verdict

COLORS = {"data": "tab:red", "host": "tab:orange", "compute": "tab:blue", "memory": "tab:green"}


@dataclass(frozen=True)
class ThreadRace:
    """The model alone at fewer torch threads beside it at the reading's own count, in alternating blocks: read
    where the reading's threads waited for a free CPU (an oversubscribed machine), so the remedy is a measured
    one. Threads change no math beyond the order of float sums."""
    threads: int                # the count the readings ran at
    fewer: int                  # the count raced beside it
    verdict: Verdict            # the model alone at `fewer` over at `threads`, paired blocks
    rate: float                 # median samples/s of the model alone at `fewer`

    def text(self) -> str:
        head = f"at {self.fewer} thread{'s' * (self.fewer != 1)} the model alone read {self.rate:,.0f} samples/s"
        return f"{head}, {self.verdict.text(f'num_threads={self.fewer} against {self.threads}')}"

    @property
    def remedy(self) -> str:
        """'num_threads=1: ...' where fewer threads were measurably faster; '' otherwise."""
        v = self.verdict
        if not v.faster:
            return ""
        return (f"num_threads={self.fewer}: the model alone {v.ratio:.1f}x faster than at {self.threads} threads "
                f"(95% interval {v.low:.2f}-{v.high:.2f}, {v.pairs} pairs of blocks); the same math, float sums "
                f"reordered")


@dataclass
class Ceilings(PrintsAsTable):
    config: TrainConfig
    device: str
    loader: SteadyRate          # samples/s the loader alone delivers
    model: SteadyRate           # samples/s the model alone trains at, its batch already on the device
    ratio: Verdict              # model alone over loader alone, with its interval
    counts: StepCount           # FLOPs, bytes and operations of one optimizer step
    step_samples: int
    peak: Rate                  # FLOP/s of a matmul in the step's dtype
    bandwidth: Rate             # bytes/s of a large copy
    split: HostSplit | None     # fixed and per-sample step time; None where a smaller batch could not run
    busy: Busy | None = None    # CUDA only
    low_precision_peak: Rate | None = None  # bf16 matmul FLOP/s, where the step runs in float32
    has_convolutions: bool = False
    held: bool = False          # batches cut from tensors held in memory (no DataLoader)
    source: str = "the DataLoader"
    cores: int = 0              # CPU cores the loader's workers may use (0: this process's, hardware.usable_cores)
    hold_refused: str | None = None  # why the held-data rule would not hold this data (None: it would, or does)
    peak_readings: tuple = ()  # the peak read before and after the model (empty: read once, or known before)
    model_load: Load | None = None  # other processes' share of the machine while the model alone was read
    loader_load: Load | None = None  # ... while the loader alone was read
    threads_race: ThreadRace | None = None  # fewer threads raced, where the model's threads waited for a CPU
    noise_scale: NoiseScale | None = None  # the gradient noise scale at this batch: the critical batch size
    raced: dict = field(default_factory=dict)  # remedy item -> its short A/B race on the live model (ABResult)

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def step_flops(self) -> float:
        return self.counts.flops

    def ceiling(self, name: str) -> Rate:
        """One ceiling in samples/s at the config's batch, with its 95% interval."""
        n = self.step_samples
        if name == "data":
            return Rate(self.loader.rate, self.loader.low, self.loader.high)
        if name == "host":
            if self.split is None:
                return Rate(math.nan, math.nan, math.nan)
            h = self.split.host_s
            return Rate(_per(n, h.value), _per(n, h.high), _per(n, h.low))
        work = self.counts.flops if name == "compute" else self.counts.bytes
        speed = self.peak if name == "compute" else self.bandwidth
        if work <= 0:
            return Rate(math.inf, math.inf, math.inf)
        if name == "compute" and self.beat_the_peak:
            # The step reached more FLOP/s than the matmul timed beside it (the load changed in between):
            # the device demonstrably does at least that, so the step's own rate is the ceiling.
            return Rate(self.model.rate, self.model.low, self.model.high)
        return speed.scaled(n / work)

    @property
    def beat_the_peak(self) -> bool:
        return self.utilisation() > 1

    def rates(self) -> dict:
        return {name: self.ceiling(name).value for name in CEILINGS}

    def compute_over_memory(self) -> Verdict:
        """The ideal compute time over the ideal memory time of a step (above 1: compute binds the device)."""
        c, m = self.ceiling("compute"), self.ceiling("memory")
        return Verdict(_ratio(m.value, c.value), _ratio(m.low, c.high), _ratio(m.high, c.low), 0, paired=False)

    def bottleneck(self) -> Bottleneck:
        """The verdict as data: the binding ceiling, the ratios, the remedies in order (bottleneck.py)."""
        return bottleneck(self)

    @property
    def kind(self) -> str:
        return self.bottleneck().kind

    def utilisation(self, samples_per_s: float | None = None) -> float:
        """Model FLOPs utilisation at `samples_per_s` (default: the model-alone rate), between 0 and 1."""
        rate = self.model.rate if samples_per_s is None else samples_per_s
        per_sample = self.counts.flops / self.step_samples
        return per_sample * rate / self.peak.value if self.peak.value > 0 else float("nan")

    def evidence(self) -> str:
        """The binding ceiling and the model alone, in words."""
        b = self.bottleneck()
        rate = self.ceiling(b.binding)
        what = {"data": "the loader can deliver", "host": "the host's fixed cost per step allows",
                "compute": "the device's peak FLOP/s allows", "memory": "the memory bandwidth allows"}[b.binding]
        reaches = "" if b.binding == "data" else f", {_percent(b.share)} of it"
        return f"{what} {_rate(rate.value)} samples/s, the model alone trains at {self.model.rate:,.0f}{reaches}"

    def margin(self) -> str:
        """By how much the binding ceiling binds, with its 95% interval."""
        b = self.bottleneck()
        v = b.margin
        against = {"data": "the model alone is", "host": "the device's part of the step is",
                   "compute": "the memory ceiling is", "memory": "the compute ceiling is"}[b.binding]
        if b.binding == "host" and self.busy is not None:
            head = f"the GPU waits {_times(v.ratio)} as long as it works"
        elif b.binding == "host" and math.isinf(v.ratio):
            head = f"the step took no longer at batch {self.split.batch} than at {self.split.small}"
        elif b.binding == "host":
            head = f"the step's fixed part is {_times(v.ratio)} its per-sample part"
        else:
            head = f"{against} {_times(v.ratio)} higher"
        interval = f"95% interval {v.low:.2f}-{'unbounded' if math.isinf(v.high) else f'{v.high:.2f}'}"
        if not b.measurable:
            return f"{head}: not measurably ({interval})"
        return f"{head}; {interval}"

    @property
    def verdict(self) -> str:
        b = self.bottleneck()
        if b.state == "noisy":
            fewer = self.threads_race.remedy.split(":")[0] if self.threads_race and self.threads_race.remedy else ""
            return (f"too noisy to tell: {b.withheld.words}; read the ceilings again on a quieter machine"
                    + (f", or with {fewer} (measured faster here: see the model alone)" if fewer else ""))
        if b.state == "none":
            return (f"the step reaches {_percent(b.share)} of the {b.binding} ceiling, the nearest: none of the four "
                    f"explains it; look at {LOOK_AT}")
        return f"{self.kind}: {self.evidence()} ({self.margin()})"

    def lines(self, training_rate: float | None = None) -> list[str]:
        """The four ceilings (binding first), the model alone, and the remedies in order."""
        b, c = self.bottleneck(), self.config
        width = max(len(name) for name in CEILINGS)
        out = [f"  {name:<{width}}  {_rate_text(self.ceiling(name))}  {self._method(name)}" for name in b.order]
        mfu = f"model FLOPs utilisation {100 * self.utilisation():.1f}% (model alone)"
        if training_rate is not None:
            mfu += f", {100 * self.utilisation(training_rate):.1f}% (training)"
        beside = self.model_load.beside() if self.model_load else ""
        waited = self.oversubscribed()  # said on the model's line: its threads' wait is that reading's
        out.append(f"  model alone: {self.model.text()}{beside} (one batch of {c.batch_size} held on {self.device}); "
                   f"{mfu}" + (f"; {waited}" if waited else ""))
        if self.busy is not None:
            f = self.busy.fraction
            out.append(f"  GPU busy {100 * f.value:.0f}% of the step (95% interval {100 * f.low:.0f}-{100 * f.high:.0f}%;"
                       f" union of kernel intervals over wall time, torch.profiler), {self.busy.kernels_per_step:.0f}"
                       f" kernels per step, median kernel {self.busy.median_kernel_us:.1f} us")
        out.append(f"  host or device: {b.method}")
        return out

    def remedy_lines(self, count: int = 4) -> list[str]:
        fewer = [f"  try: {self.threads_race.remedy} [threads]"] if self.threads_race and self.threads_race.remedy \
            else []
        # Only a remedy raced on the live model here (fewer threads; a cheap toggle: tools/ceilings.race_remedies) is
        # a "try", with its measured ratio; every other is an idea with its reason, not raced: its figures (a peak's
        # ratio, a fit's prediction) are not the step's gain
        return fewer + [self._remedy_line(r) for r in self.bottleneck().remedies[:count - len(fewer)]]

    def _remedy_line(self, remedy) -> str:
        race = self.raced.get(remedy.item)
        if race is None:
            return f"  idea, not raced: {remedy.text} [{remedy.ceiling}]"
        v = race.verdict
        measured = f"{race.label}: raced on this model: {v.text()} [{v.pairs} pairs of blocks]"
        if v.faster:
            return f"  try: {measured}; why: {remedy.text} [{remedy.ceiling}]"
        return f"  raced, not faster here: {measured}; the idea was: {remedy.text} [{remedy.ceiling}]"

    def oversubscribed(self) -> str:
        """Where the model's threads waited for a free CPU while it was read: how long, and what fewer threads did
        in a short race ('' where they did not wait)."""
        load = self.model_load
        if load is None or not load.waited:
            return ""
        count = f"{load.threads} " if load.threads else ""
        out = f"oversubscribed: its {count}torch threads waited {load.waited_cores:.1f} s a second for a free CPU"
        return out + (f"; {self.threads_race.text()}" if self.threads_race else "")

    def _method(self, name: str) -> str:
        n = self.counts
        if name == "data":
            return f"({self.source}, batch {self.config.batch_size}, no model)"
        if name == "host":
            if self.split is None:
                return "(not measured: a smaller batch could not run)"
            s = self.split
            return (f"(fixed {1000 * s.host_s.value:.2f} ms per step, device {1000 * s.device_s.value:.2f} ms at "
                    f"batch {s.batch}: lower quartiles of step times at batch {s.batch} and {s.small})")
        if name == "compute":
            p = self.peak
            beat = "; the step itself ran faster, its rate taken as the ceiling" if self.beat_the_peak else ""
            return (f"({si(n.flops)}FLOP per step, torch.utils.flop_counter; peak {si(p.value)}FLOP/s, "
                    f"{p.dtype} {p.size}x{p.size} matmul measured now{beat})")
        return (f"({si(n.bytes)}B per step, each operation's reads and writes; {si(self.bandwidth.value)}B/s, "
                f"a {si(self.bandwidth.size)}B copy measured now)")

    def table(self) -> str:
        c = self.config
        return "\n".join([f"nbtrain ceilings on {self.device} (batch {c.batch_size}, {c.num_workers} workers, "
                          f"{c.precision}), binding first"] + self.lines() + [f"verdict: {self.verdict}"]
                         + self.remedy_lines() + ([self.batch_line()] if self.noise_scale is not None else []))

    def batch_line(self) -> str:
        """The critical batch size beside the batch: above it a larger batch costs samples for the same loss."""
        n, b = self.noise_scale, self.config.global_batch_size
        if not n.measured:
            return f"batch: {n.text()}"
        where = ("at or below it" if b <= n.low else "above it: larger batches cost samples for the same loss"
                 if b > n.high else "within its interval")
        return (f"batch: {n.text()}; this run's global batch {b} is {where} (a batch up to about B_crit buys fewer "
                f"steps nearly for free; beyond it, each doubling buys less)")

    def __repr__(self) -> str:
        return f"Ceilings({self.verdict!r})"

    def plot(self, path=None, ax=None):
        """The four ceilings on a log scale, binding on top, each a dot with its 95% interval as whiskers,
        and the model alone (its batch held in memory) as a dashed line; saved to `path` when given."""
        from .. import plotting
        order = self.bottleneck().order
        with plotting.axes(path, ax, figsize=(7, 2.6)) as ax:
            shown = []
            for row, name in enumerate(reversed(order)):
                r = self.ceiling(name)
                if not math.isfinite(r.value):
                    continue
                high = min(r.high, 1e3 * r.value)  # an unbounded top drawn as a long whisker
                whisker = [[r.value - r.low], [high - r.value]] if math.isfinite(r.low) else None
                ax.errorbar(r.value, row, xerr=whisker, fmt="o", color=COLORS[name], capsize=4, markersize=7)
                ax.annotate(f"{r.value:,.0f}", (r.value, row), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=7)
                shown += [r.value, r.low if math.isfinite(r.low) else r.value, high]
            ax.axvline(self.model.rate, color="black", linestyle="--", linewidth=1,
                       label=f"model alone {self.model.rate:,.0f} samples/s")
            ax.set_yticks(range(len(order)), list(reversed(order)))
            ax.set_ylim(-0.6, len(order) - 0.3)
            ax.set_xscale("log")
            ax.set_xlim(min(shown + [self.model.rate]) / 2, max(shown + [self.model.rate]) * 2)
            ax.set_xlabel("samples/s each ceiling allows (log scale)")
            ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
            ax.set_title(textwrap.fill(self.verdict, 100), fontsize=8, loc="left")
        return ax.figure


def _per(samples: int, seconds: float) -> float:
    return samples / seconds if seconds > 0 else math.inf


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def _times(ratio: float) -> str:
    return "unboundedly" if math.isinf(ratio) else f"{ratio:.1f}x"


def _percent(share: Verdict) -> str:
    """'37% (95% interval 33-41%)': how much of a ceiling the model alone reaches."""
    if not math.isfinite(share.low):
        return f"{100 * share.ratio:.0f}%"
    return f"{100 * share.ratio:.0f}% (95% interval {100 * share.low:.0f}-{100 * share.high:.0f}%)"


def _rate(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:,.0f}"


def _rate_text(r: Rate) -> str:
    if not math.isfinite(r.value):
        return f"{_rate(r.value):>12} samples/s" if math.isinf(r.value) else f"{'-':>12}"
    high = "unbounded" if math.isinf(r.high) else f"{r.high:,.0f}"
    interval = f" (95% interval {r.low:,.0f}-{high})" if math.isfinite(r.low) else ""
    return f"{r.value:>12,.0f} samples/s{interval}"
