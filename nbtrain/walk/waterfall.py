"""Waterfall chart of a checklist walk: start, each item's measured change (head to head, with its
95% interval) in the order walked, under each the bottleneck it was tried for, and the result: the walk's
choice against the start, head to head (headline.py)."""
from __future__ import annotations

import math

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


def waterfall(walk, path=None, ax=None):
    """Bars of measured rates only, never a product of ratios: the start as the final head-to-head measured it;
    each item as its own race measured it (a kept one a bar from the current config's rate to the kept
    candidate's, both from that race; one not kept a mark at the current config's rate); and last the walk's
    choice against the start, head to head, with its interval: the headline."""
    rows = walk.rows()
    labels = ["start"] + [f"{item.name}\n({item.bottleneck}-bound)" if item.bottleneck else item.name
                          for item in rows] + ["result\n(head to head)"]
    with plotting.axes(path, ax, figsize=(1.1 * len(labels) + 2, 3.6)) as ax:
        ax.bar(0, walk.baseline, color="tab:grey")
        labels_drawn = [ax.annotate(f"{walk.baseline:,.0f}", (0, walk.baseline), ha="center", va="bottom",
                                    fontsize=7)]
        for x, item in enumerate(rows, start=1):
            level = item.before
            if item.kept:
                change = item.after - level
                ax.bar(x, change, bottom=level, color="tab:green" if change >= 0 else "tab:red")
                interval = f"\n({item.verdict.interval_text()})" if item.verdict.pairs else ""
                shown = item.verdict.ratio if math.isfinite(item.verdict.ratio) else item.speedup  # the table's
                text = f"{ratio_text(shown)}{interval}\n{_lines(item.chosen)}"
                level = max(level, item.after)
            else:
                ax.plot([x - 0.4, x + 0.4], [level, level], color="tab:grey", lw=1.5)
                # "no measurable difference (0.97-1.04)" in short lines, so neighbouring labels do not overlap;
                # why a race did not settle is the table's to say, too long for a bar's width
                text = "not kept\n" + _lines(item.verdict_text(why=False)).replace("measurable d", "measurable\nd")
            labels_drawn.append(ax.annotate(text, (x, level), ha="center", va="bottom", fontsize=7))
        last = len(labels) - 1
        total = walk.overall()
        if walk.moved and walk.head_to_head is not None:
            ax.bar(last, walk.final, color="tab:blue")
            ax.plot([last - 0.4, last + 0.4], [walk.baseline] * 2, color="tab:grey", lw=1.5, ls="--")
            text = f"{walk.final:,.0f}\n{_lines(total.short())}"
            top = walk.final
        else:
            top = walk.baseline
            text = "nothing kept" if not walk.moved else "not measured\nhead to head"
        labels_drawn.append(ax.annotate(text, (last, top), ha="center", va="bottom", fontsize=7))
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("samples/s (measured; each item\nin its own race)", fontsize=8)
        skipped = [f"skipped {name}: {reason[:70]}{'...' if len(reason) > 70 else ''}" for name, reason in walk.skipped]
        ax.set_title("\n".join([f"checklist walk on {walk.device}, {walk.elapsed_s:.0f} s of a {walk.budget_s:.0f} s "
                                f"budget: {walk.headline()}"] + skipped), fontsize=7, loc="left")
        _room_for(ax, labels_drawn)
    return ax.figure


def _room_for(ax, labels) -> None:
    """A y-axis tall enough that every bar's label, drawn above its bar, ends inside the axes: a label's
    height is fixed in points, so the room it needs in samples/s depends on the axes' height once laid out
    (a fixed 30% headroom let a five-line label run into the title)."""
    top = max(label.xy[1] for label in labels) or 1.0
    if not hasattr(ax.figure.canvas, "get_renderer"):  # a backend that does not lay out text in pixels
        ax.set_ylim(0, 1.5 * top)
        return
    ax.set_ylim(0, 1.05 * top)
    for _ in range(2):  # the layout, and with it the axes' height, settles after the first change
        renderer = ax.figure.canvas.get_renderer()
        ax.figure.draw_without_rendering()
        axes_px = ax.get_window_extent(renderer).height
        needed = max(label.xy[1] * axes_px / max(0.97 * axes_px - label.get_window_extent(renderer).height, 1.0)
                     for label in labels)
        ax.set_ylim(0, max(needed, 1.05 * top))
