"""How busy the machine was while a reading ran: the CPU other processes took, and the GPU's share used by
other processes where NVML can tell.

A reading's interval is narrow when all its blocks ran under the same load, so an interval alone cannot
say that a browser or an indexer slowed the whole run down. What can: the CPU time the whole system spent
during the reading, minus this process tree's own (the kernel, its DataLoader workers, its drawing
process), per second of wall time: "other processes took 0.9 of 2 cores". Numbers only: no text beyond
the phrase a front-end shows beside a rate. Whether a load could explain a difference, and so withholds a
verdict, is withheld.py's to say.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import psutil

SMALL = 0.15      # other processes' cores below this (or this share of the machine) are not worth a word


@dataclass(frozen=True)
class Load:
    """Other processes' use of the machine during one reading, averaged over its wall time."""
    other_cores: float          # CPU-seconds of other processes per wall second (1.0: one core's worth)
    cores: int                  # logical CPUs of the machine
    wall_s: float
    gpu_other: float | None = None  # % of the GPU's time other processes kept it busy; None: no GPU or unknown
    own_cores: float = float("nan")  # CPU-seconds of this process tree per wall second (what the reading used)
    waited_cores: float = float("nan")  # seconds its threads waited for a free CPU, per wall second (Linux)
    threads: int | None = None  # torch's intra-op threads the reading ran at (None: not recorded, or no torch)

    @property
    def small(self) -> bool:
        cpu_small = not math.isfinite(self.other_cores) or self.other_cores < max(SMALL, SMALL * self.cores / 4)
        return cpu_small and not self.waited and (self.gpu_other is None or self.gpu_other < 100 * SMALL)

    @property
    def waited(self) -> bool:
        """Its threads waited for a CPU a noticeable share of the time: the machine was full, and how fast
        a run goes then is the scheduler's to say (threads that wait on each other slow it down by far more)."""
        return math.isfinite(self.waited_cores) and self.waited_cores >= SMALL

    def free_cores(self, demand: float) -> float:
        """The cores of the `demand` a reading wants that other processes left it (a tenth of one at least:
        a fully loaded machine still runs it)."""
        return max(min(self.cores - self.other_cores, demand), 0.1)

    def text(self) -> str:
        out = f"other processes took {self.other_cores:.1f} of {self.cores} cores"
        if self.waited:
            out += f", and its threads waited {self.waited_cores:.1f} s a second for a free CPU"
        if self.gpu_other is not None:
            out += f" and {self.gpu_other:.0f}% of the GPU"
        return out

    def beside(self) -> str:
        """What a rate shows beside it: '' on a quiet machine, else '; other processes took ...'."""
        return "" if self.small else f"; {self.text()}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, known: dict | None) -> "Load | None":
        """The Load a summary stored (None: a summary from before loads were recorded)."""
        return cls(**known) if known else None


def _busy_system_s() -> float:
    """CPU-seconds every CPU spent busy since boot (guest time is already in user time on Linux)."""
    t = psutil.cpu_times()
    busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
    return busy - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def descendants(process: psutil.Process) -> list[psutil.Process]:
    """The live processes below `process`. psutil finds them by reading the parent of every process on the
    machine (~2 ms a hundred processes, several times that on a busy machine: most of a reading's cost); this
    process with no child at all, which the kernel says in one call (waitid, nothing reaped), has none."""
    if process.pid == os.getpid() and hasattr(os, "waitid"):
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return []
    return process.children(recursive=True)


def _waited_s(process: psutil.Process, below: list[psutil.Process]) -> float:
    """Seconds the threads of this process tree spent runnable but waiting for a CPU (the run queue's
    wait in /proc/<pid>/task/<tid>/schedstat; NaN where the kernel does not keep it)."""
    total = 0
    for p in [process] + below:
        try:
            total += _waited_ns(p.pid)
        except (OSError, IndexError, ValueError):
            if p is process:
                return float("nan")
    return total / 1e9


def _waited_ns(pid: int) -> int:
    """The run-queue wait of each thread of `pid`, summed. The task folder listed and each schedstat read by
    os calls: psutil's threads() also reads every thread's stat, which is 4/5 of a reading's cost."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        fd = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
        try:
            total += int(os.read(fd, 256).split()[1])
        finally:
            os.close(fd)
    return total


def _tree_s(process: psutil.Process, below: list[psutil.Process]) -> float:
    """CPU-seconds of this process, its reaped children and its live descendants."""
    # This process's own: the kernel's times() call, the same counters psutil parses out of /proc/<pid>/stat
    # at 20x the cost (a reading's largest part after the threads' waits).
    t = os.times() if process.pid == os.getpid() else process.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in below:
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass  # ended while we looked: its time is in its parent's children_* once reaped
    return total


_OWN: list = []  # this process's psutil.Process, once: building one reads its start time from /proc (~0.5 ms)


def _this_process() -> psutil.Process:
    if not _OWN or _OWN[0].pid != os.getpid():  # a forked child is another process
        _OWN[:] = [psutil.Process()]
    return _OWN[0]


class Meter:
    """Reads the machine's load between its start and `reading()`; also a context manager.

        with Meter() as meter:
            ... the reading ...
        meter.reading().text()  # 'other processes took 0.9 of 2 cores'
    """

    def __init__(self, gpu_index: int | None = None):
        self.gpu_index = gpu_index
        self._process = _this_process()
        self.start()

    def start(self) -> "Meter":
        self.started = time.perf_counter()
        self.gpu_since_us = int(time.time() * 1e6)
        below = descendants(self._process)  # one look for both sums
        self.system_s, self.tree_s, self.waited_s = \
            _busy_system_s(), _tree_s(self._process, below), _waited_s(self._process, below)
        return self

    def __enter__(self) -> "Meter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.last = self.reading()

    def reading(self) -> Load:
        ended = time.perf_counter()
        wall = ended - self.started
        below = descendants(self._process)
        ours = {self._process.pid} | {p.pid for p in below}
        system_s, tree_s, waited_s = _busy_system_s(), _tree_s(self._process, below), _waited_s(self._process, below)
        self._ended = (ended, int(time.time() * 1e6), system_s, tree_s, waited_s)
        own = tree_s - self.tree_s
        other = (system_s - self.system_s) - own
        cores = psutil.cpu_count() or 1
        # /proc/stat counts in ticks of 10 ms: a short reading's difference can dip below zero or above the machine
        other_cores = min(max(other / wall, 0.0), cores) if wall > 0 else float("nan")
        per_wall = (lambda seconds: seconds / wall) if wall > 0 else (lambda seconds: float("nan"))
        return Load(other_cores, cores, wall, gpu_others(self.gpu_index, self.gpu_since_us, ours), per_wall(own),
                    per_wall(max(waited_s - self.waited_s, 0.0)), _torch_threads())

    def restart(self) -> "Meter":
        """Start the next reading where the last `reading()` ended, from the counters it read: the same
        moment's counters, not read a second time a few microseconds later."""
        self.started, self.gpu_since_us, self.system_s, self.tree_s, self.waited_s = self._ended
        return self


def _torch_threads() -> int | None:
    """torch's intra-op threads now, where this process has torch loaded (this module never imports it)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


WINDOW_S = 0.2  # a run's load is read at most this often: a reading walks the process tree (1-3 ms)
WINDOW_COLUMNS = ("other_cores", "own_cores", "waited_cores")  # a run's per-window load, in its step columns
NO_READING = -1.0  # on the rows where no reading ended (not NaN: a column of them would not equal itself)


class Windows:
    """Stamps a run's log windows (MetricsLog.stamp) with the load since the reading before: a reading
    every WINDOW_S at most, on the last row of the window that ends it (NO_READING on every other row).

    A run's whole-run load averages a burst that hit a few of its blocks away; read beside its steps, the
    load says which blocks ran beside the burst, and a comparison can tell blocks under different loads
    apart (runs/compare.py)."""

    def __init__(self):
        self.meter = Meter()

    def __call__(self, rows: dict) -> dict:
        n = len(rows.get("step", ()))
        out = {name: [NO_READING] * n for name in WINDOW_COLUMNS}
        if n and time.perf_counter() - self.meter.started >= WINDOW_S:
            reading = self.meter.reading()
            self.meter.restart()  # the next window begins where this one ended
            for name in WINDOW_COLUMNS:  # one not known here (a wait off Linux): NO_READING too
                value = getattr(reading, name)
                out[name][-1] = value if math.isfinite(value) else NO_READING
        return out


@contextlib.contextmanager
def stamping(log):
    """A run's log (metrics.MetricsLog) stamped with Windows while the block runs."""
    stamp = Windows()
    log.stamp(stamp)
    try:
        yield log
    finally:
        log.unstamp(stamp)


@dataclass(frozen=True)
class Window:
    """The load over rows [first, end) of a run's step columns."""
    first: int
    end: int
    load: Load


def windows(columns: dict) -> list[Window]:
    """A run's per-window loads from its step columns ([] for a run recorded before they were)."""
    if any(name not in columns for name in WINDOW_COLUMNS):
        return []
    cores = psutil.cpu_count() or 1
    times, out, first = list(columns.get("time", ())), [], 0
    for row, other in enumerate(columns["other_cores"]):
        if math.isfinite(other) and other != NO_READING:
            wall = times[row] - (times[first - 1] if first else 0.0) if times else math.nan
            own, waited = (v if v != NO_READING else math.nan for v in (columns["own_cores"][row],
                                                                       columns["waited_cores"][row]))
            out.append(Window(first, row + 1, Load(other, cores, wall, own_cores=own, waited_cores=waited)))
            first = row + 1
    return out


def of_device(device) -> Meter:
    """A Meter started now for a reading on `device` (a torch.device): a CUDA device's index is asked of NVML."""
    return Meter(gpu_index=(device.index or 0) if device.type == "cuda" else None)


def gpu_others(index: int | None, since_us: int, ours: set[int]) -> float | None:
    """The highest GPU utilisation (%) a process outside this tree (`ours`: its pids) had since `since_us`, by NVML's
    per-process samples; None where there is no GPU, no NVML, or the driver keeps no samples."""
    if index is None:
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except Exception:  # no pynvml, no driver, or no samples kept: unknown, not zero
        return None
    return float(max((s.smUtil for s in samples if s.pid not in ours), default=0))
