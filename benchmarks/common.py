"""Shared pieces of the benchmarks: the machine line and side-by-side ratio printing."""
from __future__ import annotations

import os
import platform
import statistics

import torch


def machine() -> str:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {cuda}, "
            f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s)")


def median(values) -> float:
    return statistics.median(values)


def paired_time_ratio(ours: list[float], theirs: list[float]):
    """The paired verdict on two interleaved timing series (each repeat's two timings are one pair):
    its ratio is our time over theirs, the geometric mean of the pairs' ratios."""
    from nbtrain.measure import paired
    return paired([1 / t for t in ours], [1 / t for t in theirs])  # theirs' rate over ours' = our time over theirs


def ratio_line(label: str, ours: list[float], theirs: list[float], target: str) -> str:
    """The paired time ratio of interleaved timings with its 95% interval, so a reader sees whether the
    ratio is noise, and the medians it compares."""
    v = paired_time_ratio(ours, theirs)
    interval = f" (95% interval {v.low:.3f}-{v.high:.3f})" if v.pairs >= 2 else ""
    return (f"{label}: paired ratio {v.ratio:.3f}{interval} over {v.pairs} pairs; medians {median(ours):.4f} s "
            f"vs {median(theirs):.4f} s (ratio {median(ours) / median(theirs):.3f}) (target {target})")


def spread(values) -> str:
    """The median with the range it came from, e.g. '1.02 (0.99-1.06, 5 runs)': one run proves nothing."""
    values = sorted(values)
    return f"{median(values):.3f} ({values[0]:.3f}-{values[-1]:.3f}, {len(values)} runs)"


def measured(out: dict) -> dict:
    """Print a benchmark's {measure: (value, target)} one a line, and return it (its main's result)."""
    for measure, (value, wanted) in out.items():
        print(f"{measure}: {value} (target {wanted})")
    return out
