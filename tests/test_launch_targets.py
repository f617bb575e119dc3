"""A launcher is a target (issue 52): `launcher_for(config, **options)` owns its options, checks the config
against what it offers (this machine, a SLURM partition, a Ray cluster; never the kernel's machine for a remote
one), plans and starts the run. The debug target runs rank 0 in this process through the same worker entry.
The SLURM and Ray targets on their real clusters are in test_slurm.py and test_ray_launcher.py."""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.config import check_runnable
from nbtrain.options import ConfigError
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launchers import launcher_for
from nbtrain.distributed.launchers.base import LauncherOptionError, Target, WorkerError
from nbtrain.slurm import SlurmError, SlurmOptionError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks unpickle this module's functions by value

SOURCE = Path(nbtrain.__file__).resolve().parent
G = torch.Generator().manual_seed(0)
DATA = TensorDataset(torch.randn(64, 8, generator=G), torch.randint(0, 3, (64,), generator=G))


def linear() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(8, 3)


def momentum(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def two_calls(launcher: str, *, batch_size: int, accumulate: int, seed) -> dict:
    """Two calls on one live model (the second continues the first), through `launcher` with one rank."""
    model = linear()
    for steps in (3, 2):
        result = nbtrain.fit(model, DATA, loss_fn=nn.functional.cross_entropy, optimizer=momentum,
                             launcher=launcher, devices=1, accelerator="cpu", batch_size=batch_size,
                             accumulate_grad_batches=accumulate, seed=seed, max_steps=steps, log_every_n_steps=1)
        assert result.status == "completed", result.message
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- options -------------------------------------------------------------------------------------------

def test_a_bad_launcher_option_is_one_error_naming_the_option_its_value_and_what_is_allowed():
    with pytest.raises(LauncherOptionError, match=r"^launcher='local': option partition='gpu': allowed options: "
                                                  r"none$"):
        nbtrain.fit(linear(), DATA, loss_fn=nn.functional.cross_entropy, devices=2, accelerator="cpu",
                    launcher_options={"partition": "gpu"})
    with pytest.raises(SlurmOptionError, match=r"sbatch option nodes=3: not allowed here: set num_nodes / devices"):
        launcher_for(TrainConfig(launcher="slurm"), nodes=3)
    slurm = launcher_for(TrainConfig(launcher="slurm"), partition="gpu")
    with pytest.raises(SlurmOptionError, match=r"^job_name='a\\nb': allowed: a non-empty name on one line$"):
        slurm.update_options(job_name="a\nb")  # as submitit's update_parameters; the options it held stay
    assert slurm.update_options(time="01:00:00").options["partition"] == "gpu"
    assert isinstance(slurm, Target) and issubclass(SlurmOptionError, LauncherOptionError)
    with pytest.raises(LauncherOptionError, match=r"^launcher_options=\{'partition': 'gpu'\}: allowed: None when "
                                                  r"the run trains in this process"):
        nbtrain.fit(linear(), DATA, loss_fn=nn.functional.cross_entropy, max_steps=1,
                    launcher_options={"partition": "gpu"})


def test_a_remote_target_is_checked_against_what_it_offers_not_the_kernels_machine(tmp_path, monkeypatch):
    """On a CPU-only kernel with 2 cores, 8 GPUs through SLURM are not refused by this machine: where sinfo cannot
    tell what the partition offers, nothing is checked (and said); the job's script asks each node for 8 GPUs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, no sbatch on this machine
    config = TrainConfig(launcher="slurm", devices=8, accelerator="gpu")
    with pytest.raises(ConfigError, match=r"accelerator='cuda': not available on this machine"):
        check_runnable(config)  # what nbtrain.fit refused with before it asked the target
    assert "nothing was checked" in launcher_for(config, partition="gpu").check(config)
    with pytest.raises(SlurmError, match="SLURM was not found: `sbatch` is not on PATH"):  # past the check: it submits
        nbtrain.fit(linear(), DATA, loss_fn=nn.functional.cross_entropy, devices=8, accelerator="gpu",
                    launcher="slurm", launcher_options={"partition": "gpu", "time": "01:00:00"})
    script = nbtrain.slurm.submit(digits_recipe(), config, dry_run=True, partition="gpu", time="1:00:00")
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --ntasks-per-node=8" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=60" in script
    assert not any((tmp_path / ".nbtrain" / "runs").iterdir())  # the run directory the job would have seen is gone


# --- the debug target ---------------------------------------------------------------------------------

def test_the_debug_target_runs_one_rank_only():
    with pytest.raises(ConfigError, match=r"launcher='debug': local, torchrun, slurm or ray with devices x "
                                          r"num_nodes = 2 \(debug runs rank 0 alone, in this process\)"):
        TrainConfig(launcher="debug", devices=2)


@pytest.mark.slow
def test_the_debug_target_runs_rank_0_in_this_process_and_trains_bit_for_bit_as_the_local_launcher(tmp_path):
    pids = tmp_path / "pids"

    def loss_fn(output, target):  # travels by value to the rank: it says which process trained
        with open(pids, "a") as out:
            out.write(f"{os.getpid()}\n")
        return nn.functional.cross_entropy(output, target)

    model = linear()
    result = nbtrain.fit(model, DATA, loss_fn=loss_fn, optimizer=momentum, launcher="debug", accelerator="cpu",
                         batch_size=16, max_steps=2)
    assert result.status == "completed" and result.extras["weights_loaded"] and result.summary.world_size == 1
    assert set(pids.read_text().split()) == {str(os.getpid())}
    assert not torch.distributed.is_initialized()  # the rank's process group ended with it
    for batch_size, accumulate in itertools.product((16, 10), (1, 2)):  # 10: an epoch's last batch is short
        debug = two_calls("debug", batch_size=batch_size, accumulate=accumulate, seed=0)
        local = two_calls("local", batch_size=batch_size, accumulate=accumulate, seed=0)
        assert all(torch.equal(debug[k], local[k]) for k in local), (batch_size, accumulate)


def test_a_rank_error_under_the_debug_target_is_the_ranks_own_and_the_kernel_trains_after():
    def loss_fn(output, target):
        raise ValueError("rank zero cannot go on")

    with pytest.raises(WorkerError, match=r"^rank 0 raised ValueError: rank zero cannot"):
        nbtrain.fit(linear(), DATA, loss_fn=loss_fn, launcher="debug", accelerator="cpu", max_steps=1)
    assert not torch.distributed.is_initialized() and "RANK" not in os.environ
    assert nbtrain.fit(linear(), DATA, loss_fn=nn.functional.cross_entropy, max_steps=1).status == "completed"


# --- the walk of `launcher=` --------------------------------------------------------------------------

def _files_carrying_the_launcher(call, ends_at: str) -> list[str]:
    """The nbtrain files, in order of first use, whose frames hold the launcher's value once it left the config (a
    Target or a LaunchPlan in their locals or return value), from nbtrain.fit until a rank starts (`ends_at`, a
    function's name in distributed/ or launchers/: where the rank's entry is entered or its process forked)."""
    from nbtrain.distributed.plan import LaunchPlan
    seen, done = [], []

    def carries(value) -> bool:
        return isinstance(value, (Target, LaunchPlan))

    def profile(frame, event, arg):
        if done:
            return
        path = Path(frame.f_code.co_filename)
        if SOURCE not in path.parents:
            return
        name = str(path.relative_to(SOURCE))
        entered = event == "call" and frame.f_code.co_name == ends_at
        holding = any(carries(v) for v in frame.f_locals.values()) or (event == "return" and carries(arg))
        if (entered or holding or frame.f_code.co_name == "fit" and name == "api.py") and name not in seen:
            seen.append(name)
        if entered:
            done.append(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    assert done, f"no rank started through {ends_at}"
    return seen


@pytest.mark.slow
def test_launcher_reaches_a_ranks_start_through_at_most_ten_files():
    def fit(launcher, devices):
        return lambda: nbtrain.fit(linear(), DATA, loss_fn=nn.functional.cross_entropy, launcher=launcher,
                                   devices=devices, accelerator="cpu", max_steps=1)

    debug = _files_carrying_the_launcher(fit("debug", 1), "run_job")
    local = _files_carrying_the_launcher(fit("local", 2), "fork")
    assert set(debug) == {"api.py", "distributed/launchers/__init__.py", "distributed/launchers/base.py",
                          "distributed/plan.py", "distributed/launch.py", "distributed/rundir.py",
                          "distributed/launchers/debug.py",
                          "distributed/worker.py"}, debug
    assert len(local) <= 10 and local[-1] == "distributed/pool.py", local
