"""max_time: a run's wall-time budget (as Lightning's Trainer(max_time=...)), kept by a timer; the run ends at its
next step boundary, as any stop does, and a run that ends so has completed its budget, and says so. In a run of
several ranks no rank stops on its own clock (the others would wait in an all-reduce): the timer only marks the time
as up, and the ranks vote at a log window, as they do on a stop or a requeue (distributed/requeue.RequeueWatch)."""
from __future__ import annotations

import contextlib
import threading

TIME_UP = "max_time"  # the stop reason a run reads as "completed at its max_time"
_UP = threading.Event()  # this process's run has passed its max_time (one run trains at a time in a process)


@contextlib.contextmanager
def within(engine, seconds: float | None, run):
    """Inside the block, `run` (a loop.Run) is asked to stop once `seconds` have passed (never where None), unless a
    stop was asked for first, which keeps its reason; with several ranks the time is only marked up (time_up). The
    note of an earlier run's end at its max_time goes."""
    engine.note("max_time", None)
    _UP.clear()
    alone = engine.world.size == 1

    def up():
        _UP.set()
        if alone and not run.stopping:
            run.stop(TIME_UP)
    timer = threading.Timer(seconds, up) if seconds is not None else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        _UP.clear()


def time_up() -> bool:
    """This process's run has passed its max_time (a rank's vote)."""
    return _UP.is_set()


def ended(engine, reason: str, steps: int) -> str:
    """The status of a run stopped for `reason` after `steps` steps: the reason ('stopped' where none was given), or
    'completed' where its max_time ended it (said in the engine's notes)."""
    if reason != TIME_UP:
        return reason or "stopped"
    engine.note("max_time", f"ended at max_time={engine.config.max_time:g} s, after {steps} steps")
    return "completed"
