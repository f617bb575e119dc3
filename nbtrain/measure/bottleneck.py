"""Which of a step's four ceilings binds, by how much, and what to try, in that order: as data.

    b = nbtrain.measure.bottleneck(nbtrain.ceilings(recipe, config=config))
    b.binding           # "host": the fixed per-step cost bounds the step
    b.margin            # Verdict: how far the binding ceiling sits below what would bind next, 95% interval
    b.ratios            # {"data": 6.1, "host": 1.0, "compute": 210.0, "memory": 95.0}: each over the binding one
    b.remedies[0].item  # "batch_size": the first thing to try (a TrainConfig option, a checklist item)

The four ceilings, each in samples/s at the config's batch:
- data: the loader alone;
- host: the step if the device did no work (the fixed per-step cost of the two-batch fit);
- compute: the step's FLOPs at the peak FLOP/s measured on the spot;
- memory: the bytes the step moves at the bandwidth measured on the spot.

How the nearest one is chosen: the data ceiling when the loader is slower than the model alone.
Otherwise the model's, and its fixed (host) part is weighed against its per-sample (device) part: on
CUDA by the GPU's busy fraction when it was measured, elsewhere by the two-batch fit. On the device,
compute, unless memory measurably undercuts it: the memory ceiling counts every operation's bytes as
if none stayed in a cache, an upper bound on the bytes and so a lower bound on the speed it allows.

Whether it binds (`state`): a ceiling is named binding only where it explains the measured rate: the
model alone reaches at least EXPLAINS of it within the 95% interval (its limit alone accounts for at
least half the step's time). Where the nearest does not, none of the four is named ("the step reaches
37% of the compute ceiling"): a ceiling 4x above the rate explains nothing about it. Readings the
machine's load moved say "too noisy" instead, by the rule `ab` uses (withheld.of_ceilings): the model's
own interval wider than that, the deciding ratio's interval wider than that and holding 1, or the
device's peak read before and after the model apart by more than that.
Remedies come by ceiling, the nearest one first, then the others from the lowest rate up; within a
ceiling in the order its numbers favour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..format import ratio as ratio_text
from ..hardware import usable_cores
from .verdict import MIN_EFFECT, Verdict
from .withheld import Withheld, of_ceilings

CEILINGS = ("data", "host", "compute", "memory")
EXPLAINS = 0.5  # a ceiling that allows at most twice the measured rate accounts for at least half the step
LOOK_AT = ("a profile of the step (nbtrain.profile): its time goes where none of the four counts (element-wise "
           "operations' overheads, allocation, synchronisation, Python between operations)")


@dataclass(frozen=True)
class Remedy:
    ceiling: str     # the ceiling it lifts
    item: str        # the TrainConfig option (checklist item) that tries it: batch_size, compile, precision, ...
    text: str        # what to try, in words, with the number that ranks it


@dataclass(frozen=True)
class Bottleneck:
    binding: str                 # data | host | compute | memory
    margin: Verdict              # the comparison that chose it: next ceiling (or side) over the binding one
    rates: dict                  # ceiling -> samples/s
    ratios: dict                 # ceiling -> its rate over the binding ceiling's
    order: tuple                 # the ceilings, binding first, then from the lowest rate up
    remedies: tuple              # Remedy, in the order to try them
    method: str                  # how host and device were told apart
    state: str = "binds"         # binds | none (the nearest explains too little of the rate) | noisy
    share: Verdict | None = None  # the model alone's rate over the named ceiling, with its 95% interval
    withheld: Withheld | None = None  # why the readings are too noisy to tell, where they are (withheld.py)

    @property
    def binds(self) -> bool:
        return self.state == "binds"

    @property
    def kind(self) -> str:
        if self.state == "noisy":
            return "too noisy to tell"
        return f"{self.binding}-bound" if self.binds else f"none binds (nearest: {self.binding})"

    @property
    def measurable(self) -> bool:
        """The binding ceiling binds beyond doubt: the margin's interval lies above 1 (its top may be
        unbounded: no device time seen at all)."""
        return self.margin.low > 1 + MIN_EFFECT


def _verdict(rate, pairs: int = 0) -> Verdict:
    """A device_rates.Rate as a Verdict (a ratio with its interval)."""
    return Verdict(rate.value, rate.low, rate.high, pairs, paired=False)


def _inverse(v: Verdict) -> Verdict:
    return Verdict(1 / v.ratio, 1 / v.high if v.high > 0 else math.inf, 1 / v.low if v.low > 0 else math.inf,
                   v.pairs, v.paired)


def host_over_device(c) -> tuple[Verdict, str]:
    """The host's share of the step over the device's, and the method that measured it."""
    if c.busy is not None and math.isfinite(c.busy.fraction.value):
        f = c.busy.fraction
        idle = lambda busy: (1 - busy) / busy if busy > 0 else math.inf  # noqa: E731
        return (Verdict(idle(f.value), idle(f.high), idle(f.low), 0, paired=False),
                "GPU idle time over busy time (torch.profiler kernel intervals)")
    if c.split is None:
        return Verdict(math.nan, math.nan, math.nan, 0), "not measured"
    return (_verdict(c.split.host_share),
            f"step time at batch {c.split.batch} and {c.split.small}: intercept (host) over slope (device)")


def share_of(c, name: str) -> Verdict:
    """The model alone's rate over ceiling `name`, with its 95% interval (1: the ceiling is the rate)."""
    r, ceiling = c.model, c.ceiling(name)
    over = lambda a, b: a / b if b > 0 else math.nan  # noqa: E731
    return Verdict(over(r.rate, ceiling.value), over(r.low, ceiling.high), over(r.high, ceiling.low), 0, paired=False)


def memory_undercuts(c) -> bool:
    """The memory ceiling lies below the compute ceiling beyond doubt, and the model alone does not beat it
    (a step faster than its bytes allow moved fewer than were counted: caches): the only way memory is named."""
    return (_inverse(c.compute_over_memory()).low > 1 + MIN_EFFECT
            and not share_of(c, "memory").low > 1 + MIN_EFFECT)


def judged(c, binding: str, margin: Verdict) -> tuple[str, str, Verdict, Withheld | None]:
    """(state, ceiling, share, withheld): whether `binding` explains the rate, else the nearest ceiling."""
    share = share_of(c, binding) if binding != "data" else Verdict(1.0, 1.0, 1.0, 0, paired=False)
    if held := of_ceilings(c, binding, margin, loader_binds=binding == "data" and margin.low > 1 + MIN_EFFECT):
        return "noisy", binding, share, held
    if binding == "data" or share.high >= EXPLAINS:  # the loader slower than the model: the rate is the loader's
        return "binds", binding, share, None
    eligible = ["host", "compute"] + (["memory"] if memory_undercuts(c) else [])
    nearest = max(eligible, key=lambda k: share_of(c, k).ratio if math.isfinite(share_of(c, k).ratio) else -1)
    return "none", nearest, share_of(c, nearest), None


def bottleneck(c) -> Bottleneck:
    """The verdict of a `Ceilings` (nbtrain.ceilings) as data: see the module doc."""
    rates = c.rates()
    host, method = host_over_device(c)
    if c.ratio.ratio > 1:  # the loader is slower than the model alone
        binding, margin = "data", c.ratio
    elif host.ratio > 1:  # (NaN where host and device could not be told apart: the device's ceilings decide)
        binding, margin = "host", host
    else:
        binding = "memory" if memory_undercuts(c) else "compute"
        margin = c.compute_over_memory() if binding == "compute" else _inverse(c.compute_over_memory())
    state, binding, share, held = judged(c, binding, margin)
    rest = sorted((k for k in CEILINGS if k != binding), key=lambda k: rates[k])
    order = (binding, *rest)
    base = rates[binding]
    ratios = {k: rates[k] / base if base > 0 else math.nan for k in CEILINGS}
    seen, remedies = set(), []
    for ceiling in order:
        for remedy in REMEDIES[ceiling](c):
            if remedy.item not in seen:
                seen.add(remedy.item)
                remedies.append(remedy)
    return Bottleneck(binding, margin, rates, ratios, order, tuple(remedies), method, state, share, held)


def precision_baseline(device_type: str) -> str:
    """What lower precision is compared against here: the float32 arithmetic as configured now."""
    if device_type != "cuda":
        return f"float32 on {device_type} (no TF32 there)"
    setting = torch.get_float32_matmul_precision()
    matmuls = "TF32 off, full float32" if setting == "highest" else "TF32 tensor cores"
    convs = "on" if torch.backends.cudnn.allow_tf32 else "off"
    return (f"float32 matmuls at matmul_precision={setting!r} ({matmuls}), cuDNN convolutions with TF32 {convs} "
            f"(cuDNN's default: on)")


def _host(c) -> list[Remedy]:
    out, b, cfg = [], c.config.batch_size, c.config
    split = c.split
    if split is not None and split.device_s.value >= 0:
        h, d = split.host_s.value, split.device_s.value
        gain = 2 * (h + d) / (h + 2 * d) if h + 2 * d > 0 else math.nan
        out.append(Remedy("host", "batch_size", f"batch_size={2 * b}: the fixed {1000 * h:.2f} ms per step spread over "
                                                f"twice the samples ({ratio_text(gain)} faster as the two-batch "
                                                "fit predicts, not measured)"))
    else:
        out.append(Remedy("host", "batch_size", f"batch_size={2 * b}: the fixed per-step cost spread over more samples"))
    steps = []
    if cfg.compile == "none":
        graphs = ("compile='reduce-overhead': CUDA graphs replay the step's kernels with one launch" if c.cuda else
                  "compile='default': fewer, fused operations and less Python per step")
        steps.append((c.counts.model_ops, Remedy("host", "compile", graphs + f" ({c.counts.model_ops} operations "
                                                 "in forward and backward)")))
    if cfg.optimizer_impl in (None, "auto", "for-loop"):
        fused = "'fused' or 'foreach'" if c.cuda else "'foreach'"
        steps.append((c.counts.optimizer_ops, Remedy("host", "optimizer_impl", f"optimizer_impl={fused}: one "
                                                     f"operation over all parameters ({c.counts.optimizer_ops} "
                                                     "operations in the optimizer's step now)")))
    return out + [r for _, r in sorted(steps, key=lambda s: -s[0])]


def _lower_precision(c, why: str) -> Remedy | None:
    if c.config.precision != "32-true":
        return None
    low, measured = c.low_precision_peak, ""
    if low is not None and c.peak.value > 0:
        ratio = Verdict(low.value / c.peak.value, low.low / c.peak.high, low.high / c.peak.low, 0, paired=False)
        measured = (f"a bf16 matmul alone against the float32 one here: {ratio.text()} (the matmul's own ratio, not "
                    f"this step's expected gain: nbtrain.ab measures the step); ")
    return Remedy(why, "precision", f"precision='bf16-mixed': {measured}compared against "
                                    f"{precision_baseline(c.device_type)}")


def _compute(c) -> list[Remedy]:
    out = []
    precision = _lower_precision(c, "compute")
    if c.cuda and c.config.precision == "32-true" and torch.get_float32_matmul_precision() == "highest":
        out.append(Remedy("compute", "matmul_precision", "matmul_precision='high': float32 matmuls on TF32 tensor cores"))
    if c.has_convolutions and not c.config.channels_last:
        out.append(Remedy("compute", "channels_last", "channels_last=True: convolutions in the layout their "
                                                      "fastest kernels read"))
    # Lower precision first where this device's bf16 matmul is measurably faster; last (kept, with its
    # number) where not: on a device without fast bf16 it only adds casts.
    faster = precision is not None and c.low_precision_peak is not None and c.low_precision_peak.low > c.peak.high
    if faster:
        out.insert(0, precision)
    if c.config.compile == "none":
        out.append(Remedy("compute", "compile", "compile='default': fused kernels"))
    if precision is not None and not faster:
        out.append(precision)
    return out


def _memory(c) -> list[Remedy]:
    out = []
    if c.config.precision == "32-true":
        out.append(Remedy("memory", "precision", "fewer bytes: precision='bf16-mixed' moves half the bytes per "
                                                 f"activation; compared against {precision_baseline(c.device_type)}"))
    if c.config.compile == "none":
        out.append(Remedy("memory", "compile", "fewer bytes: compile='default' fuses chains of element-wise "
                                               "operations (one read and one write instead of one per operation)"))
    return out


def _data(c) -> list[Remedy]:
    out, cfg = [], c.config
    if c.held is False and getattr(c, "hold_refused", None) is None:  # only what the held-data rule allows
        out.append(Remedy("data", "preload_data", "preload_data=True: hold the samples in memory, each read "
                                                  "(and transformed) once, where a sample read twice is the same"))
    more = min(max(2, 2 * cfg.num_workers), max((getattr(c, "cores", 0) or usable_cores()) - 1, 1))
    if c.held is False and more > cfg.num_workers:
        out.append(Remedy("data", "num_workers", f"num_workers={more}: samples loaded in parallel processes"))
    if c.cuda and not cfg.pin:
        out.append(Remedy("data", "pin_memory", "pin_memory=True: copies to the GPU overlap with compute"))
    if c.held is False:
        out.append(Remedy("data", "cache", "nbtrain.cache(dataset, path): the deterministic per-sample work done once"))
    return out


REMEDIES = {"host": _host, "compute": _compute, "memory": _memory, "data": _data}
