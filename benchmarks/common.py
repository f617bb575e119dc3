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


def ratio_line(label: str, ours: list[float], theirs: list[float], target: str) -> str:
    """Medians of interleaved timings, their ratio, and the paired 95% interval of the time ratio
    (each repeat's two timings are one pair), so a reader sees whether the ratio is noise."""
    from nbtrain.measure import paired
    r = median(ours) / median(theirs)
    v = paired([1 / t for t in ours], [1 / t for t in theirs])  # theirs' rate over ours' = our time over theirs
    interval = f", paired 95% interval {v.interval_text()}" if v.pairs >= 2 else ""
    return (f"{label}: median {median(ours):.4f} s vs {median(theirs):.4f} s -> ratio {r:.3f}{interval} "
            f"(target {target})")


def spread(values) -> str:
    """The median with the range it came from, e.g. '1.02 (0.99-1.06, 5 runs)': one run proves nothing."""
    values = sorted(values)
    return f"{median(values):.3f} ({values[0]:.3f}-{values[-1]:.3f}, {len(values)} runs)"
