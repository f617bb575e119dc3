"""Peak memory of a run: CUDA allocator peaks on a GPU, peak resident set size on the CPU.

On Linux the kernel keeps the process's peak RSS (VmHWM) and lets a process reset it
(writing 5 to /proc/self/clear_refs), so a CPU run's peak is measured, not sampled.
"""
from __future__ import annotations

import resource
import sys

import torch


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status", "rb") as status:  # read whole and searched: a line loop decodes ~55
            text = status.read()
    except OSError:
        return None
    at = text.find(b"\nVmHWM:")
    return int(text[at + 7:].split(None, 1)[0]) * 1024 if at >= 0 else None  # "VmHWM:\t 2172 kB"


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        import psutil
        return psutil.Process().memory_info().rss


class PeakMemory:
    """Measures the peak memory between `start()` and `peak()` on one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.exact = True

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not _reset_hwm():
            # Without a resettable peak, the process-lifetime peak is the honest upper bound.
            self.exact = False

    def peak(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        hwm = _read_hwm()
        if hwm is not None:
            return hwm
        scale = 1 if sys.platform == "darwin" else 1024
        self.exact = False
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale

    @property
    def kind(self) -> str:
        return "CUDA allocated" if self.device.type == "cuda" else "process RSS"
