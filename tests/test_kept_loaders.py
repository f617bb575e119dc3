"""Loaders kept with their workers running between runs (Engine.keeping_workers, engine/kept_loaders.py):
what a race's blocks alternate on, so a worker start-up is paid once per config, not once per block.
Real worker processes throughout."""
import time

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from checklist_recipes import data_bound_recipe, state, same_state
from nbtrain import Engine, Recipe, TrainConfig
from nbtrain.tools import trial
from nbtrain.walk import bench as walk_bench


class Indexed(Dataset):
    """Sample i is (features from i, i % 3): its batches say which samples came, and in what order."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.full((4,), float(i)) / 96, i % 3


def _recipe():
    torch.manual_seed(0)
    return Recipe(model=nn.Linear(4, 3), train_data=Indexed(), loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1))


WORKERS = TrainConfig(batch_size=8, num_workers=2, persistent_workers=True, seed=3)


def _worker_pids(engine) -> list:
    iterator = getattr(engine.loader, "_iterator", None)
    return sorted(w.pid for w in iterator._workers) if iterator is not None else []


def _living_children() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE}


def _gone(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while pids & _living_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pids & _living_children()


def test_runs_inside_the_block_take_the_same_workers_and_they_are_stopped_on_the_way_out():
    engine = Engine(_recipe(), WORKERS)
    before = _living_children()
    with engine.keeping_workers():
        engine.reconfigure(WORKERS.replace(max_steps=2))
        engine.run()
        first = _worker_pids(engine)
        engine.reconfigure(WORKERS.replace(max_steps=4))
        engine.run()
        assert first and _worker_pids(engine) == first  # the same processes, not a new start-up
        # the pass that ended left nothing asked of them: they do not take the cores from what runs next
        assert engine.loader._iterator._tasks_outstanding == 0
    assert _gone(set(first)) and _living_children() <= before | set()
    # Outside the block every run stops its workers at its end, as before.
    engine.reconfigure(WORKERS.replace(max_steps=2))
    engine.run()
    assert engine.loader._iterator is None


@pytest.mark.parametrize("steps", [(3, 5), (7, 12, 2), (12, 1, 1, 9)])
def test_training_inside_the_block_is_training_outside_it(steps):
    # Runs that stop mid-epoch and continue, with the kept loader's workers reused between them: the same
    # samples in the same order as fresh loaders give, so the weights are equal at fp32.
    def train(keep: bool):
        engine = Engine(_recipe(), WORKERS)
        with engine.keeping_workers() if keep else _nothing():
            for n in steps:
                engine.reconfigure(WORKERS.replace(max_steps=n))
                engine.run()
        return state(engine.model, engine.optimizer), engine.samples

    (kept, samples_kept), (fresh, samples_fresh) = train(True), train(False)
    assert samples_kept == samples_fresh == 8 * sum(steps)
    assert same_state(kept, fresh)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_race_keeps_each_configs_workers_and_the_walk_stops_them_all():
    # The walk's bench (walk/bench.py: EngineBench): a config's blocks in one race share one set of workers, warmed
    # up before its first counted block; after the race only the configs the walk goes on with keep theirs;
    # at the walk's end none is left, and the live engine is as it was.
    recipe = data_bound_recipe(n=256)
    live = Engine(recipe, TrainConfig(batch_size=16))
    at_start = state(live.model, live.optimizer)
    before = _living_children()
    lent = live.trial()
    bench, engine = walk_bench.EngineBench(lent), lent.engine
    two, one = (TrainConfig(batch_size=16, num_workers=n, persistent_workers=True) for n in (2, 1))
    seen = []
    for _ in range(3):
        for config in (two, one):
            block = bench.block(config, 0.1)
            assert block.rate > 0 and not block.note
            seen.append(sorted(w.pid for w in bench._kept.loaders[engine.loader_key(config)]._iterator._workers))
    assert seen[0] == seen[2] == seen[4] and seen[1] == seen[3] == seen[5] and seen[0] != seen[1]
    bench.race_over([two])  # the walk goes on with `two`: `one`'s workers stop now
    assert _gone(set(seen[1])) and set(seen[0]) <= _living_children()
    assert list(bench._kept.loaders) == [engine.loader_key(two)] and bench.warm == {two}
    bench.restore()
    lent.close()
    assert _gone(set(seen[0])) and _living_children() <= before
    assert same_state(at_start, state(live.model, live.optimizer))


class PidData(Dataset):
    """Each sample carries the pid of the process that loaded it."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import os
        return torch.full((4,), float(os.getpid())), i % 3


class SeesLoaders(nn.Module):
    """Records which processes loaded the batches it trains on."""

    def __init__(self):
        super().__init__()
        self.linear, self.loaders = nn.Linear(4, 3), set()

    def forward(self, x):
        self.loaders.update(int(p) for p in x[:, 0].tolist())
        return self.linear(x / 1e6)


def test_ab_keeps_each_sides_workers_from_block_to_block():
    # nbtrain.ab of num_workers restarted the workers in every block: their start-up fell inside the timed
    # steps (the CPU benchmark's A/B read 0 and 2 workers at batch 256 as "no measurable difference",
    # where 2-second trials measured 7,053 and 12,309 samples/s).
    import nbtrain
    torch.manual_seed(0)
    model = SeesLoaders()
    recipe = Recipe(model=model, train_data=PidData(), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    result = nbtrain.ab(recipe=recipe, config=TrainConfig(batch_size=8), a={}, block_steps=3, min_pairs=3,
                        max_pairs=3, b={"num_workers": 2, "persistent_workers": True})
    assert len(result.rates_b) == 3
    workers = model.loaders - {psutil.Process().pid}
    assert len(workers) == 2, workers  # one pair of workers for the uncounted block and the three counted ones
    assert _gone(workers)


def _block_on(device: str):
    """One block of a matmul-heavy step, as a tool times it: (Measurement, the run's log)."""
    from nbtrain.metrics import MetricsLog
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2048, 2048), torch.randint(0, 4, (2048,)))
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)], nn.Linear(2048, 4))
    recipe = Recipe(model=model, train_data=data, loss_fn=nn.CrossEntropyLoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=1e-4))
    config = TrainConfig(batch_size=1024 if device == "cuda" else 32, accelerator=device, log_every_n_steps=1000,
                         preload_data=True)
    with trial.borrow(recipe, config=config) as lent:
        log = MetricsLog()
        return trial.measure(lent.engine, config, steps=8, log=log), log


def test_a_cpu_block_ends_at_its_last_step():
    m, log = _block_on("cpu")
    assert m.device_tail_s == 0.0 and m.steps == 8  # nothing is queued on a CPU
    assert log.last("end")["summary"].get("device_done_s") is None  # not recorded: nothing to wait for


@pytest.mark.cuda
def test_a_cuda_block_ends_when_the_device_has_done_its_last_step():
    # The host queues a step's kernels and moves on: a block timed on the host alone ends before the device
    # has done its last steps. The run synchronises at its two edges only, and a tool's block is charged
    # with the wait (trial_rate adds it to the last step), so the block's time is the device's.
    from nbtrain.measure.steady import step_durations
    m, log = _block_on("cuda")
    host_end = log.columns["time"][-1]
    done = log.last("end")["summary"]["device_done_s"]
    assert done == pytest.approx(host_end + m.device_tail_s)
    assert sum(step_durations(log.columns["time"])) + m.device_tail_s == pytest.approx(done)
