"""What a load reading costs: each window reads the machine once, and the threads' waits are read as psutil
reads them."""
import threading
import time

import psutil
import pytest

from nbtrain.measure import load


def test_each_window_reads_the_machine_once_and_the_next_begins_where_it_ended(monkeypatch):
    reads = []
    real = load._busy_system_s
    monkeypatch.setattr(load, "_busy_system_s", lambda: reads.append(1) or real())
    windows = load.Windows()
    assert len(reads) == 1  # the first window's start
    monkeypatch.setattr(load, "WINDOW_S", 0.0)
    for window in range(3):
        time.sleep(0.01)
        out = windows({"step": [window]})
        assert out["own_cores"][-1] != load.NO_READING
    assert len(reads) == 1 + 3  # one reading per window: its end is the next one's start
    ended = windows.meter._ended
    assert (windows.meter.started, windows.meter.system_s, windows.meter.tree_s, windows.meter.waited_s) == \
        (ended[0], ended[2], ended[3], ended[4])


def test_a_processes_waits_for_a_cpu_sum_its_threads_schedstat_as_psutil_lists_them():
    if not load.os.path.exists("/proc/self/task"):
        pytest.skip("off Linux a thread's wait is unknown (NaN)")
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        me = psutil.Process()
        by_psutil = {t.id for t in me.threads()}
        by_folder = {int(tid) for tid in load.os.listdir(f"/proc/{me.pid}/task")}
        assert by_psutil == by_folder and len(by_folder) >= 2
        stopped = load._waited_ns(me.pid)
        expected = 0
        for tid in by_folder:
            with open(f"/proc/{me.pid}/task/{tid}/schedstat") as f:
                expected += int(f.read().split()[1])
        assert 0 <= stopped <= expected  # read first: the later sum can only have grown
    finally:
        stop.set()
        worker.join()


def test_this_processes_cpu_is_read_from_the_kernels_times_as_psutil_reads_it_from_proc(monkeypatch):
    me = psutil.Process()
    sum(range(2_000_000))  # some CPU time to read
    before = me.cpu_times()
    ours = load._tree_s(me, [])
    after = me.cpu_times()
    seconds = lambda t: t.user + t.system + t.children_user + t.children_system  # noqa: E731
    assert seconds(before) <= ours <= seconds(after)
    reads = []
    monkeypatch.setattr(psutil.Process, "cpu_times", lambda self: reads.append(self) or before)
    load._tree_s(me, [])
    assert reads == []  # this process's own is the times() call, not a parse of /proc/<pid>/stat
