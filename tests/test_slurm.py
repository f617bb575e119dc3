"""SLURM jobs from the notebook, on a real private SLURM cluster (2 nodes on 127.0.0.1, gloo)."""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest
import torch
from torch import nn

from nbtrain import TrainConfig
from nbtrain import slurm
from nbtrain.distributed.plan import for_batch_job
from nbtrain.api import fit
from nbtrain.demo import DigitsDataset, digits_recipe
from nbtrain.recipe import Recipe
from nbtrain.slurm import SlurmError, SlurmJobError, SlurmOptionError

# Functions defined here travel to the workers by value, as a notebook's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTILE_NAME = "nb \"job\" 'x' $(touch pwned-name) `touch pwned-tick`; y"
HOSTILE_DIR = "runs with 'quotes' \"dq\" $(touch pwned-dir) and spaces"


def two_nodes(**changes) -> TrainConfig:
    return TrainConfig(num_nodes=2, devices=1, accelerator="cpu", batch_size=64, seed=0, **changes)


def wait_for(handle, predicate, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = handle.poll()
        if predicate(state):
            return state
        assert not state.terminal, f"job ended early: {state}\n{handle.output()}"
        time.sleep(0.25)
    raise AssertionError(f"timed out; job is {handle.poll()}\n{handle.output()}")


def job_processes(run_dir, workers_only=False) -> list:
    """Live processes of the job (srun, torchrun agents, ranks); with workers_only, the ranks alone."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if str(run_dir) not in cmdline or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if workers_only and ("torch.distributed.run" in cmdline or not any("python" in c for c in cmdline[:1])):
            continue
        found.append(proc)
    return found


def step_daemons(job_id) -> list:
    """The slurmstepd processes still serving a job (their title is `slurmstepd: [JOB.STEP]`)."""
    title = f"slurmstepd: [{job_id}."
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if " ".join(p.info["cmdline"] or []).startswith(title) and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # .nbtrain/ (runs, job records) is project-local
    return tmp_path


# --- without a cluster ------------------------------------------------------------------------

def test_dry_run_script_quotes_every_user_value(project):
    root = project / HOSTILE_DIR
    script = slurm.submit(digits_recipe(), two_nodes(), dry_run=True, job_name=HOSTILE_NAME, run_root=root,
                          partition="debug; touch pwned-partition", time="00:10:00", exclusive=True)
    headers = [shlex.split(line[len("#SBATCH "):])[0] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert f"--job-name={HOSTILE_NAME}" in headers
    assert "--partition=debug; touch pwned-partition" in headers
    assert {"--nodes=2", "--ntasks-per-node=1", "--exclusive", "--time=10", "--signal=USR2@90"} <= set(headers)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # submitit's task command: bash reads the run directory back as the exact path, running nothing inside it.
    command = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in command and "-m submitit.core._submit" in command
    echoed = subprocess.run(["bash", "-c", "printf '%s\\n' " + command[len("srun "):]], capture_output=True, text=True,
                            cwd=project)
    assert echoed.stdout.splitlines()[-1].startswith(str(root) + "/nbtrain-run-")
    assert not list(project.glob("pwned*")) and not (project / ".nbtrain").exists()  # a dry run writes nothing


def test_bad_sbatch_options_name_the_option(project):
    with pytest.raises(SlurmOptionError, match=r"nodes=3: not allowed here: set num_nodes"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, nodes=3)
    with pytest.raises(SlurmOptionError, match=r"partition='a\\nb': allowed: a non-empty value on one line"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, partition="a\nb")
    with pytest.raises(SlurmOptionError, match=r"signal_delay_s='soon': allowed: whole seconds >= 0"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, signal_delay_s="soon")
    with pytest.raises(SlurmOptionError, match=r"time='1h': allowed: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, time="1h")


def test_without_sbatch_on_path_the_error_says_slurm_was_not_found_and_how_to_dry_run(project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))  # a real PATH with no SLURM on it
    with pytest.raises(SlurmError) as caught:
        slurm.submit(digits_recipe(), two_nodes())
    assert "SLURM was not found: `sbatch` is not on PATH" in str(caught.value)
    assert "dry_run=True" in str(caught.value)
    assert not (project / ".nbtrain" / "runs").exists() or not any((project / ".nbtrain" / "runs").iterdir())


def test_time_limits_are_read_as_slurm_writes_them():
    from nbtrain.distributed.slurm_options import minutes
    assert [minutes(t) for t in ("5", "5:30", "01:00:00", "1-02", "1-00:00:01", "infinite")] == [5, 6, 60, 1560, 1441, 0]


def test_attach_to_an_unknown_job_names_the_known_ones(project):
    with pytest.raises(SlurmError, match="job 999 was not submitted from this project"):
        slurm.attach(999)


@pytest.mark.slow
def test_export_writes_a_script_that_trains_standalone_and_its_sbatch_file(project):
    recipe = digits_recipe()
    batch = slurm.export(recipe, two_nodes(max_steps=3), project / "exported job", job_name="digits")
    folder = batch.parent
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "launch.json", "recipe.pkl", "train.py",
                                                         "train.sbatch"]
    text = batch.read_text()
    assert shlex.quote(str(folder / "train.py")) in text and subprocess.run(["bash", "-n", str(batch)]).returncode == 0
    run = subprocess.run([sys.executable, str(folder / "train.py")], capture_output=True, text=True, timeout=120,
                         cwd="/", env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    assert "status" in run.stdout and "completed" in run.stdout
    weights = torch.load(folder / "model.pt", weights_only=True)
    assert set(weights) == set(recipe.model.state_dict())


# --- on the cluster ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(slurm_cluster, tmp_path_factory):  # noqa: F811
    """One real 2-node x 1-process job on the digits, with a hostile name and run directory."""
    project = tmp_path_factory.mktemp("project")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        recipe = digits_recipe(seed=0)
        before = {k: v.clone() for k, v in recipe.model.state_dict().items()}
        handle = slurm.submit(recipe, two_nodes(max_epochs=3), job_name=HOSTILE_NAME, run_root=project / HOSTILE_DIR,
                              cpus_per_task=1)
        states = []
        result = handle.wait(echo=False, timeout=120, on_state=lambda state: states.append(state.state))
        yield {"project": project, "recipe": recipe, "before": before, "handle": handle, "result": result,
               "states": states}


def test_two_node_job_trains_the_digits_and_the_weights_come_back(trained):
    handle, result, model = trained["handle"], trained["result"], trained["recipe"].model
    assert "RUNNING" in trained["states"] and trained["states"][-1] == "COMPLETED"
    assert set(trained["states"]) <= {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED"}
    assert result.status == "completed" and result.summary.world_size == 2
    assert result.extras["job_id"] == handle.job_id
    saved = torch.load(handle.run.path / "model.pt", weights_only=True)
    now = model.state_dict()
    assert all(torch.equal(now[k], saved[k]) for k in saved)
    assert not all(torch.equal(now[k], trained["before"][k]) for k in now)
    held_out = DigitsDataset(train=False)
    with torch.no_grad():
        accuracy = (model(held_out.x).argmax(1) == held_out.y).float().mean().item()
    assert accuracy > 0.85
    assert "on node[1-2]" in handle.output()


def test_the_jobs_events_fill_the_same_log_as_a_local_run(trained):
    remote = trained["handle"].log
    local = fit(recipe=digits_recipe(seed=0), config=TrainConfig(max_epochs=1, batch_size=64, seed=0)).log
    types = [e["type"] for e in remote.events]
    assert types[0] == "start" and types[-1] == "end" and types.count("epoch") == 3 and "steps" in types
    assert {e["type"] for e in remote.events} == {e["type"] for e in local.events}
    assert set(remote.columns) == set(local.columns)
    assert remote.columns["step"] == list(range(1, len(remote) + 1)) and len(remote) == 3 * 12


def test_hostile_job_name_and_run_directory_run_as_plain_strings(trained):
    handle, project = trained["handle"], trained["project"]
    assert handle.run.path.parent == project / HOSTILE_DIR
    shown = subprocess.run(["scontrol", "show", "job", "-o", handle.job_id], capture_output=True, text=True).stdout
    assert f"JobName={HOSTILE_NAME} " in shown
    assert not list(project.rglob("pwned*")) and not list(Path.cwd().glob("pwned*"))


def test_attach_from_a_fresh_interpreter_gets_the_trained_weights(trained, tmp_path):
    code = ("import sys, torch\nfrom nbtrain import slurm\n"
            f"handle = slurm.attach({trained['handle'].job_id!r})\n"
            "result = handle.wait(echo=False, timeout=60)\n"
            "torch.save(handle.model.state_dict(), sys.argv[1])\n"
            "print(result.status, len(handle.log))\n")
    out = tmp_path / "attached.pt"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=trained["project"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "36"]
    attached, kernel = torch.load(out, weights_only=True), trained["recipe"].model.state_dict()
    assert all(torch.equal(attached[k], kernel[k]) for k in kernel)


def test_sbatch_rejecting_the_job_shows_its_stderr(slurm_cluster, project):  # noqa: F811
    with pytest.raises(SlurmError) as caught:
        slurm.submit(digits_recipe(), two_nodes(), partition="no-such-partition")
    assert "sbatch rejected the job" in str(caught.value)
    assert "invalid partition specified: no-such-partition" in str(caught.value).lower()
    with pytest.raises(SlurmError, match="sbatch rejected the job") as caught:
        slurm.submit(digits_recipe(), two_nodes().replace(num_nodes=3))  # the cluster has two
    assert "node count specification invalid" in str(caught.value).lower()
    assert not any((project / ".nbtrain" / "runs").iterdir())


def test_a_job_that_can_never_start_is_reported_instead_of_waited_on(slurm_cluster, project):  # noqa: F811
    blocker = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 60"], capture_output=True, text=True,
                             check=True).stdout.strip()
    handle = slurm.submit(digits_recipe(), two_nodes(), dependency=f"afterok:{blocker}")
    subprocess.run(["scancel", blocker], check=True)  # afterok can no longer be met: the cluster ends the job
    # the state with its reason where the controller still gave one when the job ended ("CANCELLED (Dependency)")
    with pytest.raises(SlurmJobError, match=r"SLURM job \d+ CANCELLED( \(\w+\))? before any rank started"):
        handle.wait(echo=False, timeout=30)


@pytest.mark.slow
def test_cluster_script_starts_a_second_cluster_and_stops_every_daemon_by_pid(slurm_cluster, tmp_path):  # noqa: F811
    from slurm_fixture import cluster_module
    folder = Path(tempfile.mkdtemp(prefix="nbtrain-slurm-cli-"))
    script = Path(__file__).resolve().parents[1] / "scripts" / "slurm_cluster.py"
    try:
        started = subprocess.run([sys.executable, str(script), "start", "--dir", str(folder)], capture_output=True,
                                 text=True, timeout=60)
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == f"export SLURM_CONF={folder / 'slurm.conf'}"
        cluster = cluster_module.Cluster(folder)
        assert sorted(cluster.running()) == ["mariadbd", "munged", "slurmctld", "slurmd-node1", "slurmd-node2",
                                             "slurmdbd"]
        accounted = subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], capture_output=True, text=True, env=cluster.env)
        assert accounted.returncode == 0, accounted.stderr  # accounting answers
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                               env=cluster.env).stdout.split()
        assert nodes == ["node1", "idle", "node2", "idle"]
        stopped = subprocess.run([sys.executable, str(script), "stop", "--dir", str(folder)], capture_output=True,
                                 text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert cluster.running() == []
    finally:
        cluster_module.Cluster(folder).stop()
        shutil.rmtree(folder, ignore_errors=True)


def loss_that_breaks_on_rank_one(output, target):
    print("computing a loss", flush=True)
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank one cannot compute this loss")
    return nn.functional.cross_entropy(output, target)


@pytest.mark.slow
def test_a_rank_failing_on_a_node_reports_its_traceback(slurm_cluster, project):  # noqa: F811
    recipe = digits_recipe()
    recipe.loss_fn = loss_that_breaks_on_rank_one
    handle = slurm.submit(recipe, two_nodes(max_epochs=1), cpus_per_task=1)
    with pytest.raises(SlurmJobError) as caught:
        handle.wait(echo=False, timeout=120)
    error = caught.value
    assert error.state.state == "FAILED" and error.rank == 1
    assert "rank 1 raised RuntimeError: rank one cannot compute this loss" in str(error)
    assert "loss_that_breaks_on_rank_one" in error.traceback
    assert "[rank 0] computing a loss" in handle.output() and "[rank 1] computing a loss" in handle.output()


@pytest.mark.slow
def test_interrupting_wait_cancels_the_job_and_its_processes_end(slurm_cluster, project):  # noqa: F811
    handle = slurm.submit(digits_recipe(), two_nodes(max_epochs=1000), cpus_per_task=1)
    wait_for(handle, lambda s: s.state == "RUNNING")
    deadline = time.monotonic() + 60
    while len(job_processes(handle.run.path, workers_only=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(job_processes(handle.run.path, workers_only=True)) == 2, "the job's two ranks never started"
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt, match=f"SLURM job {handle.job_id} was cancelled"):
        handle.wait(echo=False, timeout=60)
    with pytest.raises(SlurmJobError, match="CANCELLED"):
        handle.wait(echo=False, timeout=30)
    deadline = time.monotonic() + 20
    while job_processes(handle.run.path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job_processes(handle.run.path)


def rank_process(run_dir, rank: int):
    """The python process of one rank (submitit's task with SLURM_PROCID=rank)."""
    for proc in job_processes(run_dir, workers_only=True):
        try:
            if proc.environ().get("SLURM_PROCID") == str(rank):
                return proc
        except psutil.Error:
            continue
    return None


def wait_for_ranks(handle, count=2, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (len(handle.log.of_type("steps")) and
                                                   len(job_processes(handle.run.path, workers_only=True)) == count):
        handle.poll()
        time.sleep(0.2)
    assert len(job_processes(handle.run.path, workers_only=True)) == count, f"the ranks never ran\n{handle.output()}"


@pytest.mark.slow
def test_a_rank_killed_hard_fails_the_job_named_within_seconds_and_nothing_is_left(slurm_cluster, project):  # noqa: F811
    handle = slurm.submit(digits_recipe(), two_nodes(max_epochs=1000, log_every_n_steps=1), cpus_per_task=1)
    wait_for_ranks(handle)
    rank_process(handle.run.path, 1).kill()  # SIGKILL, as the OOM killer does: no traceback, no cleanup
    killed = time.monotonic()
    with pytest.raises(SlurmJobError) as caught:
        handle.wait(echo=False, timeout=60)
    reported = time.monotonic() - killed
    error = caught.value
    assert error.state.state == "FAILED" and error.rank == 1, str(error)
    assert "rank 1 on node2 ended without a traceback" in str(error)
    print(f"the killed rank's job was reported failed {reported:.1f} s after the kill")  # shown with -s
    assert reported < 10, f"the failure took {reported:.1f} s to be reported"
    deadline = time.monotonic() + 15
    while (job_processes(handle.run.path) or step_daemons(handle.job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job_processes(handle.run.path) and not step_daemons(handle.job_id)


def weights_of(handle):
    return torch.load(handle.run.path / "model.pt", weights_only=True)


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_from_its_step_to_the_same_weights(slurm_cluster, project):  # noqa: F811
    config = two_nodes(max_epochs=8, log_every_n_steps=4)

    def slowed(recipe):
        """The digits recipe whose steps last at least 30 ms (96 steps, about 3 s): long enough to be preempted
        in the middle on a quiet machine too, where the plain digits steps end before the signal arrives. A
        nested function travels by value (cloudpickle), so the job's ranks need no test module."""
        cross_entropy = recipe.loss_fn

        def slow_loss(output, target):
            time.sleep(0.03)
            return cross_entropy(output, target)
        recipe.loss_fn = slow_loss
        return recipe

    # The run left alone and the run preempted side by side: each takes one of each node's two CPUs (one after
    # the other, the test took 15 s longer).
    whole = slurm.submit(slowed(digits_recipe(seed=0)), config, cpus_per_task=1)
    handle = slurm.submit(slowed(digits_recipe(seed=0)), config, cpus_per_task=1)
    wait_for_ranks(handle)
    # What submitit has SLURM send before the time limit (--signal=USR2@90), sent now to every rank: a preemption.
    subprocess.run(["scancel", "--signal=USR2", handle.job_id], check=True)
    signalled_at = handle.log.columns["step"][-1]
    assert signalled_at < 8 * 12 - 8, f"the job was nearly done (step {signalled_at}) when it was preempted"
    # The cluster's cred_expire holds a requeued job back 10 s (SLURM's default: 120 s).
    result = handle.wait(echo=False, timeout=180)
    whole.wait(echo=False, timeout=120)
    assert "restart 1" in handle.output()
    starts = [e["info"]["step_start"] for e in handle.log.of_type("start")]
    assert starts[0] == 0 and starts[1] > 0 and starts[1] % 4 == 0  # stopped at a log window, resumed there
    assert [e["status"] for e in handle.log.of_type("end")] == ["requeue", "completed"]
    assert handle.log.columns["step"] == list(range(1, 8 * 12 + 1))  # every step once, none repeated
    assert result.status == "completed"
    ours, theirs = weights_of(handle), weights_of(whole)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)  # as if it had never been interrupted


def test_a_gpu_config_asks_each_node_for_its_gpus_and_runs_one_rank_per_gpu(project):
    from nbtrain.hardware import Inventory, assume
    with assume(Inventory(cuda_devices=4, cuda_bf16=True, mps=False, cpu_cores=32)):  # the GPU nodes, not here
        config = TrainConfig(num_nodes=3, devices=4, accelerator="cuda", precision="bf16-mixed")
    script = slurm.submit(digits_recipe(), config, dry_run=True, partition="gpu", time="01:00:00")
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --nodes=3" in script
    assert "#SBATCH --ntasks-per-node=4" in script  # one task per GPU: submitit's srun starts each rank
    assert for_batch_job(config).backend == "nccl"  # the accelerator asked for decides, not this login node


@pytest.mark.slow
def test_the_exported_sbatch_file_trains_on_the_cluster(slurm_cluster, project):  # noqa: F811
    batch = slurm.export(digits_recipe(), two_nodes(max_steps=5), project / "job", cpus_per_task=1)
    job_id = subprocess.run(["sbatch", "--parsable", str(batch)], capture_output=True, text=True,
                            check=True).stdout.strip()
    handle = slurm.JobHandle(job_id, batch.parent, job_name="nbtrain")
    result = handle.wait(echo=False, timeout=120)
    assert result.status == "completed" and result.summary.world_size == 2
    assert handle.log.columns["step"] == [1, 2, 3, 4, 5]
    assert set(torch.load(batch.parent / "model.pt", weights_only=True)) == set(handle.model.state_dict())


@pytest.mark.slow
def test_fit_with_the_slurm_launcher_trains_as_a_batch_job_and_leaves_nothing(slurm_cluster, project):  # noqa: F811
    recipe = digits_recipe(seed=0)
    before = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    result = fit(recipe=recipe, config=two_nodes(max_steps=6, launcher="slurm"))
    assert result.status == "completed" and result.summary.world_size == 2
    assert result.log.columns["step"] == [1, 2, 3, 4, 5, 6]
    assert result.extras["weights_loaded"]
    assert not all(torch.equal(v, before[k]) for k, v in recipe.model.state_dict().items())
    assert not any((project / ".nbtrain" / "runs").iterdir())  # the copy the nodes saw is gone


@pytest.mark.slow
def test_launcher_slurm_with_partition_and_time_continues_the_live_engine_as_local_ddp_does(slurm_cluster, project):  # noqa: F811
    """A call in the kernel, then fit(launcher="slurm") with partition and time options, then nbtrain.slurm.submit
    (the same target and options): each continues the live engine (momentum, position, random numbers), to the
    weights of the kernel call followed by two local DDP calls."""
    with pytest.raises(SlurmError, match="invalid partition specified: nope"):  # the options reach sbatch
        fit(recipe=digits_recipe(seed=0), config=two_nodes(max_steps=1, launcher="slurm"),
            launcher_options={"partition": "nope"})
    options = {"partition": "debug", "time": "00:10:00", "cpus_per_task": 1}
    ddp = {"batch_size": 16, "seed": 0, "max_steps": 3, "accelerator": "cpu"}

    def three_calls(second, third) -> dict:
        recipe = digits_recipe(seed=0)
        fit(recipe=recipe, config=TrainConfig(batch_size=32, seed=0, max_steps=3))  # the live engine: 32 a step
        for call in (second, third):
            result = call(recipe)
            assert result.status == "completed" and result.extras["weights_loaded"], result.message
        return {k: v.clone() for k, v in recipe.model.state_dict().items()}

    local = three_calls(lambda r: fit(recipe=r, config=TrainConfig(devices=2, **ddp)),
                        lambda r: fit(recipe=r, config=TrainConfig(devices=2, **ddp)))
    on_slurm = three_calls(
        lambda r: fit(recipe=r, config=TrainConfig(num_nodes=2, launcher="slurm", **ddp), launcher_options=options),
        lambda r: slurm.submit(r, TrainConfig(num_nodes=2, **ddp), **options).wait(echo=False, timeout=120))
    assert all(torch.equal(on_slurm[k], local[k]) for k in local)


@pytest.mark.slow
def test_a_first_call_through_nbtrain_slurm_submit_trains_and_continues_as_a_first_local_ddp_call(slurm_cluster, project):  # noqa: F811
    """nbtrain.slurm.submit on a model the kernel holds no engine of: no kernel engine is built first (one set the
    user's optimizer instance to its first warmed-up rate, which the ranks then took for the user's own), and the
    kernel's engine made from the job's continues it: the rates and weights of a first local DDP call, then a
    call in the kernel."""
    ddp = {"batch_size": 16, "seed": 0, "max_steps": 3, "accelerator": "cpu", "warmup_steps": 3,
           "scale_lr": "linear", "base_batch_size": 16}

    def first_then_kernel(first) -> tuple[list, dict]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # an instance, as users write it
        recipe = Recipe(model=model, train_data=DigitsDataset(train=True), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=optimizer)
        result = first(recipe)
        assert result.status == "completed" and result.extras["weights_loaded"], result.message
        after = fit(recipe=recipe, config=TrainConfig(batch_size=32, seed=0, max_steps=2, accelerator="cpu"))
        rates = list(result.log.columns["lr"]) + list(after.log.columns["lr"])
        return rates, {k: v.clone() for k, v in recipe.model.state_dict().items()}

    local = first_then_kernel(lambda r: fit(recipe=r, config=TrainConfig(devices=2, **ddp)))
    on_slurm = first_then_kernel(lambda r: slurm.submit(r, TrainConfig(num_nodes=2, **ddp), partition="debug",
                                                        time="00:10:00").wait(echo=False, timeout=120))
    assert local[0][:3] == pytest.approx([0.2 / 3, 0.4 / 3, 0.2])  # the linear rule (x2) warmed up over 3 steps
    assert on_slurm[0] == local[0]
    assert all(torch.equal(on_slurm[1][k], local[1][k]) for k in local[1])
