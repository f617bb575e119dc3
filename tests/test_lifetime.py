"""A model the user drops is freed, with its engine, optimizer, loader workers and device memory
(issue 13, item 3): a notebook re-runs `model = Net()` many times and must stay flat."""
import gc
import time
import weakref

import psutil
import pytest
import torch
from torch import nn

import nbtrain

from helpers import regression_data


def net():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _gone(ref) -> bool:
    gc.collect()
    return ref() is None


def test_a_dropped_model_is_freed_with_its_engine_and_optimizer():
    model = net()
    nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), max_steps=3, batch_size=32)
    engine = nbtrain.api.live_engine(model)
    refs = [weakref.ref(model), weakref.ref(engine), weakref.ref(engine.optimizer)]
    del model, engine
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]


def test_rerunning_a_model_cell_keeps_only_the_latest_model(ip):
    ip.run_cell("import torch\nfrom torch import nn\nfrom helpers import regression_data\n"
                "train_data = regression_data()\nloss_fn = nn.MSELoss()")
    refs = []
    for _ in range(3):
        ip.run_cell("%%nbtrain --max-steps 2 --batch-size 32 --no-plot --no-progress\n"
                    "model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))")
        refs.append(weakref.ref(ip.user_ns["model"]))
    gc.collect()
    assert [r() is None for r in refs] == [True, True, False]


def test_a_copy_or_pickle_of_a_trained_model_carries_no_engine():
    import copy
    import pickle
    model = net()
    nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), max_steps=1, batch_size=32)
    assert nbtrain.api.live_engine(copy.deepcopy(model)) is None
    assert nbtrain.api.live_engine(pickle.loads(pickle.dumps(model))) is None
    assert nbtrain.api.live_engine(model) is not None


@pytest.mark.cuda
def test_cuda_memory_returns_when_the_model_is_dropped():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1))
    data = torch.utils.data.TensorDataset(torch.randn(256, 1024), torch.randn(256, 1))
    nbtrain.fit(model, data, loss_fn=nn.MSELoss(), max_steps=3, batch_size=64, accelerator="cuda")
    assert torch.cuda.memory_allocated() > before + 16 * 2**20  # weights and Adam moments are there
    del model
    gc.collect()
    deadline = time.monotonic() + 30
    while torch.cuda.memory_allocated() > before + 2**20 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert torch.cuda.memory_allocated() <= before + 2**20


def test_a_run_with_persistent_workers_ends_them_when_it_ends():
    """Left to the garbage collector, a dropped engine's persistent workers took ~5 s each to shut down,
    in whichever later cell ran that collection; they end with their run instead."""
    def children():  # (other tests of the session may have left a DDP zygote or the plot's drawing process)
        return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}

    before = children()
    model = net()
    result = nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), max_epochs=2, batch_size=32,
                         num_workers=2, persistent_workers=True)
    assert result.status == "completed" and result.summary.epochs_trained == 2
    assert children() - before == set()
    # The next run on the same live engine starts workers of its own and trains on.
    assert nbtrain.fit(model, regression_data(), loss_fn=nn.MSELoss(), max_steps=3, batch_size=32, num_workers=2,
                       persistent_workers=True).status == "completed"
    ref = weakref.ref(model)
    del model
    assert _gone(ref)
