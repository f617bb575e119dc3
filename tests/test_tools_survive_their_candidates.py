"""A config a tool chose itself never ends the tool: it is skipped with its reason where this machine
cannot run it, or shown as a row "failed: <one line>" when it raises, and the tool goes on.

The first GPU run lost a whole walk to its ddp item on a one-GPU machine ("devices=2: at most 1").
These run on the CPU, with the one-GPU machine as an assumed inventory (hardware.assume).
"""
import os

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, get_worker_info

from nbtrain import Recipe, TrainConfig, hardware
from nbtrain.demo import digits_recipe
from nbtrain.tools import trial
from nbtrain.walk import items as walk_items
from nbtrain.walk.bench import EngineBench
from nbtrain.walk.tool import checklist
from nbtrain.walk.walker import Walk
from nbtrain.tools.tune import find_batch_size
from nbtrain.tools.tune_workers import find_workers

ONE_GPU = hardware.Inventory(cuda_devices=1, cuda_bf16=True, mps=False, cpu_cores=os.cpu_count() or 1)


class RefusesLargeBatches(nn.Module):
    """A model written for batches of at most 8 (it raises, as a user's shape check would)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 3)

    def forward(self, x):
        if x.shape[0] > 8:
            raise ValueError(f"this model takes batches of at most 8, got {x.shape[0]}")
        return self.net(x)


def _small_batch_recipe():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    return Recipe(model=RefusesLargeBatches(), train_data=data, loss_fn=nn.CrossEntropyLoss(),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


def test_on_one_gpu_the_walk_skips_ddp_with_its_reason_before_measuring_anything():
    recipe = digits_recipe()
    with hardware.assume(ONE_GPU):
        with trial.borrow(recipe=recipe, config=TrainConfig(batch_size=16, accelerator="cpu")) as lent:
            walk = Walk(EngineBench(lent), 60.0, 0.2, 0.03, lambda: 0.0, 0.0)
            on_the_gpu = TrainConfig(batch_size=16, accelerator="cuda")
            reason = walk_items.ddp(walk, on_the_gpu)
    assert reason == ("1 CUDA device on this machine: 2 DDP processes would share one GPU, which is slower "
                      "by construction")
    assert walk.trials == 0 and walk.blocks == 0  # nothing was measured for an item that cannot run here


def test_the_ddp_item_says_what_this_machines_cores_allow():
    recipe = digits_recipe()
    with hardware.assume(hardware.Inventory(cuda_devices=1, cuda_bf16=True, mps=False, cpu_cores=1)):
        with trial.borrow(recipe=recipe, config=TrainConfig(batch_size=16, accelerator="cpu")) as lent:
            walk = Walk(EngineBench(lent), 60.0, 0.2, 0.03, lambda: 0.0, 0.0)
            reason = walk_items.ddp(walk, walk.start)
    assert "devices=2" in reason and "at most 1 CPU processes" in reason and walk.trials == 0


@pytest.mark.slow
def test_a_candidate_the_walk_chose_that_raises_is_a_row_and_the_walk_goes_on():
    recipe = _small_batch_recipe()
    with hardware.assume(ONE_GPU):
        walk = checklist(recipe, config=TrainConfig(batch_size=8, accelerator="cpu"), items=("batch_size", "precision"),
                         budget_s=10, trial_s=0.2, clock=lambda: 0.0)
    table = walk.table()
    batch = next(item for item in walk.items if item.name == "batch_size")
    assert not batch.kept and all("failed: ValueError: this model takes batches of at most 8" in t.note
                                  for t in batch.tried), table  # 32 was not tried once 16 failed
    assert "batch_size=16: failed: ValueError: this model takes batches of at most 8, got 16" in table
    # the walk went on to the next item: one row each, in the order walked (an item raced again, as a clean
    # clone's CI saw once when precision's first race ended with too few pairs, is one row, its earlier race in it)
    assert [item.name for item in walk.rows()] == ["batch_size", "precision"], table
    assert [item.name for item in walk.items][:2] == ["batch_size", "precision"], table
    assert walk.best_config.batch_size == 8


def test_the_users_own_config_that_raises_still_raises_from_the_walk():
    recipe = _small_batch_recipe()
    try:
        checklist(recipe, config=TrainConfig(batch_size=16, accelerator="cpu"), items=("precision",),
                  budget_s=10, trial_s=0.2, clock=lambda: 0.0)
    except ValueError as error:
        assert "at most 8, got 16" in str(error)
    else:
        raise AssertionError("the user's own failing config must raise its own error")


@pytest.mark.slow
def test_find_batch_size_shows_a_batch_that_raises_as_a_failed_trial():
    search = find_batch_size(recipe=_small_batch_recipe(), config=TrainConfig(batch_size=4, accelerator="cpu"),
                             speed_s=0)
    assert search.batch_size == 8
    failed = [t for t in search.trials if not t.fits]
    assert failed and all(t.reason.startswith("failed: ValueError: this model takes batches of at most 8")
                          for t in failed)


class FailsInWorkers(Dataset):
    """Data that loads in the kernel but not in a DataLoader worker (as an unpicklable handle would)."""

    def __len__(self):
        return 128

    def __getitem__(self, i):
        if get_worker_info() is not None:
            raise RuntimeError("this dataset's file handle does not survive a worker process")
        return torch.full((8,), float(i % 5)), i % 3


def test_find_workers_shows_a_worker_count_that_fails_as_a_row():
    torch.manual_seed(0)
    recipe = Recipe(model=nn.Linear(8, 3), train_data=FailsInWorkers(), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.05))
    search = find_workers(recipe=recipe, config=TrainConfig(batch_size=16, accelerator="cpu"), candidates=[0, 1],
                          seconds=0.3)
    assert search.best.num_workers == 0
    row = next(line for line in search.table().splitlines() if "num_workers=1" in line)
    assert "failed: RuntimeError" in row and "does not survive a worker process" in row


def test_on_several_gpus_the_walk_tries_ddp_at_the_gpu_count():
    # One process per GPU (a walk on an 8-GPU machine that tried 2 would leave 6 idle); on a CPU, two processes.
    from simulated_machine import Here, SimulatedMachine
    from landscapes import LANDSCAPES

    class Asked(Here):  # the machine says which DDP config the item asked about, instead of running it
        def ddp_refusal(self, config):
            return f"asked for devices={config.devices}"

    machine = SimulatedMachine(LANDSCAPES[0])
    machine.here = Asked(machine.land)
    walk = Walk(machine, 60.0, 0.2, 0.03, machine.clock, 0.0)
    on_the_gpu = TrainConfig(batch_size=16, accelerator="cuda")
    for gpus, processes in ((4, 4), (8, 8), (2, 2)):
        with hardware.assume(hardware.Inventory(cuda_devices=gpus, cuda_bf16=True, mps=False, cpu_cores=16)):
            assert walk_items.ddp(walk, on_the_gpu) == f"asked for devices={processes}"
            assert walk_items.ddp(walk, TrainConfig(batch_size=16, accelerator="cpu")) == "asked for devices=2"
