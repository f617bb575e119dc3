"""The checklist's thread item (walk/items.py `threads`) on simulated machines (tests/simulated_machine.py): on a
CPU shared with a busy process, torch's default of a thread per core waits for a core and stalls the step, and the
walk races fewer threads first and keeps them; on a quiet CPU, where the default is faster, it keeps the default;
on a GPU it says why it does not apply."""
import dataclasses

import pytest

from landscapes import LANDSCAPES
from nbtrain.walk.items import REGISTRY, thread_candidates
from nbtrain.walk.walker import run_walk
from simulated_machine import SimulatedMachine, true_rate

DIGITS_CPU = next(land for land in LANDSCAPES if land.name == "cpu-compute-bound-conv")  # 2 cores


def walk_on(land, seed):
    machine = SimulatedMachine(land, seed=seed)
    return run_walk(machine, budget_s=30, clock=machine.clock)


def test_threads_is_one_item_raced_first_and_the_candidates_are_one_half_the_cores_and_the_default():
    assert REGISTRY["threads"].stage == "first" and not REGISTRY["threads"].answers
    assert thread_candidates(now=8, default=8, cores=8) == [1, 4]
    assert thread_candidates(now=1, default=8, cores=8) == [4, None]  # None: back to torch's default
    assert thread_candidates(now=2, default=2, cores=2) == [1] and thread_candidates(1, 1, 1) == []
    assert thread_candidates(now=1, default=1, cores=2) == []  # OMP_NUM_THREADS=1: never more than it asked for
    assert thread_candidates(now=2, default=1, cores=2) == [None]  # a run given 2 races torch's default (1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beside_a_busy_process_the_walk_keeps_fewer_threads_and_says_the_math_is_the_same(seed):
    busy = dataclasses.replace(DIGITS_CPU, name="cpu-conv-beside-a-busy-process", busy_cores=1.0)
    start = busy.start
    assert true_rate(busy, start.replace(num_threads=1)) >= 1.3 * true_rate(busy, start)  # the landscape's premise
    walk = walk_on(busy, seed)
    row = next(i for i in walk.items if i.name == "threads")
    assert row.kept and row.chosen.startswith("num_threads=1") and "same math" in row.chosen, walk.table()
    assert walk.best_config.num_threads == 1, walk.table()


@pytest.mark.parametrize("seed", [0, 1])
def test_on_a_quiet_cpu_the_default_thread_count_stays(seed):
    walk = walk_on(DIGITS_CPU, seed)
    row = next(i for i in walk.items if i.name == "threads")
    assert not row.kept and walk.best_config.num_threads is None, walk.table()


def test_on_a_gpu_the_thread_item_says_why_it_does_not_apply():
    walk = walk_on(LANDSCAPES[0], 0)
    assert not any(i.name == "threads" for i in walk.items)
    assert "this run is on cuda" in dict(walk.skipped)["threads"], walk.skipped
