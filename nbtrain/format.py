"""Numbers as people read them, one way for every table, summary, progress and status line."""
from __future__ import annotations

import math


class PrintsAsTable:
    """A result that print() and a notebook show as its table (its `table()`); its repr stays one short line
    (for a result inside a list or a dict, and the debugger)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # IPython's pretty printer takes the first class in the MRO with its own __repr__ or _repr_pretty_:
        # each result class defines __repr__, so each gets the display hook in its own namespace too.
        cls._repr_pretty_ = PrintsAsTable._repr_pretty_

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text/plain display
        printer.text(repr(self) if cycle else self.table())


def number(value, unit: str = "") -> str:
    """12,345 / 0.001235 / 3.142 with `unit`; "-" for a missing value (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return (f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}") + unit
    return f"{value:,}{unit}"


def plural(count: int, word: str, words: str | None = None) -> str:
    """'1 step', '5 steps', '0.625 epochs': the count and the word it takes; "-" for a missing count."""
    shown = number(count)
    return "-" if shown == "-" else f"{shown} {word if count == 1 else words or word + 's'}"


def ratio(value: float, digits: int = 2) -> str:
    """A ratio of two speeds, one form in every table, verdict and figure: '3.37x' ('1.26x slower')."""
    return f"{value:.{digits}f}x"


def si(value: float) -> str:
    """1.2e9 -> '1.2 G' (the unit follows)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


def duration(seconds) -> str:
    """A duration as people read it: 58.5 ms, 4.2 s, 3 min 20 s."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{1000 * seconds:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def clock(seconds: float) -> str:
    """Seconds as a clock reads: 0:07, 12:34, 1:02:03."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate_with_interval(rate, low=None, high=None, wide: bool = False) -> str:
    """Steady samples/s with its 95% interval, short enough for a table cell: '41,419 (40,100–42,700)',
    marked 'noisy' when the spread is too wide to trust."""
    if rate is None or not math.isfinite(rate):
        return "-"
    text = number(float(rate))  # significant figures: a slow rate's interval and spread stay visible (0.9-1.6)
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        text += f" ({number(float(low))}–{number(float(high))})"
    return text + (" noisy" if wide else "")


def held_out(summary) -> str:
    """'97.2% (loss 0.1023)' or 'loss 0.1023', from a run's records.Summary; '-' without held-out data."""
    acc, loss = summary.val_acc, summary.val_loss
    if acc is not None:
        return f"{100 * acc:.1f}% (loss {number(loss)})"
    return "-" if loss is None else f"loss {number(loss)}"
