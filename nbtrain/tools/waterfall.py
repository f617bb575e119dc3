"""Waterfall chart of a checklist walk: start, each item's measured change (head to head, with its
95% interval) in the order walked, under each the bottleneck it was tried for, result."""
from __future__ import annotations

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
    labels = ["start"] + [f"{item.name}\n({item.bottleneck}-bound)" if item.bottleneck else item.name
                          for item in walk.items] + ["result"]
    with plotting.axes(path, ax, figsize=(1.1 * len(labels) + 2, 3.6)) as ax:
        ax.bar(0, walk.baseline, color="tab:grey")
        ax.annotate(f"{walk.baseline:,.0f}", (0, walk.baseline), ha="center", va="bottom", fontsize=7)
        level = walk.baseline
        for x, item in enumerate(walk.items, start=1):
            if item.kept:
                change = item.after - level
                ax.bar(x, change, bottom=level, color="tab:green" if change >= 0 else "tab:red")
                interval = f"\n({item.verdict.interval_text()})" if item.verdict.pairs else ""
                text = f"{ratio_text(item.speedup)}{interval}\n{_lines(item.chosen)}"
                level = item.after
            else:
                ax.plot([x - 0.4, x + 0.4], [level, level], color="tab:grey", lw=1.5)
                # "no measurable difference (0.97-1.04)" in short lines, so neighbouring labels do not overlap
                text = "not kept\n" + _lines(item.verdict_text()).replace("measurable d", "measurable\nd")
            ax.annotate(text, (x, level), ha="center", va="bottom", fontsize=7)
        last = len(labels) - 1
        ax.bar(last, level, color="tab:blue")
        total = walk.overall()
        interval = f"\n({total.interval_text()})" if total.pairs else ""
        ax.annotate(f"{level:,.0f}\n{ratio_text(level / walk.baseline)}{interval}", (last, level), ha="center", va="bottom",
                    fontsize=7)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("samples/s (measured)")
        ax.set_ylim(0, max([walk.baseline, level] + [i.after for i in walk.items]) * 1.3)
        skipped = [f"skipped {name}: {reason[:70]}{'...' if len(reason) > 70 else ''}" for name, reason in walk.skipped]
        ax.set_title("\n".join([f"checklist walk on {walk.device}, {walk.elapsed_s:.0f} s of a {walk.budget_s:.0f} s budget"]
                               + skipped), fontsize=7, loc="left")
    return ax.figure
