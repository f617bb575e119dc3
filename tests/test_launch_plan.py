"""One launch plan per run: derived once, written to the run directory, the only thing a worker reads.

The plan (nbtrain/distributed/plan.py) holds the backend, the world, threads, timeout, rendezvous,
output policy, owner and store port. Workers and torchrun agents follow it even when the old
NBTRAIN_* variables in their environment say otherwise; one function picks gloo or nccl.
"""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

import nbtrain
from nbtrain import MetricsLog, TrainConfig, slurm
from nbtrain.demo import digits_recipe
from nbtrain.distributed import plan as plans
from nbtrain.distributed.launch import fit_distributed, launch
from nbtrain.distributed.plan import LaunchPlan, backend_for, for_batch_job, for_fit
from nbtrain.distributed.pool import worker_env
from nbtrain.distributed.rundir import RunDir
from nbtrain.hardware import Inventory, assume

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SOURCE = Path(nbtrain.__file__).resolve().parent
# What a worker once read from its environment beside the run directory.
OLD_WORKER_VARIABLES = {"NBTRAIN_SHARED_RUN_DIR": "1", "NBTRAIN_PREFIX_OUTPUT": "1", "NBTRAIN_STORE_PORT": "1"}
GPU_NODES = Inventory(cuda_devices=4, cuda_bf16=True, mps=False, cpu_cores=32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- derived once, written to the run directory --------------------------------------------------

@pytest.mark.slow
def test_a_fit_run_derives_its_plan_once_and_its_ranks_find_it_in_the_run_directory(monkeypatch):
    calls, seen = [], {}
    derive = plans.for_fit

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return derive(*args, **kwargs)

    monkeypatch.setattr(plans, "for_fit", counting)
    created = RunDir.create.__func__

    def remember(cls, *args, **kwargs):
        run = created(cls, *args, **kwargs)
        seen["run"] = run
        return run

    monkeypatch.setattr(RunDir, "create", classmethod(remember))
    log = MetricsLog()
    log.subscribe(lambda event, _log: seen.setdefault("plan", seen["run"].plan()) if event["type"] == "steps" else None)
    result = fit_distributed(digits_recipe(), TrainConfig(devices=2, accelerator="cpu", max_steps=2, batch_size=16,
                                                          log_every_n_steps=1), log=log, timeout=45, echo=False)
    assert result.status == "completed" and len(calls) == 1
    plan = seen["plan"]  # as the ranks read it while they trained
    assert (plan.backend, plan.nodes, plan.procs_per_node, plan.world_size, plan.timeout_s) == ("gloo", 1, 2, 2, 45.0)
    assert plan.host == "127.0.0.1" and plan.store_port is not None and plan.owner_pid == os.getpid()
    assert not plan.prefix_output and not plan.shared_run_dir  # the kernel prefixes each rank's output file
    assert plan.threads_per_rank == max(1, (os.cpu_count() or 1) // 2)
    assert not seen["run"].path.exists()


def test_the_plan_round_trips_through_launch_json(tmp_path):
    plan = LaunchPlan(backend="nccl", nodes=2, procs_per_node=4, threads_per_rank=8, timeout_s=60.0, host="10.0.0.2",
                      rdzv_endpoint="10.0.0.1:29400", node_rank=1, rdzv_id="job", prefix_output=True)
    run = RunDir.create(plan, function=len, args=([],), parent=str(tmp_path))
    assert run.plan() == plan
    assert json.loads((run.path / "launch.json").read_text())["rdzv_endpoint"] == "10.0.0.1:29400"


def test_multi_node_options_come_from_keywords_then_the_config_then_the_documented_variables(monkeypatch):
    monkeypatch.setenv("NBTRAIN_NODE_RANK", "1")
    monkeypatch.setenv("NBTRAIN_RDZV_ENDPOINT", "localhost:29400")
    config = TrainConfig(num_nodes=2, devices=3, accelerator="cpu")
    plan = for_fit(config)
    assert (plan.node_rank, plan.rdzv_endpoint, plan.host, plan.rdzv_id) == \
        (1, "localhost:29400", "127.0.0.1", "nbtrain")  # a loopback rendezvous: ranks advertise loopback too
    assert plan.prefix_output and not plan.shared_run_dir and plan.world_size == 6  # each node has its own run dir
    plan = for_fit(config.replace(node_rank=0, rdzv_endpoint="10.0.0.1:29500"), host="10.0.0.2")
    assert (plan.node_rank, plan.rdzv_endpoint, plan.host) == (0, "10.0.0.1:29500", "10.0.0.2")
    assert for_fit(config.replace(node_rank=0), node_rank=1).node_rank == 1
    monkeypatch.setenv("NBTRAIN_NODE_RANK", "first")  # read as the config reads node_rank, named the same way
    with pytest.raises(ValueError, match=r"node_rank='first': allowed: a whole number from 0 to 1"):
        for_fit(config)


# --- a worker follows its plan, not its environment ----------------------------------------------

def _say_hello():
    print("hello from the rank", flush=True)
    return "done"


@pytest.mark.parametrize("prefix", [False, True])
def test_a_worker_prefixes_its_output_and_meets_its_peers_as_its_plan_says_whatever_its_environment_says(
        tmp_path, prefix):
    # The plan names no store port (torchrun's rendezvous); the environment names a port nobody listens on.
    plan = LaunchPlan(procs_per_node=1, threads_per_rank=1, timeout_s=20.0, prefix_output=prefix)
    run = RunDir.create(plan, function=_say_hello, parent=str(tmp_path))
    contrary = {**OLD_WORKER_VARIABLES, "NBTRAIN_PREFIX_OUTPUT": "" if prefix else "1",
                "NBTRAIN_STORE_PORT": str(_free_port())}
    env = worker_env(1, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), **contrary})
    done = subprocess.run([sys.executable, "-m", "nbtrain.distributed.worker", str(run.path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr + "".join(t for _, t in run.errors())
    assert run.load_return() == "done"
    expected = "[rank 0] hello from the rank\n" if prefix else "hello from the rank\n"
    assert expected in done.stdout and "[rank 0] [rank 0]" not in done.stdout, done.stdout


@pytest.mark.slow
def test_one_rank_writes_a_shared_run_directory_when_the_plan_says_shared_whatever_the_environment_says(tmp_path):
    """Two 'nodes' of one rank each (both local rank 0) share one run directory, as on SLURM."""
    import torch.distributed as torch_dist
    store = torch_dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    plan = LaunchPlan(nodes=2, procs_per_node=1, threads_per_rank=1, timeout_s=60.0, host="127.0.0.1",
                      store_port=store.port, shared_run_dir=True)
    config = TrainConfig(devices=1, num_nodes=2, accelerator="cpu", max_steps=2, batch_size=16)
    run = RunDir.create(plan, config=config, recipe=digits_recipe(), parent=str(tmp_path))
    contrary = {**OLD_WORKER_VARIABLES, "NBTRAIN_SHARED_RUN_DIR": "", "NBTRAIN_STORE_PORT": str(_free_port())}
    ranks = [subprocess.Popen([sys.executable, "-m", "nbtrain.distributed.worker", str(run.path)],
                              env=worker_env(1, {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                                 "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
                                                 "MASTER_ADDR": "127.0.0.1", **contrary}),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs + [t for _, t in run.errors()]
    events = [json.loads(line)["type"] for line in (run.path / "events.jsonl").read_text().splitlines()]
    assert events.count("start") == 1 and events.count("end") == 1  # rank 0 alone wrote them
    assert run.load_result()["status"] == "completed"


def test_workers_and_agents_read_no_launch_decision_from_the_environment():
    for path in (SOURCE / "distributed").glob("*.py"):
        text = path.read_text()
        for name in OLD_WORKER_VARIABLES:
            assert name not in text, f"{path.name} still speaks of {name}"
    assert "NBTRAIN_OWNER_PID" not in (SOURCE / "distributed" / "worker.py").read_text()  # only the zygote's own
    # The documented user options are read where the plan is made, and nowhere else.
    readers = {p.relative_to(SOURCE).as_posix() for p in SOURCE.rglob("*.py")
               if re.search(r"environ(\.get\(|\[)\s*['\"]NBTRAIN_(NODE_RANK|RDZV_ENDPOINT|RDZV_ID)", p.read_text())}
    assert readers == {"distributed/plan.py"}


# --- one function decides the backend ------------------------------------------------------------

def test_one_function_picks_nccl_for_cuda_ranks_and_gloo_for_the_rest():
    assert [backend_for(d) for d in ("cuda", "cpu", "mps")] == ["nccl", "gloo", "gloo"]
    with assume(GPU_NODES):  # a run started here resolves auto against this machine
        assert for_fit(TrainConfig(devices=2)).backend == "nccl"
        assert for_fit(TrainConfig(devices=2, accelerator="cpu")).backend == "gloo"
    # Nothing else in the launcher or SLURM code decides it.
    deciders = [p.name for folder in ("distributed", "launchers", "slurm") for p in (SOURCE / folder).glob("*.py")
                if re.search(r"[\"']nccl[\"']\s+if\b", p.read_text())]
    assert deciders == ["plan.py"]


def test_a_batch_jobs_plan_and_script_follow_the_accelerator_asked_for_with_no_plan_in_the_environment(tmp_path):
    with assume(GPU_NODES):
        gpu = TrainConfig(num_nodes=2, devices=4, accelerator="cuda", timeout=120)
    with assume(Inventory(cuda_devices=0, cuda_bf16=False, mps=False, cpu_cores=2)):  # this login node: no GPU
        plan = for_batch_job(gpu)
        script = slurm.submit(digits_recipe(), gpu, dry_run=True)
        batch = slurm.export(digits_recipe(), gpu, tmp_path / "job")
    assert plan == LaunchPlan(launcher="slurm", backend="nccl", nodes=2, procs_per_node=4, timeout_s=120.0, prefix_output=True,
                              shared_run_dir=True)  # no owner: a batch job outlives the kernel
    assert RunDir(batch.parent).plan() == plan  # export writes the same plan the submission would
    for text in (script, batch.read_text()):
        assert "#SBATCH --gpus-per-node=4" in text and "NBTRAIN_" not in text
    cpu = for_batch_job(TrainConfig(num_nodes=2, accelerator="auto"))
    assert cpu.backend == "gloo" and "--gpus-per-node" not in slurm.submit(digits_recipe(), TrainConfig(num_nodes=2),
                                                                             dry_run=True)


def test_launch_checks_its_keywords_with_the_configs_readers_before_any_process_starts():
    with pytest.raises(ValueError, match=r"timeout=1000000000000.0: allowed: a number of seconds > 0, or None"):
        launch(_say_hello, nprocs=1, timeout=1e12)  # the config's own bound
    with pytest.raises(ValueError, match=r"host='a;b': allowed: an address of this machine"):
        launch(_say_hello, nprocs=1, host="a;b")


def test_the_owner_is_known_by_its_start_since_boot_so_a_clock_step_cannot_end_a_run():
    import psutil
    from nbtrain.distributed.plan import started_since_boot
    from nbtrain.distributed.worker import owner_alive
    me = psutil.Process()
    started = started_since_boot(me)
    assert 0 <= started and started == pytest.approx(me.create_time() - psutil.boot_time())
    assert owner_alive(me.pid, started) and owner_alive(me.pid)
    assert not owner_alive(me.pid, started - 5)  # the same pid started at another time: a reused pid
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not owner_alive(gone.pid, started)


# --- the launcher: named once, in the plan ---------------------------------------------------------

def test_the_plan_names_its_launcher_local_for_one_node_torchrun_for_several_or_the_one_asked_for():
    import argparse
    from nbtrain.options import ConfigError
    from nbtrain.flags import add_config_flags, config_from_flags
    assert for_fit(TrainConfig(devices=2, accelerator="cpu")).launcher == "local"
    several = TrainConfig(num_nodes=2, accelerator="cpu", rdzv_endpoint="127.0.0.1:29400", node_rank=1)
    assert for_fit(several).launcher == "torchrun"
    ray = for_fit(several.replace(launcher="ray"))  # Ray places the ranks and owns their lifetime
    assert (ray.launcher, ray.owner_pid, ray.shared_run_dir, ray.rdzv_endpoint) == ("ray", None, True, None)
    assert for_fit(TrainConfig(devices=2, launcher="slurm")) == for_batch_job(TrainConfig(devices=2))
    parser = argparse.ArgumentParser()
    add_config_flags(parser)  # the %%nbtrain flags are made from the config's options
    assert config_from_flags(parser.parse_args(["--launcher", "torchrun"])).launcher == "torchrun"
    with pytest.raises(ConfigError, match=r"launcher='k8s': one of local, torchrun, slurm, ray, debug, or None \(local for "
                                          r"one node, torchrun for several\)"):
        config_from_flags(parser.parse_args(["--launcher", "k8s"]))
    with pytest.raises(ConfigError, match=r"launcher='local': torchrun, slurm or ray with num_nodes=2"):
        several.replace(launcher="local")


@pytest.mark.slow
def test_torchrun_on_one_machine_trains_as_the_local_launcher_does():
    import torch
    config = TrainConfig(devices=2, accelerator="cpu", max_steps=3, batch_size=16)
    weights = {}
    for launcher in ("local", "torchrun"):
        recipe = digits_recipe()
        assert fit_distributed(recipe, config.replace(launcher=launcher), echo=False).status == "completed"
        weights[launcher] = recipe.model.state_dict()
    assert all(torch.equal(weights["local"][k], weights["torchrun"][k]) for k in weights["local"])
