"""The checklist walk's chart: start, each item's measured change (head to head, with its 95% interval) in the order
walked, under each the bottleneck it was tried for, and the result: the walk's choice against the start, head to
head (headline.py).

Every bar is a ratio against the config current in its own race, never a rate: each race ran at its own load (a
busy minute halves every rate in it), so rates drawn one after another do not add up (a start at 1,711 samples/s,
a result at 3,069, and bars between at 7,218 and 22,146), and ratios measured from different configs under
different loads do not multiply either. The keep rule is drawn as the line a kept item's interval lies above."""
from __future__ import annotations

import math
import textwrap

from .. import plotting
from ..format import ratio as ratio_text

_LINE = 16  # characters: a bar's label wider than this runs into its neighbours'


def _lines(text: str) -> str:
    """A label in short lines: a parenthesis or a clause after a comma on a line of its own, and a long
    option=value split after its '='."""
    out = []
    for line in text.replace(" (", "\n(").replace(", ", "\n").replace("screened on ", "screened on\n").splitlines():
        if len(line) > _LINE and "=" in line:
            name, value = line.split("=", 1)
            out += [name + "=", value]
        else:
            out.append(line)
    return "\n".join(out)


def _ratio_bar(ax, x: int, verdict, color: str, lows: list) -> float:
    """A bar from 1 to the verdict's ratio with its 95% interval as whiskers; the height a label goes above.
    `lows` gathers the lowest point drawn, for the axis's bottom."""
    ratio = verdict.ratio
    ax.bar(x, ratio - 1.0, bottom=1.0, color=color, width=0.6)
    lows.append(ratio)
    top = max(ratio, 1.0)
    if math.isfinite(verdict.low) and math.isfinite(verdict.high) and verdict.pairs and verdict.low > 0:
        ax.errorbar(x, ratio, yerr=[[ratio - verdict.low], [verdict.high - ratio]], color="black", lw=1, capsize=3)
        lows.append(verdict.low)
        top = max(top, verdict.high)
    return top


def waterfall(walk, path=None, ax=None):
    """One bar per item, each the ratio of its leading candidate to the config current in the same race (kept:
    green, not kept: grey), with its 95% interval; the keep rule (the interval above 1 + min_gain) as a dashed
    line; and last the walk's choice against the start, head to head, with its interval: the headline."""
    rows = walk.rows()
    gain = walk.min_gain
    labels = ["start"] + [f"{item.name}\n({item.bottleneck}-bound)" if item.bottleneck else item.name
                          for item in rows] + ["result\n(head to head)"]
    lows: list = []
    with plotting.axes(path, ax, figsize=(1.1 * len(labels) + 2.4, 3.8)) as ax:
        ax.bar(0, 1.0, color="tab:grey", width=0.6)
        labels_drawn = [ax.annotate(f"1x\n= {walk.baseline:,.0f}\nsamples/s", (0, 1.0), ha="center", va="bottom",
                                    fontsize=7)]
        for x, item in enumerate(rows, start=1):
            verdict = item.verdict
            if math.isfinite(verdict.ratio) and verdict.ratio > 0:
                top = _ratio_bar(ax, x, verdict, "tab:green" if item.kept else "lightgrey", lows)
            else:  # no ratio to draw (no candidate ran, or none beside the current config): a mark at 1x
                ax.plot([x - 0.3, x + 0.3], [1.0, 1.0], color="tab:grey", lw=1.5)
                top = 1.0
            if item.kept:
                text = f"kept\n{ratio_text(verdict.ratio if math.isfinite(verdict.ratio) else item.speedup)}\n" \
                       f"{_lines(item.chosen)}"
            else:
                # "no measurable difference (0.97-1.04)" in short lines, so neighbouring labels do not overlap;
                # why a race did not settle is the table's to say, too long for a bar's width
                text = "not kept\n" + _lines(item.verdict_text(why=False)).replace("measurable d", "measurable\nd")
            labels_drawn.append(ax.annotate(text, (x, top), ha="center", va="bottom", fontsize=7))
        last = len(labels) - 1
        total = walk.overall()
        if walk.moved and walk.head_to_head is not None and math.isfinite(total.ratio) and total.ratio > 0:
            top = _ratio_bar(ax, last, total, "tab:blue", lows)
            text = f"{walk.final:,.0f}\nsamples/s\n{_lines(total.short())}"
        else:
            ax.plot([last - 0.3, last + 0.3], [1.0, 1.0], color="tab:grey", lw=1.5)
            top, text = 1.0, "nothing kept" if not walk.moved else "not measured\nhead to head"
        labels_drawn.append(ax.annotate(text, (last, top), ha="center", va="bottom", fontsize=7))
        ax.axhline(1.0, color="tab:grey", lw=0.8)
        ax.axhline(1.0 + gain, color="tab:green", lw=1, ls="--")  # the keep rule, said in the title
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("x the config current in\nthe item's own race", fontsize=8)
        skipped = [f"skipped {name}: {reason[:70]}{'...' if len(reason) > 70 else ''}" for name, reason in walk.skipped]
        ax.set_title("\n".join(textwrap.wrap(f"checklist walk on {walk.device}, {walk.elapsed_s:.0f} s of a "
                                              f"{walk.budget_s:.0f} s budget: {walk.headline()}", 150) + [
                                "each bar: a ratio within its own race (its own load), not a cascade: the bars do "
                                "not multiply; the result is raced against the start at the end",
                                f"kept: an item whose 95% interval lies above {ratio_text(1.0 + gain)} (min_gain={gain:g}, "
                                "the dashed line) and, where it changes what is learned, learns as well in the same time"] + skipped),
                     fontsize=7, loc="left")
        ax.set_yscale("log")  # ratios: 2x up and 2x down are as far from 1x
        from matplotlib.ticker import FuncFormatter
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
        _room_for(ax, labels_drawn, bottom=min([0.5] + [0.8 * low for low in lows]))
    return ax.figure


def _room_for(ax, labels, bottom: float) -> None:
    """A log y-axis from `bottom` tall enough that every bar's label, drawn above its bar, ends inside the axes:
    a label's height is fixed in points, so the room it needs depends on the axes' height once laid out (a fixed
    headroom let a five-line label run into the title). On a log axis a point's height is its log's share of
    the axis: a label at y of h pixels in an axis of H fits below ymax when
    log ymax >= (log y - f log bottom) / (1 - f), f = h / H."""
    top = max(label.xy[1] for label in labels)
    ax.set_ylim(bottom, 1.3 * top)
    if not hasattr(ax.figure.canvas, "get_renderer"):  # a backend that does not lay out text in pixels
        ax.set_ylim(bottom, 4 * top)
        return
    for _ in range(2):  # the layout, and with it the axes' height, settles after the first change
        renderer = ax.figure.canvas.get_renderer()
        ax.figure.draw_without_rendering()
        axes_px = ax.get_window_extent(renderer).height
        needed = []
        for label in labels:
            f = min(label.get_window_extent(renderer).height / max(0.95 * axes_px, 1.0), 0.9)
            needed.append(math.exp((math.log(label.xy[1]) - f * math.log(bottom)) / (1 - f)))
        ax.set_ylim(bottom, max(max(needed), 1.3 * top))
