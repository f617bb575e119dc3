"""Worker processes the kernel starts: a warm pool, live output relay, and clean termination.

A DDP rank must be a fresh interpreter (never a fork of a kernel that may hold CUDA),
and a fresh interpreter spends seconds importing torch. The warm pool starts
`python -m nbtrain.worker --serve` ahead of time: each imports torch, never touches CUDA,
and waits for one job, so a repeat launch skips the import. Every process runs in its own
session (the kernel's Ctrl-C is not theirs), watches the kernel's pid, and is reaped
when the kernel exits.
"""
from __future__ import annotations

import atexit
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import psutil


def worker_env(threads: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"NBTRAIN_OWNER_PID": str(os.getpid()), "OMP_NUM_THREADS": str(threads),
                "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def start(argv: list[str], env: dict, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """A child interpreter in its own session, its output piped to the kernel."""
    return subprocess.Popen([sys.executable, "-u", *argv], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)


class WarmPool:
    """Idle `nbtrain.worker --serve` interpreters, keyed by their thread count."""

    def __init__(self):
        self._idle: list[tuple[int, subprocess.Popen]] = []
        self._lock = threading.Lock()
        self._ready_dir: str | None = None
        self.enabled = True

    def take(self, count: int, threads: int) -> list[subprocess.Popen]:
        """`count` serving workers: warm ones first, fresh ones for the rest."""
        with self._lock:
            alive = [(t, p) for t, p in self._idle if p.poll() is None]
            fitting = [p for t, p in alive if t == threads][:count]
            self._idle = [(t, p) for t, p in alive if p not in fitting]
        fresh = [self._spawn(threads) for _ in range(count - len(fitting))]
        return fitting + fresh

    def prewarm(self, count: int, threads: int) -> None:
        """Start workers now so the next launch of `count` ranks finds them ready."""
        if not self.enabled:
            return
        with self._lock:
            ready = sum(1 for t, p in self._idle if t == threads and p.poll() is None)
        spawned = [(threads, self._spawn(threads)) for _ in range(max(0, count - ready))]
        with self._lock:
            self._idle += spawned

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until every idle worker has imported torch (for benchmarks and eager users)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if all((Path(self._ready_dir or "", str(pid))).exists() for pid in pids):
                return True
            time.sleep(0.05)
        return False

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for _, p in self._idle if p.poll() is None]

    def close(self) -> None:
        """End every idle worker (they exit on their own when the kernel dies, too)."""
        with self._lock:
            idle, self._idle = self._idle, []
        terminate([p for _, p in idle], grace_s=2.0)

    def _spawn(self, threads: int) -> subprocess.Popen:
        if self._ready_dir is None:
            self._ready_dir = tempfile.mkdtemp(prefix="nbtrain-pool-")
        env = worker_env(threads, {"NBTRAIN_READY_DIR": self._ready_dir})
        return start(["-m", "nbtrain.worker", "--serve"], env, stdin=subprocess.PIPE)


POOL = WarmPool()
atexit.register(POOL.close)


class Relay:
    """Reads children's output on threads; the kernel's own thread prints it (cell output
    from the right thread), each line prefixed with where it came from."""

    def __init__(self, keep_lines: int = 40):
        self.lines: queue.Queue = queue.Queue()
        self.tails: dict[str, deque] = {}
        self._threads: list[threading.Thread] = []
        self._keep = keep_lines

    def follow(self, proc: subprocess.Popen, label: str, prefix: str | None) -> None:
        tail = self.tails.setdefault(label, deque(maxlen=self._keep))
        for stream, is_err in ((proc.stdout, False), (proc.stderr, True)):
            thread = threading.Thread(target=self._pump, args=(stream, is_err, prefix, tail), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, stream, is_err, prefix, tail):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            if prefix is not None and not line.startswith("[rank "):
                line = prefix + line
            if is_err:
                tail.append(line)
            self.lines.put((is_err, line))
        stream.close()

    def show(self, echo: bool = True) -> None:
        """Print every line received so far (call from the kernel's thread)."""
        while True:
            try:
                is_err, line = self.lines.get_nowait()
            except queue.Empty:
                return
            if echo:
                target = sys.stderr if is_err else sys.stdout
                target.write(line)
                target.flush()

    def finish(self, echo: bool = True, wait_s: float = 2.0) -> None:
        for thread in self._threads:
            thread.join(wait_s)
        self.show(echo)


def terminate(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM each process and everything below it, then SIGKILL what is left after `grace_s`."""
    victims: list[psutil.Process] = []
    for proc in procs:
        if proc.poll() is not None:
            continue
        try:
            root = psutil.Process(proc.pid)
            victims += [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
    for victim in victims:
        try:
            victim.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(victims, timeout=grace_s)
    for victim in alive:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
