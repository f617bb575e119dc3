"""Faults in DDP workers: nothing hangs, nothing leaks, nothing is swallowed (real processes)."""
import os
import signal
import sys
import textwrap
import threading
import time

import cloudpickle
import psutil
import pytest

from nbtrain import MetricsLog, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launch import fit_distributed, launch
from nbtrain.distributed.launchers.base import WorkerError

from helpers import kernel_helpers, same_weights, weights

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _running(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_gone(pids, within_s=10.0):
    """The pids still running after `within_s` (polled, so a quick exit is seen at once)."""
    deadline = time.monotonic() + within_s
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pids)


def _assert_all_gone(pids, within_s=10.0):
    assert _wait_gone(pids, within_s) == [], "workers still running"
    idle = kernel_helpers()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in idle
            and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"children left behind: {left}"


def _rank_one_raises():
    import torch
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise ValueError("rank one cannot go on")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for its peer
    return "unreachable"


def _both_ranks_answer():
    import torch.distributed as dist
    return dist.get_world_size()


@pytest.mark.slow
def test_a_rank_raising_fails_with_that_ranks_traceback_and_the_next_launch_works():
    with pytest.raises(WorkerError) as caught:
        launch(_rank_one_raises, nprocs=2, timeout=60)
    error = caught.value
    assert error.rank == 1
    assert str(error).startswith("rank 1 raised ValueError: rank one cannot go on")
    assert "in _rank_one_raises" in str(error) and 'raise ValueError("rank one cannot go on")' in str(error)
    assert "torch/distributed" not in error.traceback  # user frames only
    _assert_all_gone(error.pids)
    assert launch(_both_ranks_answer, nprocs=2) == 2


def _rank_one_hangs():
    import time
    import torch
    import torch.distributed as dist
    if dist.get_rank() == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(1))


@pytest.mark.slow
def test_a_rank_hanging_in_a_collective_ends_with_a_clear_timeout_message():
    with pytest.raises(WorkerError) as caught:
        launch(_rank_one_hangs, nprocs=2, timeout=3)
    assert str(caught.value).startswith("rank 0 timed out after 3 s waiting in a collective operation")
    assert "raise timeout=" in str(caught.value)
    _assert_all_gone(caught.value.pids)


def _rank_one_killed():
    import os
    import signal
    import torch
    import torch.distributed as dist
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


def test_a_rank_killed_by_a_signal_is_reported_with_its_rank_and_the_signal_name():
    with pytest.raises(WorkerError) as caught:
        launch(_rank_one_killed, nprocs=2, timeout=60)
    assert str(caught.value) == "rank 1 was killed by SIGKILL; the other ranks were stopped"
    assert caught.value.signal_name == "SIGKILL"
    _assert_all_gone(caught.value.pids)


@pytest.mark.slow
def test_interrupting_the_cell_stops_every_worker_and_keeps_the_partial_history():
    recipe = digits_recipe()
    before = weights(recipe.model)
    log = MetricsLog()
    pids = []

    def interrupt_once_training_shows(event, _log):
        if event["type"] == "steps" and not pids:
            idle = kernel_helpers()
            pids.extend(p.pid for p in psutil.Process().children(recursive=True) if p.pid not in idle)
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # as the kernel's interrupt

    log.subscribe(interrupt_once_training_shows)
    result = fit_distributed(recipe, TrainConfig(devices=2, accelerator="cpu", max_epochs=500, batch_size=16,
                                                 log_every_n_steps=2), log=log)
    assert result.status == "interrupted" and "history up to step" in result.message
    assert len(result.history["step"]) >= 2 and result.history["loss"][0] > 0
    assert same_weights(weights(recipe.model), before)  # the kernel's model keeps its weights
    assert len(pids) >= 2
    _assert_all_gone(pids)


# A kernel that trains on 2 ranks and prints their pids once they step: SIGKILLed five times over by
# tests/test_fault_repetition.py, which asks of each what a single kill here asked (its ranks gone within 10 s).
KERNEL = textwrap.dedent("""
    import sys, psutil
    from nbtrain import MetricsLog, TrainConfig
    from nbtrain.demo import digits_recipe
    from nbtrain.distributed.launch import fit_distributed
    log = MetricsLog()
    def report(event, _log):
        if event["type"] == "steps" and not getattr(report, "done", False):
            report.done = True
            print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
    log.subscribe(report)
    fit_distributed(digits_recipe(), TrainConfig(devices=2, accelerator="cpu", max_epochs=500, batch_size=16,
                                                 log_every_n_steps=2), log=log, echo=False)
""")


def _raise_on_rank_one(model, batch):
    import torch.distributed as dist
    import torch.nn.functional as F
    if dist.get_rank() == 1:
        raise ValueError("node trouble on rank 1")
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.mark.slow
def test_a_rank_raising_on_one_of_two_nodes_fails_both_launchers_and_names_the_cause():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    errors = {}

    def node(rank):
        recipe = digits_recipe()
        recipe.training_step = _raise_on_rank_one
        try:
            fit_distributed(recipe, TrainConfig(num_nodes=2, batch_size=16, max_steps=2, accelerator="cpu"),
                            node_rank=rank, rdzv_endpoint=endpoint, timeout=60, echo=False)
        except WorkerError as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    messages = [str(e).splitlines()[0] for e in errors.values()]
    assert len(messages) == 2, errors  # both launchers fail; neither hangs
    # The node that held rank 1 names the cause; the other says it lost its peer (usually:
    # its agent may also stop it first, when the message is its agent's last words).
    assert "rank 1 raised ValueError: node trouble on rank 1" in messages, messages
    _assert_all_gone([pid for e in errors.values() for pid in e.pids])
