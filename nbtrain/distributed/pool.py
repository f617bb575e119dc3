"""Processes the kernel starts: the warm zygote, output relay, and clean termination.

A DDP rank must never be a fork of the kernel (it may hold CUDA), and a fresh interpreter
spends seconds importing torch. So the kernel starts one fresh interpreter, the zygote
(zygote.py), that imports torch once and forks each run's ranks: the first launch pays
one import instead of one per rank, and every later launch none. Every process runs in
its own session (the kernel's Ctrl-C is not theirs), watches the kernel's pid, and is
reaped when the kernel exits.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import deque

import psutil


# The folder this nbtrain was imported from: children import the same nbtrain as the kernel.
_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_env(threads: int, extra: dict | None = None) -> dict:
    """The kernel's environment for a child interpreter: the same nbtrain, unbuffered output, and OpenMP's
    thread count (read when a fresh interpreter loads it; a rank also sets torch's from its plan)."""
    env = dict(os.environ)
    path = os.pathsep.join(p for p in (_HOME, env.get("PYTHONPATH")) if p)
    env.update({"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    env.update(extra or {})
    return env


def start(argv: list[str], env: dict, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """A child interpreter in its own session, its output piped to the kernel."""
    return subprocess.Popen([sys.executable, "-u", *argv], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)


# A rank started as a fresh interpreter, with the kernel's import path (as a forked rank gets it): argv is
# [sys.path as JSON, RUN_DIR]. It ends as worker.py's __main__ does (os._exit: a dead peer must not stall it).
_FRESH_RANK = ("import json, os, sys; sys.path[:] = json.loads(sys.argv[1]); "
               "from nbtrain.distributed.worker import main; code = main(sys.argv[2:]); "
               "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)")


def start_rank(run_dir: str, env: dict, stdout: str, stderr: str) -> subprocess.Popen:
    """A rank as a fresh interpreter (where the zygote cannot fork one): output to the run's files, in its own
    session, in the kernel's current folder."""
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        return subprocess.Popen([sys.executable, "-u", "-c", _FRESH_RANK, json.dumps(sys.path), run_dir],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True)


class ForkRefused(RuntimeError):
    """The zygote will not fork this rank (CUDA is initialised in it); the message says why."""


class Zygote:
    """The kernel's handle on `python -m nbtrain.distributed.zygote`: started once, forks every run's ranks."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._started: dict[str, int] = {}
        self._refused: dict[str, str] = {}
        self._exits: dict[int, int] = {}
        self._ready = threading.Event()
        self._changed = threading.Condition()
        self._errors: deque = deque(maxlen=40)

    def prewarm(self) -> None:
        """Start the zygote now (in the background), so the next launch finds it ready."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._ready.clear()
            # An NVML device count never initialises the CUDA driver, so the zygote stays fork-safe.
            # The zygote outlives any one run, so it has no plan: the kernel's pid comes in its environment.
            env = worker_env(1, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "NBTRAIN_OWNER_PID": str(os.getpid())})
            self._proc = start(["-m", "nbtrain.distributed.zygote"], env, stdin=subprocess.PIPE)
            proc = self._proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        threading.Thread(target=self._keep_errors, args=(proc,), daemon=True).start()

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        self.prewarm()
        return self._ready.wait(timeout_s)

    def fork(self, run_dir: str, rank: int, env: dict, stdout: str, stderr: str) -> "ForkedRank":
        """A new rank forked from the warm zygote, running `python -m nbtrain.distributed.worker`'s job;
        ForkRefused when the zygote finds CUDA initialised in itself."""
        self.prewarm()
        token = f"{run_dir}#{rank}"
        # The kernel's environment, folder and import path now, not when the zygote started:
        # a forked rank sees what a freshly started one would.
        job = {"token": token, "run_dir": run_dir, "env": env, "cwd": os.getcwd(), "sys_path": sys.path,
               "stdout": stdout, "stderr": stderr}
        with self._lock:
            proc = self._proc
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()
        with self._changed:
            while token not in self._started:
                if token in self._refused:
                    raise ForkRefused(self._refused.pop(token))
                if proc.poll() is not None:
                    raise RuntimeError("nbtrain's worker starter (python -m nbtrain.distributed.zygote) exited with code "
                                       f"{proc.returncode}:\n{''.join(self._errors)}")
                self._changed.wait(0.1)
            return ForkedRank(self._started.pop(token), self)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def pids(self) -> list[int]:
        proc = self._proc
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            terminate([proc], grace_s=2.0)

    def _read(self, proc):
        for raw in iter(proc.stdout.readline, b""):
            message = json.loads(raw)
            with self._changed:
                if "ready" in message:
                    self._ready.set()
                elif "started" in message:
                    self._started[message["started"]] = message["pid"]
                    # pids wrap (pid_max may be 32768): a new rank must not inherit the exit code of an
                    # earlier rank that had its pid, or it would be "failed" before it ran.
                    self._exits.pop(message["pid"], None)
                elif "refused" in message:
                    self._refused[message["refused"]] = message["why"]
                elif "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                self._changed.notify_all()

    def _keep_errors(self, proc):
        for raw in iter(proc.stderr.readline, b""):
            self._errors.append(raw.decode("utf-8", "replace"))


class ForkedRank:
    """A rank forked by the zygote: its pid, and its exit code once the zygote reaped it."""

    def __init__(self, pid: int, zygote: Zygote):
        self.pid, self._zygote = pid, zygote

    def poll(self) -> int | None:
        code = self._zygote.exit_code(self.pid)
        if code is None and not psutil.pid_exists(self.pid) and self._zygote.pids() == []:
            return -9  # the zygote itself is gone; so is the rank
        return code


ZYGOTE = Zygote()
atexit.register(ZYGOTE.close)


class FileTail:
    """New complete lines of a file, each time it is asked (a rank's output, as it writes it)."""

    def __init__(self, path: str):
        self.path, self._offset, self._rest = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as stream:
                stream.seek(self._offset)
                chunk = stream.read()
                self._offset = stream.tell()
        except FileNotFoundError:
            return []
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        return [line.decode("utf-8", "replace") + "\n" for line in lines]

    def rest(self) -> list[str]:
        """What is left at the end (a last line without a newline)."""
        lines = self.lines()
        if self._rest:
            lines.append(self._rest.decode("utf-8", "replace") + "\n")
            self._rest = b""
        return lines


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


def terminate(procs: list, grace_s: float = 3.0) -> None:
    """SIGTERM each process (a Popen or a ForkedRank) and everything below it; SIGKILL what is
    left after `grace_s`."""
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
        if isinstance(proc, subprocess.Popen):
            try:
                proc.wait(timeout=grace_s)  # reap our own child
            except subprocess.TimeoutExpired:
                pass
