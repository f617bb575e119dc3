"""The live plot's frames, drawn in a process of their own.

Drawing a matplotlib frame is Python work that holds the GIL for its whole length, so a frame
drawn on a thread of the kernel is time the training loop waits. Here the kernel only copies
the log (a snapshot of compact columns, pickled at C speed) into a pipe and waits for PNG
bytes with the GIL released; the frame is drawn on another core.

The drawing process is started once per kernel, by path (`python .../plot_process.py`), and
loads only nbtrain's two torch-free modules (metrics, plotting) without the package's
__init__, which imports torch: it starts in about a second and holds little memory. It ends
when its pipe closes (the kernel exited or dropped it). Should it fail to start or die, the
caller draws on its thread as before: a frame is never lost to this.
"""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import time

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
    """The kernel's handle on its drawing process: `png(log, figsize, dpi, title)` -> PNG bytes."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one frame in flight: live plots of the kernel take turns
        self.held_s = 0.0

    def png(self, log, figsize, dpi: int, title: str | None) -> bytes:
        """A frame of `log` (a MetricsLog snapshot); RuntimeError when the process cannot draw it."""
        started = time.perf_counter()
        request = pickle.dumps((tuple(figsize), dpi, title, log), protocol=pickle.HIGHEST_PROTOCOL)
        self.held_s = time.perf_counter() - started  # the kernel's share of the frame (it holds the GIL)
        with self._lock:
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
        ok, body = pickle.loads(reply)
        if not ok:
            raise RuntimeError(body)
        return body

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
            self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), _PACKAGE_DIR],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        return self._proc

    def _drop(self) -> None:
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

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


def _serve(package_dir: str) -> None:
    """The drawing process: frames for as long as its pipe is open."""
    import types
    # nbtrain and nbtrain.measure as bare namespaces: the modules a frame needs (metrics, plotting, the
    # steady rate) load without the packages' __init__.py, which import torch.
    for name, path in (("nbtrain", package_dir), ("nbtrain.measure", os.path.join(package_dir, "measure"))):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    from nbtrain.plotting import live_frame
    figures = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (request := _receive(stdin)) is not None:
        try:
            figsize, dpi, title, log = pickle.loads(request)
            reply = (True, live_frame(figures, log, figsize, dpi, title))
        except Exception as exc:  # said to the kernel, which draws the frame itself
            reply = (False, f"drawing failed in the plot process: {exc!r}")
        _send(stdout, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    try:
        _serve(sys.argv[1])
    except KeyboardInterrupt:  # the kernel's process group was interrupted or shut down: end quietly
        pass
