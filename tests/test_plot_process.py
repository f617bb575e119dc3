"""The live plot draws in a process of its own: the kernel only copies the log, never holds the GIL
for a frame; that process loads no torch, ends with its kernel, and a frame survives it dying."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import nbtrain
from nbtrain.demo import digits_recipe
from nbtrain.notebook.plot_process import FrameProcess
from nbtrain.notebook.views import LivePlot

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def trained_log():
    log = nbtrain.MetricsLog()
    nbtrain.fit(recipe=digits_recipe(), max_steps=60, accelerator="cpu", log=log, log_every_n_steps=5)
    return log.snapshot()


def test_frames_are_drawn_in_another_process_that_loads_no_torch(trained_log, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    drawn_here = []  # the kernel's share of a frame is the copy into the pipe: it renders nothing itself
    monkeypatch.setattr(FigureCanvasAgg, "draw", lambda canvas, *a, **k: drawn_here.append(canvas))
    frames = FrameProcess()
    try:
        png = frames.png(trained_log, (8.5, 2.8), 120, "a run")
        assert png.startswith(PNG) and drawn_here == []
        child = psutil.Process(frames.pid)
        assert child.pid != os.getpid() and child.ppid() == os.getpid()
        libraries = {m.path for m in child.memory_maps()}
        assert not [p for p in libraries if "libtorch" in p], "the drawing process loaded torch"
        assert frames.png(trained_log, (8.5, 2.8), 120, "again").startswith(PNG)  # the same process, again
        assert drawn_here == []
        assert frames.pid == child.pid
    finally:
        frames.close()
    assert frames.pid is None and not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE


def test_a_killed_drawing_process_is_replaced_at_the_next_frame(trained_log):
    from nbtrain.notebook import views
    plot = LivePlot(title="t")
    plot._log = trained_log
    plot._show = lambda png, log: setattr(plot, "last_png", png)
    plot.redraw()
    first = views.FRAMES.pid
    assert plot.last_png.startswith(PNG) and plot.fallback is None and first is not None
    os.kill(first, signal.SIGKILL)
    psutil.Process(first).wait(10)
    plot.last_png = b""
    plot.redraw()
    assert plot.last_png.startswith(PNG) and plot.error is None and plot.fallback is None
    assert views.FRAMES.pid not in (None, first)


def test_where_no_drawing_process_can_start_the_plot_draws_its_frames_itself(trained_log, monkeypatch):
    from nbtrain.notebook import views
    monkeypatch.setattr(views, "FRAMES", FrameProcess())
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # as where starting processes fails
    plot = LivePlot(title="t")
    plot._log = trained_log
    plot._show = lambda png, log: setattr(plot, "last_png", png)
    held = plot.redraw()
    assert plot.last_png.startswith(PNG) and plot.error is None
    assert "drawing process" in plot.fallback and held > 0  # drawn here: the time counts against the budget


@pytest.mark.slow
def test_the_drawing_process_ends_with_the_kernel_that_started_it(trained_log, tmp_path, cpu_load):
    script = tmp_path / "kernel.py"
    script.write_text(
        "import os, pickle, sys\n"
        "from nbtrain.notebook.plot_process import FrameProcess\n"
        f"log = pickle.load(open({str(tmp_path / 'log.pkl')!r}, 'rb'))\n"
        "frames = FrameProcess()\n"
        "frames.png(log, (6, 2), 72, None)\n"
        "print(frames.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n")
    import pickle
    (tmp_path / "log.pkl").write_bytes(pickle.dumps(trained_log))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    drawing_pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(drawing_pid) and psutil.Process(drawing_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the drawing process outlived its kernel"
        time.sleep(0.1)


def _window(log, start: int, rows: int = 10) -> None:
    log.emit({"type": "steps", "rows": {"step": list(range(start, start + rows)),
                                        "samples": [32 * (s + 1) for s in range(start, start + rows)],
                                        "time": [0.01 * (s + 1) for s in range(start, start + rows)],
                                        "loss": [1 / (s + 1) for s in range(start, start + rows)]}})


def _same(copy, log) -> bool:
    """The same rows (bit for bit: NaN is a missing value), the same events between them, the same thinning."""
    def record(log):
        return ({name: (c.typecode, c.tobytes()) for name, c in log.columns.items()},
                [m for m in log._marks], log.thinning)
    return record(copy) == record(log)


def test_a_log_kept_up_by_its_tails_is_the_log_through_new_columns_events_and_thinning():
    log, copy, sent = nbtrain.MetricsLog(), nbtrain.MetricsLog(), (0, 0, None)
    log.emit({"type": "start", "config": {"log_every_n_steps": 10}, "info": {}})

    def catch_up(copy, sent):
        rows, events, thinned = sent
        tail = log.tail(rows, events)
        if thinned is not None and tail["thinned"] != thinned:  # thinned since: a new copy, from the start
            copy, tail = nbtrain.MetricsLog(), log.tail(0, 0)
        copy.add_tail(tail)
        return copy, (len(copy), len(copy._marks), tail["thinned"])

    for start in range(0, 200, 10):
        _window(log, start)
        if start == 100:  # a column that appears mid-run (a stamp), and an event between windows
            log.stamp(lambda rows: {"load": [0.5] * len(rows["step"])})
            log.emit({"type": "change", "step": start, "changes": {"lr": [0.1, 0.01]}})
        if start % 30 == 0:
            copy, sent = catch_up(copy, sent)
            assert _same(copy, log)
    log._thin(64)  # (what a long run does past MetricsLog.MAX_ROWS)
    _window(log, 200)
    copy, sent = catch_up(copy, sent)
    assert _same(copy, log) and log.thinning
    with pytest.raises(ValueError, match="does not continue"):
        nbtrain.MetricsLog().add_tail(log.tail(10, 1))


def test_each_frame_sends_the_drawing_process_only_what_the_log_gained(trained_log):
    log = trained_log.snapshot()
    for start in range(60, 3000, 10):
        _window(log, start)
    frames = FrameProcess()
    try:
        assert frames.png(log, (6, 2), 72, "t").startswith(PNG)
        whole = frames.sent_bytes
        assert whole > 150_000  # the first frame: the whole log
        _window(log, 3000)
        assert frames.png(log, (6, 2), 72, "t").startswith(PNG)
        assert frames.sent_bytes < 3_000 and frames.drawn_s > 0  # then ten rows
        key, rows, events, thinned = frames._sent[log]
        frames._sent[log] = (key + 100, rows, events, thinned)  # as if the process had lost its copy
        _window(log, 3010)
        assert frames.png(log, (6, 2), 72, "t").startswith(PNG) and frames.sent_bytes > whole
    finally:
        frames.close()
