"""The checklist walk's chart adds up (issue 53, item 9): every bar is a ratio within its own race, on one axis of
ratios, never a rate measured at its own load beside rates measured at others; the keep rule is drawn and said."""
import math

from landscapes import LANDSCAPES, walk_against_grid


def test_each_bar_is_its_races_ratio_and_the_keep_rule_is_drawn(tmp_path):
    walk = walk_against_grid(LANDSCAPES[0], seed=0)["walk"]
    assert walk.moved and walk.head_to_head is not None
    figure = walk.plot(tmp_path / "walk.png")
    ax = figure.axes[0]
    assert ax.get_yscale() == "log"
    tops = [bar.get_y() + bar.get_height() for bar in ax.patches]
    ratios = [item.verdict.ratio for item in walk.rows() if math.isfinite(item.verdict.ratio)]
    expected = [1.0] + ratios + [walk.overall().ratio]  # the start, each item's race, the head to head
    assert len(tops) == len(expected) and all(math.isclose(t, e) for t, e in zip(tops, expected)), (tops, expected)
    assert max(tops) < walk.baseline  # no bar is a rate
    rule = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_ydata()[0] for line in rule] == [1 + walk.min_gain]
    title = ax.get_title(loc="left")
    assert "not a cascade" in title and f"min_gain={walk.min_gain:g}" in title and "above 1.03x" in title
    kept = [item for item in walk.rows() if item.kept]
    assert kept and all(item.verdict.low > 1 + walk.min_gain for item in kept if item.verdict.paired)
