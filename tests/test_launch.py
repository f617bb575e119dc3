"""DDP from the kernel: real worker processes with gloo on the CPU, results back in this process."""
import os
import sys
import threading

import cloudpickle
import psutil
import pytest
import torch

import nbtrain
from nbtrain import Engine, MetricsLog, TrainConfig
from nbtrain.demo import digits_recipe
from nbtrain.distributed.launch import fit_distributed, launch
from nbtrain.distributed.pool import ZYGOTE

from helpers import fit_on_two_local_nodes, kernel_helpers, same_weights, weights

# Workers cannot import this test module: ship its functions by value, as a notebook's are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _running_children():
    """This process's descendants that are not idle warm-pool workers."""
    idle = kernel_helpers()
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in idle and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_two_ranks_train_the_digits_like_one_process_with_the_same_global_batch():
    single, ddp = digits_recipe(seed=0), digits_recipe(seed=0)
    before = weights(ddp.model)
    # The sampler deals one seeded permutation round-robin to the ranks, so rank 0's and rank 1's
    # batches of 16 together are the single process's batch of 32, shuffled or not.
    Engine(single, TrainConfig(batch_size=32, max_steps=12, accelerator="cpu")).run()
    seen = []
    log = MetricsLog()
    log.subscribe(lambda event, _log: seen.append(event["type"]))
    result = nbtrain.fit(recipe=ddp, config=TrainConfig(devices=2, batch_size=16, max_steps=12, accelerator="cpu",
                                                        log_every_n_steps=2), log=log)
    assert result.status == "completed"
    assert result.summary.world_size == 2 and result.summary.global_batch == 32
    assert result.history["step"] == list(range(1, 13)) and result.history["samples"][-1] == 12 * 32
    assert same_weights(weights(ddp.model), weights(single.model), atol=1e-5)  # weights came back
    assert not same_weights(weights(ddp.model), before, atol=1e-3)
    assert seen[0] == "start" and seen.count("steps") == 6 and seen[-1] == "end" and result.log is log
    assert _running_children() == []


def _step_waiting_for_the_kernel(marker):
    calls = [0]

    def training_step(model, batch):
        import os
        import time
        import torch.nn.functional as F
        calls[0] += 1
        if calls[0] == 5:  # two log windows are written by now; the kernel must have them
            deadline = time.monotonic() + 60
            while not os.path.exists(marker):
                if time.monotonic() > deadline:
                    raise RuntimeError("no metrics reached the kernel while the ranks were training")
                time.sleep(0.02)
        x, y = batch
        return F.cross_entropy(model(x), y)
    return training_step


def test_rank_zeros_metrics_reach_the_kernel_while_the_ranks_still_train(tmp_path):
    marker = tmp_path / "kernel-saw-steps"
    recipe = digits_recipe()
    recipe.training_step = _step_waiting_for_the_kernel(str(marker))
    log = MetricsLog()
    log.subscribe(lambda event, _log: event["type"] == "steps" and marker.touch())
    result = fit_distributed(recipe, TrainConfig(devices=2, batch_size=16, max_steps=8, accelerator="cpu",
                                                 log_every_n_steps=2), log=log)
    assert result.status == "completed" and result.history["step"] == list(range(1, 9))


def _count_all_reduces(accumulate):
    """Train under DDP with a comm hook that counts every gradient all-reduce."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from nbtrain import Engine, TrainConfig
    from nbtrain.demo import digits_recipe

    counts = {}
    for k in (1, accumulate):
        engine = Engine(digits_recipe(), TrainConfig(batch_size=8, accumulate_grad_batches=k, max_steps=3,
                                                     accelerator="cpu"))
        calls = [0]

        def hook(state, bucket, calls=calls):
            calls[0] += 1
            return allreduce_hook(None, bucket)

        engine.train_model.register_comm_hook(None, hook)
        engine.run()
        counts[k] = calls[0]
    return dist.get_world_size(), type(engine.train_model).__name__, counts


def test_accumulation_under_ddp_all_reduces_only_on_the_last_micro_batch():
    world, wrapper, counts = launch(_count_all_reduces, nprocs=2, args=(4,))
    assert world == 2 and wrapper == "DistributedDataParallel"
    # 3 optimizer steps of 4 micro-batches all-reduce as often as 3 steps of 1: no_sync skipped 9 of 12.
    assert counts[1] > 0 and counts[4] == counts[1], counts


def _rank_and_sum(offset):
    import os
    import torch
    import torch.distributed as dist
    value = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(value)
    print(f"hello from rank {dist.get_rank()}")
    return {"rank": dist.get_rank(), "sum": value.item(), "parent": os.getppid()}


def test_launch_runs_a_function_on_every_rank_returns_rank_zeros_value_and_prefixes_output(capfd):
    first = launch(_rank_and_sum, nprocs=2, args=(10,))
    assert {k: first[k] for k in ("rank", "sum")} == {"rank": 0, "sum": 21.0}
    out = capfd.readouterr().out
    assert "[rank 0] hello from rank 0" in out and "[rank 1] hello from rank 1" in out
    # Ranks are forked by the zygote (a fresh interpreter this process started), never by this process.
    assert ZYGOTE.pids() == [first["parent"]] and first["parent"] != os.getpid()
    again = launch(_rank_and_sum, nprocs=2, args=(0,))
    assert again["sum"] == 1.0 and again["parent"] == first["parent"]  # the repeat launch reuses the warm zygote


def _cuda_sum():
    import torch
    return torch.ones(3, device="cuda").sum().item(), os.getppid()


def _what_a_rank_sees():
    import os
    import kernel_side_module  # importable only through the path the kernel added
    return os.getcwd(), kernel_side_module.VALUE, os.environ.get("NBTRAIN_TEST_MARK")


def test_ranks_see_the_kernels_current_folder_import_path_and_environment(tmp_path, monkeypatch):
    assert ZYGOTE.wait_ready()  # the zygote started before the kernel changed any of them
    (tmp_path / "kernel_side_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBTRAIN_TEST_MARK", "set after the zygote started")
    assert launch(_what_a_rank_sees, nprocs=2) == (str(tmp_path), 42, "set after the zygote started")


def test_two_launches_at_once_get_their_own_ports_and_answers():
    answers = {}

    def run(offset):
        answers[offset] = launch(_rank_and_sum, nprocs=2, args=(offset,), echo=False)["sum"]

    threads = [threading.Thread(target=run, args=(offset,)) for offset in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == {0: 1.0, 100: 201.0}


@pytest.mark.cuda
def test_ranks_forked_by_the_zygote_can_use_cuda():
    # A fork of a process that initialised CUDA cannot use it; the zygote never does.
    assert launch(_cuda_sum, nprocs=2, backend="gloo") == (3.0, ZYGOTE.pids()[0])  # forked, not started fresh


@pytest.mark.cuda
def test_ddp_launches_after_the_kernel_initialised_cuda():
    torch.zeros(1, device="cuda")  # what breaks fork-based notebook launchers
    recipe = digits_recipe()
    result = nbtrain.fit(recipe=recipe, config=TrainConfig(devices=2, accelerator="cpu", batch_size=16, max_steps=3))
    assert result.status == "completed"
    if torch.cuda.device_count() >= 2:
        result = nbtrain.fit(recipe=recipe, config=TrainConfig(devices=2, accelerator="cuda", batch_size=16,
                                                               max_steps=3))
        assert result.status == "completed" and result.summary.device == "cuda:0"


@pytest.mark.slow
def test_two_nodes_of_one_process_each_meet_through_c10d_rendezvous_on_localhost_as_configured():
    recipes = [digits_recipe(seed=0), digits_recipe(seed=0)]
    results = fit_on_two_local_nodes(recipes, batch_size=16, shuffle=False, max_steps=6, accelerator="cpu",
                                     rdzv_host="127.0.0.1")
    assert [r.status for r in results] == ["completed", "completed"]
    assert {r.summary.world_size for r in results} == {2}
    single = digits_recipe(seed=0)
    Engine(single, TrainConfig(batch_size=32, shuffle=False, max_steps=6, accelerator="cpu")).run()
    for recipe in recipes:  # both kernels got the same DDP-trained weights
        assert same_weights(weights(recipe.model), weights(single.model), atol=1e-5)
    assert _running_children() == []


def test_bad_launch_options_name_the_option_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"nprocs=0: allowed: a whole number >= 1"):
        launch(_rank_and_sum, nprocs=0)
    with pytest.raises(ValueError, match=r"timeout=-1: allowed: a number of seconds > 0"):
        launch(_rank_and_sum, timeout=-1)
    with pytest.raises(ValueError, match=r"backend='mpi': allowed: gloo, nccl"):
        launch(_rank_and_sum, backend="mpi")
    config = TrainConfig(num_nodes=2, accelerator="cpu")
    with pytest.raises(ValueError, match=r"rdzv_endpoint=None: allowed: 'host:port'"):
        fit_distributed(digits_recipe(), config, node_rank=0)
    with pytest.raises(ValueError, match=r"node_rank=5: allowed: a whole number from 0 to 1"):
        fit_distributed(digits_recipe(), config, node_rank=5, rdzv_endpoint="127.0.0.1:29400")
    # The keywords override the config's launch options.
    with pytest.raises(ValueError, match=r"node_rank=7: allowed: a whole number from 0 to 1"):
        fit_distributed(digits_recipe(), config.replace(node_rank=0, rdzv_endpoint="127.0.0.1:29400"), node_rank=7)
    with pytest.raises(ValueError, match=r"timeout=0: allowed: a number of seconds > 0"):
        fit_distributed(digits_recipe(), config.replace(timeout=30), timeout=0)
    assert _running_children() == []


@pytest.mark.slow
def test_launcher_worker_and_zygote_import_neither_ipython_nor_ipywidgets():
    code = ("import sys, nbtrain.distributed.launch, nbtrain.distributed.worker, nbtrain.distributed.zygote, nbtrain.distributed.pool, nbtrain.distributed.rundir, nbtrain.engine.split, "
            "nbtrain.distributed.launchers.local, nbtrain.distributed.launchers.torchrun\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel')]\n"
            "assert not bad, bad\n")
    import subprocess
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_run_directory_is_private_and_removed_afterwards(tmp_path):
    from nbtrain.distributed.rundir import RunDir
    run = RunDir.create(backend="gloo", config=TrainConfig(), recipe=digits_recipe(), parent=str(tmp_path))
    assert (run.path.stat().st_mode & 0o777) == 0o700
    assert {p.name for p in run.path.iterdir()} == {"launch.json", "config.json", "recipe.pkl"}
    assert run.config() == TrainConfig() and isinstance(run.recipe().model, torch.nn.Module)
    run.remove()
    assert not run.path.exists()


def test_the_run_directory_keeps_the_options_given_so_a_batch_jobs_settings_as_code_state_them(tmp_path):
    from nbtrain.distributed.rundir import RunDir
    config = TrainConfig(batch_size=32, max_steps=4, devices=2)  # batch_size: the default, given on purpose
    run = RunDir.create(backend="gloo", config=config, recipe=digits_recipe(), parent=str(tmp_path))
    kept = run.config()  # what a SLURM job's result carries back, and the run store records
    assert kept == config and kept.given == {"batch_size", "max_steps", "devices"}
    assert kept.as_flags() == "%%nbtrain --devices 2 --batch-size 32 --max-steps 4"
    run.remove()
