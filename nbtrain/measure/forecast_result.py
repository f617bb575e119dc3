"""The scaling forecast as a result: a table (print() shows it), a plot, the checks against real runs.

    f = nbtrain.forecast(model, data, devices=[1, 2, 4, 8], nodes=[1, 2], check=True)
    print(f)                   # every input labelled measured / given / assumed, a range per count, what binds
    f.point(8, 2).throughput   # (low, high) samples/s
    f.checks[0].inside         # the 2-rank run measured here lies in its forecast's range
    f.plot("scaling.png")      # throughput and per-rank efficiency against ranks: ranges as bands, runs as dots
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .bottleneck import Remedy
from .forecast import Link, Quantity, ScalingPoint, percent_range, remedies, scaling_point
from .steady import SteadyRate

NODE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


@dataclass(frozen=True)
class Check:
    """A count run here with the forecast's config: its steady rate against the forecast's range."""
    devices: int
    nodes: int
    steady: SteadyRate
    forecast: ScalingPoint
    how: str

    @property
    def inside(self) -> bool:
        return self.forecast.contains(self.steady.low, self.steady.high)

    def text(self) -> str:
        low, high = self.forecast.throughput
        where = "inside" if self.inside else ("below" if self.steady.high < low else "above")
        return (f"  {self.devices} x {self.nodes}: {self.steady.text()} measured ({self.how}): {where} the "
                f"forecast {low:,.0f}-{high:,.0f}")


@dataclass
class Forecast:
    device: str
    parameters: int
    gradient_dtype: str
    buckets: tuple
    compute: Quantity             # seconds of one micro-batch step at the per-rank batch
    one_rank: SteadyRate          # the rate the compute time came from
    batch: int                    # per rank
    accumulate: int
    local: Link
    between: Link | None
    points: list                  # ScalingPoint, nodes then devices ascending
    assumptions: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    wait: Quantity | None = None    # a step's wait for the slower rank before its all-reduce (measured on 2 ranks)
    copies: Quantity | None = None  # DDP's copies of the gradients into their buckets and back, per step
    # CPU: one process, alone, at the thread count the live run trains at (the 1 x 1 point: one process, one
    # truth) and at the threads each rank gets (what a DDP speed-up is read against); None on a GPU
    one_process: Quantity | None = None
    threads: int | None = None       # the live run's torch threads
    rank_threads: int | None = None  # each local rank's torch threads (this machine's cores / its ranks)

    def point(self, devices: int, nodes: int = 1) -> ScalingPoint:
        return next(p for p in self.points if p.devices == devices and p.nodes == nodes)

    def forecast_for(self, devices: int, nodes: int = 1) -> ScalingPoint:
        """The forecast for any count, listed or not (a check's count)."""
        return scaling_point(devices, nodes, self.compute_at(devices, nodes), self.buckets, self.local, self.between,
                             batch=self.batch, accumulate=self.accumulate, wait=self.wait,
                             copies=self.copies)

    def compute_at(self, devices: int, nodes: int) -> Quantity:
        """A micro-batch step's seconds per rank at a count: one process alone at the live run's threads (1 x 1,
        where it was read), else a rank's."""
        single = devices * nodes == 1 and self.one_process is not None
        return self.one_process if single else self.compute

    @property
    def gradient_bytes(self) -> int:
        return sum(self.buckets)

    def worst(self) -> ScalingPoint | None:
        """The largest count with a forecast: the one whose bound the verdict names (None: no count has one)."""
        known = [p for p in self.points if p.binding != "unknown"]
        return max(known, key=lambda p: (p.ranks, p.nodes)) if known else None

    @property
    def verdict(self) -> str:
        p = self.worst()
        if p is None:
            return "no count could be forecast: " + "; ".join(sorted({p.why for p in self.points}))
        low, high = p.throughput
        return (f"on {p.devices} x {p.nodes} ranks: {low:,.0f}-{high:,.0f} samples/s ({_speedup(p, self)}), "
                f"bound by {p.why}")

    def remedies(self) -> list[Remedy]:
        if self.worst() is None:
            return []
        return remedies(self.worst(), self.compute, self.buckets, self.local, self.between, batch=self.batch,
                        accumulate=self.accumulate, wait=self.wait,
                             copies=self.copies)

    def input_lines(self) -> list[str]:
        c = self.compute
        between = (self.between.text() if self.between is not None else
                   "link between nodes: unknown (neither measured nor given: link_gbps=, link_latency_us=); "
                   "counts over several nodes show no range")
        local = self.local.text() if self.local is not None else "link between local ranks: unknown (no 2 local devices)"
        lines = [f"  compute: {c.text(1000, 'ms')} per step of {self.batch} samples [{c.source}: {c.how}]",
                 f"  gradients: {self.parameters:,} parameters x {self.gradient_dtype} = "
                 f"{self.gradient_bytes / 1e6:.3g} MB in {len(self.buckets)} DDP bucket"
                 f"{'s' * (len(self.buckets) != 1)} [measured: the model's own parameters]", f"  {local}", f"  {between}"]
        if self.one_process is not None:
            lines.append(f"  one process (1 x 1): {self.one_process.text(1000, 'ms')} per step of {self.batch} samples "
                         f"at {_threads(self.threads)}, as the live run trains [{self.one_process.source}: "
                         f"{self.one_process.how}]")
        for name, q in (("wait for the slower rank", self.wait), ("DDP's bucket copies", self.copies)):
            if q is not None:
                lines.append(f"  {name}: {q.text(1000, 'ms')} per step [{q.how}]")
        return lines + [f"  {a} [assumed]" for a in self.assumptions]

    def table(self) -> str:
        head = (f"nbtrain forecast on {self.device}: batch {self.batch} per rank"
                + (f" x {self.accumulate} accumulated" if self.accumulate > 1 else "") + "; inputs:")
        rows = [f"  {'devices x nodes':>15}  {'samples/s':>19}  {'per-rank efficiency':>19}  bound by"]
        for p in self.points:
            if p.binding == "unknown":
                rows.append(f"  {p.devices:>7} x {p.nodes:<5}  {'unknown':>19}  {'unknown':>19}  {p.why}")
                continue
            rows.append(f"  {p.devices:>7} x {p.nodes:<5}  {_pair(p.throughput, '{:,.0f}'):>19}  "
                        f"{percent_range(p.efficiency):>19}  {_bound(p)}")
        checks = (["measured here (check=True):"] + [c.text() for c in self.checks]) if self.checks else []
        return "\n".join([head] + self.input_lines() + rows + checks + [f"verdict: {self.verdict}"]
                         + [f"  try: {r.text} [{r.ceiling}]" for r in self.remedies()])

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"Forecast({self.verdict!r})"

    def plot(self, path=None, ax=None):
        """Throughput and per-rank efficiency against ranks (log scale): each node count's range a band,
        runs measured here dots with their 95% intervals; drawn in the space of `ax` when given."""
        from .. import plotting
        with plotting.axes(path, ax, figsize=(9, 3.2)) as ax:
            figure, spec = ax.figure, ax.get_subplotspec()
            ax.set_axis_off()  # its place is split in two; the figure is still saved through it
            rate_ax, eff_ax = (figure.add_subplot(s) for s in spec.subgridspec(1, 2, wspace=0.08))
            self._draw(rate_ax, eff_ax)
        return figure

    def _draw(self, rate_ax, eff_ax) -> None:
        nodes = sorted({p.nodes for p in self.points})
        for color, n in zip(NODE_COLORS, nodes):
            shown = [p for p in self.points if p.nodes == n and p.binding != "unknown"]
            if not shown:
                continue
            ranks = [p.ranks for p in shown]
            label = f"{n} node{'s' * (n != 1)} (forecast)"
            for ax, key, scale in ((rate_ax, "throughput", 1), (eff_ax, "efficiency", 100)):
                lows = [scale * getattr(p, key)[0] for p in shown]
                highs = [scale * getattr(p, key)[1] for p in shown]
                ax.fill_between(ranks, lows, highs, color=color, alpha=0.25, label=label, step=None)
                ax.plot(ranks, lows, color=color, lw=0.8)
                ax.plot(ranks, highs, color=color, lw=0.8)
        c = self.compute  # one rank's samples/s, its interval with it: a dot's efficiency carries both
        one = [self.batch / t for t in (c.value, c.high, c.low)]
        for check in self.checks:
            s, n = check.steady, check.devices * check.nodes
            label = f"measured {check.devices} x {check.nodes}"
            rate_ax.errorbar([n], [s.rate], yerr=[[s.rate - s.low], [s.high - s.rate]], fmt="o", color="black",
                             capsize=3, label=label)
            eff = [100 * s.rate / (n * one[0]), 100 * s.low / (n * one[2]), 100 * s.high / (n * one[1])]
            eff_ax.errorbar([n], [eff[0]], yerr=[[eff[0] - eff[1]], [eff[2] - eff[0]]], fmt="o", color="black",
                            capsize=3, label=label)
        for ax in (rate_ax, eff_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({p.ranks for p in self.points}), [str(r) for r in sorted({p.ranks for p in self.points})])
            ax.set_xlabel("ranks (devices x nodes)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7, loc="best")
        rate_ax.set_ylabel("samples/s", fontsize=8)
        eff_ax.set_ylabel("per-rank efficiency (%)", fontsize=8)
        eff_ax.set_ylim(0, 105)
        rate_ax.set_title("throughput: no overlap to full overlap", fontsize=8, loc="left")
        eff_ax.set_title(f"per-rank efficiency ({self.gradient_bytes / 1e6:.3g} MB of gradients)", fontsize=8,
                         loc="left")


def _bound(p: ScalingPoint) -> str:
    if p.ranks < 2:
        return p.binding
    term = "latency" if p.latency_share >= 0.5 else "bandwidth"
    return (f"{p.binding} (all-reduce {1000 * p.allreduce_s[0]:.3g}-{1000 * p.allreduce_s[1]:.3g} ms, mostly "
            f"{term}, against {1000 * p.compute_s:.3g} ms of compute)")


def _pair(pair: tuple, spec: str) -> str:
    low, high = pair
    if not (math.isfinite(low) and math.isfinite(high)):
        return "-"
    a, b = spec.format(low), spec.format(high)
    return a if a == b else f"{a}-{b}"


def _speedup(p: ScalingPoint, f: Forecast) -> str:
    """Against one rank; on a CPU against one process alone at the threads each rank runs at, so a speed-up
    the thread count makes is never shown as DDP's (the live run's own count is the 1 x 1 row)."""
    low, high = p.throughput
    if f.rank_threads is None:
        one = f.batch / f.compute.value
        return f"{low / one:.1f}-{high / one:.1f}x one rank"
    one = f.one_rank.rate
    out = f"{low / one:.1f}-{high / one:.1f}x one process at {_threads(f.rank_threads)}, as each rank runs"
    if f.one_process is not None and f.threads != f.rank_threads:
        live = f.batch / f.one_process.value
        out += f"; {low / live:.1f}-{high / live:.1f}x the live run's one process at {_threads(f.threads)}"
    return out


def _threads(count: int | None) -> str:
    return "an unknown thread count" if count is None else f"{count} thread{'s' * (count != 1)}"
