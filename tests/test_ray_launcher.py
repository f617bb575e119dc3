"""launcher="ray": the same call's ranks as actors on a Ray cluster (here a one-machine one), trained as the
local launcher trains them, progress streamed back, Stop at a step boundary, a rank's error shown as a local
one, no actor process left. One Ray session serves every case (its start-up takes a minute here)."""
import os
import threading

import psutil
import pytest
import torch
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.config import check_runnable
from nbtrain.options import ConfigError
from nbtrain.distributed.launchers.base import WorkerError
from nbtrain.distributed.launchers import launcher_for

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install \"nbtrain[ray]\" (scripts/test.sh does)")
pytestmark = pytest.mark.slow

X, Y = torch.randn(96, 8, generator=torch.Generator().manual_seed(0)), torch.randn(96, 1)
CPUS = (os.cpu_count() or 1) + 1  # the cluster declares one CPU more than the kernel's machine has, and 2 GPUs


@pytest.fixture(scope="module")
def cluster():
    # Started by the user: every run leaves it running. On a busy machine Ray's node agent can take longer to
    # start than the 15 s its raylet waits for it, and the start fails (ray-project/ray#65983): a few more tries.
    for attempt in range(4):
        try:
            ray.init(num_cpus=CPUS, num_gpus=2, include_dashboard=False)  # more than this machine has
            break
        except Exception:
            ray.shutdown()
            if attempt == 3:
                raise
    yield
    ray.shutdown()


def _rank_actors() -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if "ray::RankActor" in line:
            found.append(line)
    return found


def _fit(launcher, loss_fn=torch.nn.functional.mse_loss, **options):
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 1)
    result = nbtrain.fit(model, TensorDataset(X, Y), loss_fn=loss_fn, optimizer=torch.optim.SGD(model.parameters(),
                         lr=0.1), devices=2, accelerator="cpu", batch_size=16, log_every_n_steps=1, launcher=launcher,
                         **options)
    return model, result


def test_ray_ranks_train_as_local_ddp_stream_progress_stop_at_a_step_and_leave_no_actor(cluster):
    on_ray, result = _fit("ray", max_steps=4)
    local, _ = _fit("local", max_steps=4)
    assert result.status == "completed" and list(result.log.columns["step"]) == [1, 2, 3, 4]  # each step's event
    assert all(torch.equal(a, b) for a, b in zip(on_ray.state_dict().values(), local.state_dict().values()))
    assert _rank_actors() == [] and ray.is_initialized()  # the user's cluster stays

    stop = threading.Event()
    log = nbtrain.MetricsLog()
    log.subscribe(lambda event, _log: stop.set() if event["type"] == "steps" else None)
    stopped, result = _fit("ray", max_steps=10_000, stop=stop, log=log)
    assert result.status == "stopped" and 1 <= result.summary.run_steps < 10_000
    assert result.extras["weights_loaded"] and not torch.equal(stopped.weight, local.weight)


def test_a_ray_ranks_error_comes_back_with_its_traceback_and_no_actor_remains(cluster):
    def loss_fn(output, target):
        if torch.distributed.get_rank() == 1:
            raise ValueError("rank one cannot go on")
        return torch.nn.functional.mse_loss(output, target)

    with pytest.raises(WorkerError, match=r"^rank 1 raised ValueError: rank one cannot go on") as caught:
        _fit("ray", loss_fn=loss_fn, max_steps=4)
    assert 'raise ValueError("rank one cannot go on")' in caught.value.traceback
    assert caught.value.pids and not any(psutil.pid_exists(pid) for pid in caught.value.pids)
    assert _rank_actors() == []


def test_the_ray_target_is_checked_against_the_clusters_resources_not_the_kernels_machine(cluster):
    def fit(devices, accelerator="cpu"):
        torch.manual_seed(1)
        model = torch.nn.Linear(8, 1)
        return nbtrain.fit(model, TensorDataset(X, Y), loss_fn=torch.nn.functional.mse_loss, devices=devices,
                           accelerator=accelerator, batch_size=16, max_steps=2, launcher="ray")

    with pytest.raises(ConfigError, match=r"cores on this machine"):  # what the kernel alone refuses
        check_runnable(TrainConfig(devices=CPUS, accelerator="cpu"))
    result = fit(CPUS)  # one rank per CPU the cluster declares
    assert result.status == "completed" and result.summary.world_size == CPUS
    gpus = TrainConfig(launcher="ray", devices=2, accelerator="gpu")
    with pytest.raises(ConfigError, match=r"accelerator='cuda': not available on this machine"):
        check_runnable(gpus)
    assert launcher_for(gpus).check(gpus) == ""  # the cluster declares 2 GPUs
    with pytest.raises(ConfigError, match=rf"devices={CPUS + 1}: at most {CPUS} CPU processes \(cores on the Ray "
                                          rf"cluster \("):
        fit(CPUS + 1)
    with pytest.raises(ConfigError, match=r"devices=3: at most 2 \(CUDA devices on the Ray cluster \("):
        fit(3, accelerator="gpu")
    assert _rank_actors() == [] and ray.is_initialized()  # the user's cluster stays
