"""The live plot's frames, drawn in a process of their own.

Drawing a matplotlib frame is Python work that holds the GIL for its whole length, so a frame
drawn on a thread of the kernel is time the training loop waits. Here the kernel only sends what
the log gained since its last frame (MetricsLog.tail: new rows and events, pickled at C speed)
into a pipe and waits for PNG bytes with the GIL released; the drawing process keeps its own copy
of each log it draws, and everything a frame computes (the steady rate and its interval
included) is computed there, on another core.

The drawing process is started once per kernel, by path (`python .../plot_process.py`), and
loads only nbtrain's torch-free modules (metrics, plotting, the steady rate) without the
package's __init__, which imports torch. `warm` starts it and draws a first, empty frame while a
run's first second passes (matplotlib's import and fonts were most of the wait for the first
frame). It ends when its pipe closes (the kernel exited or dropped it). Should it fail to start
or die, the caller draws on its thread as before: a frame is never lost to this.
"""
from __future__ import annotations

import itertools
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
import weakref

_HEADER = struct.Struct("!Q")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nbtrain/


def _send(stream, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _receive(stream) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the other end closed
    (size,) = _HEADER.unpack(header)
    return stream.read(size)


class FrameProcess:
    """The kernel's handle on its drawing process: `png(log, figsize, dpi, title)` -> PNG bytes.

    It remembers how much of each log (by identity, weakly) the drawing process already holds, so
    each frame sends only the rows and events added since the last one."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one frame in flight: live plots of the kernel take turns
        self._sent = weakref.WeakKeyDictionary()  # log -> (key, rows, events, thinning counters) it holds
        self._keys = itertools.count()
        self._warm: set = set()  # frame sizes the process has drawn once
        self.held_s = 0.0  # the latest frame's CPU time on the calling thread: what it held the GIL for
        self.sent_bytes = 0  # the latest frame's request
        self.drawn_s = 0.0  # the latest frame's CPU time in the drawing process (waiting for a core not counted)

    def png(self, log, figsize, dpi: int, title: str | None) -> bytes:
        """A frame of `log` (a MetricsLog, live or a copy); RuntimeError when the process cannot draw it."""
        self.held_s = 0.0
        with self._lock:
            for _ in range(2):  # a drawing process that lost its copy of the log (restarted) is sent it whole
                status, body = self._ask(log, (tuple(figsize), dpi, title))
                if status != "resend":
                    break
                self._sent.pop(log, None)
        if status != "png":
            raise RuntimeError(body)
        return body

    def warm(self, figsize, dpi: int) -> None:
        """Start the drawing process and draw an empty frame of this size, so a run's first frame is not
        the one that waits for matplotlib to load; RuntimeError when the process cannot start."""
        with self._lock:
            if self.pid is None or (tuple(figsize), dpi) not in self._warm:
                self._exchange(pickle.dumps(("warm", tuple(figsize), dpi), protocol=pickle.HIGHEST_PROTOCOL))
                self._warm.add((tuple(figsize), dpi))

    def _ask(self, log, frame: tuple) -> tuple[str, object]:
        """Send what the drawing process lacks of `log` and ask for a frame; (status, PNG bytes or words)."""
        started = time.thread_time()  # CPU time, not wall time: waiting for the GIL or a core holds nothing
        key, rows, events, thinned = self._sent.get(log) or (next(self._keys), 0, 0, None)
        tail = log.tail(rows, events)
        if thinned is not None and tail["thinned"] != thinned:  # rows it holds were thinned since: start over
            tail = log.tail(0, 0)
        request = pickle.dumps(("frame", key, tail, *frame), protocol=pickle.HIGHEST_PROTOCOL)
        self.sent_bytes = len(request)
        self.held_s += time.thread_time() - started
        reply = self._exchange(request)
        if reply[0] == "png":
            self._sent[log] = (key, tail["rows"] + len(tail["columns"]["step"]),
                               tail["marks"] + len(tail["events"]), tail["thinned"])
        return reply

    def _exchange(self, request: bytes) -> tuple[str, object]:
        try:
            proc = self._started()
            _send(proc.stdin, request)
            reply = _receive(proc.stdout)
        except (BrokenPipeError, OSError, ValueError) as exc:
            self._drop()
            raise RuntimeError(f"the drawing process is gone ({exc!r})") from None
        if reply is None:
            self._drop()
            raise RuntimeError("the drawing process ended")
        status, body, self.drawn_s = pickle.loads(reply)
        return status, body

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
            self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), _PACKAGE_DIR],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        return self._proc

    def _drop(self) -> None:
        self._sent.clear()  # a new process holds no log, and has drawn nothing
        self._warm.clear()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """End the drawing process: closing its pipe ends it."""
        with self._lock:
            if self._proc is not None:
                self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
                self._sent.clear()
                self._warm.clear()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


_MIRRORS = 8  # logs the drawing process keeps a copy of: the kernel's live plots, the latest first


def _serve(package_dir: str) -> None:
    """The drawing process: frames for as long as its pipe is open."""
    import types
    from collections import OrderedDict
    # nbtrain and nbtrain.measure as bare namespaces: the modules a frame needs (metrics, plotting, the
    # steady rate) load without the packages' __init__.py, which import torch.
    for name, path in (("nbtrain", package_dir), ("nbtrain.measure", os.path.join(package_dir, "measure"))):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    from nbtrain.metrics import MetricsLog
    from nbtrain.plotting import live_frame
    figures, logs = {}, OrderedDict()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (request := _receive(stdin)) is not None:
        started = time.process_time()
        try:
            kind, *args = pickle.loads(request)
            if kind == "warm":
                figsize, dpi = args
                reply = ("png", live_frame(figures, MetricsLog(), figsize, dpi))
            else:
                key, tail, figsize, dpi, title = args
                log = MetricsLog() if tail["rows"] == tail["marks"] == 0 else logs.get(key)
                try:
                    log.add_tail(tail)
                except (AttributeError, ValueError):  # no copy of this log here (a new process), or one behind
                    log = None
                if log is None:
                    reply = ("resend", "the drawing process holds no up-to-date copy of this log")
                else:
                    logs[key] = log
                    logs.move_to_end(key)
                    while len(logs) > _MIRRORS:
                        logs.popitem(last=False)
                    reply = ("png", live_frame(figures, log, figsize, dpi, title))
        except Exception as exc:  # said to the kernel, which draws the frame itself
            reply = ("error", f"drawing failed in the plot process: {exc!r}")
        _send(stdout, pickle.dumps((*reply, time.process_time() - started), protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    try:
        _serve(sys.argv[1])
    except KeyboardInterrupt:  # the kernel's process group was interrupted or shut down: end quietly
        pass
