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
from nbtrain.slurm import SlurmError, SlurmJobError, SlurmOptionError
from slurm_fixture import slurm_cluster  # noqa: F401  (the session's cluster)

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
    assert {"--nodes=2", "--ntasks-per-node=1", "--exclusive", "--time=00:10:00", "--signal=B:USR1@90"} <= set(headers)
    assert "--rdzv-backend=c10d" in script and 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # bash reads the run directory back as the exact path, running nothing inside it.
    assignment = next(line for line in script.splitlines() if line.startswith("run_dir="))
    echoed = subprocess.run(["bash", "-c", assignment + '\nprintf %s "$run_dir"'], capture_output=True, text=True,
                            cwd=project)
    assert echoed.stdout.startswith(str(root) + "/nbtrain-run-")
    assert not list(project.glob("pwned*")) and not (project / ".nbtrain").exists()  # a dry run writes nothing


def test_bad_sbatch_options_name_the_option(project):
    with pytest.raises(SlurmOptionError, match=r"nodes=3: not allowed here: set num_nodes"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, nodes=3)
    with pytest.raises(SlurmOptionError, match=r"partition='a\\nb': allowed: a non-empty value on one line"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, partition="a\nb")
    with pytest.raises(SlurmOptionError, match=r"requeue_signal='soon': allowed: SIGNAL@SECONDS"):
        slurm.submit(digits_recipe(), two_nodes(), dry_run=True, requeue_signal="soon")


def test_without_sbatch_on_path_the_error_says_slurm_was_not_found_and_how_to_dry_run(project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))  # a real PATH with no SLURM on it
    with pytest.raises(SlurmError) as caught:
        slurm.submit(digits_recipe(), two_nodes())
    assert "SLURM was not found: `sbatch` is not on PATH" in str(caught.value)
    assert "dry_run=True" in str(caught.value)
    assert not (project / ".nbtrain" / "runs").exists() or not any((project / ".nbtrain" / "runs").iterdir())


def test_job_state_is_read_after_the_job_name_whatever_the_name_contains():
    from nbtrain.slurm.state import parse_job
    name = "x JobState=COMPLETED Reason=None y"
    line = (f"JobId=7 JobName={name} UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
            f"Restarts=2 BatchFlag=1 ExitCode=0:0 NodeList=node[1-2] StdOut=/runs/JobState=FAILED/out")
    state = parse_job(line, "7", name)
    assert (state.state, state.restarts, state.nodes) == ("RUNNING", 2, "node[1-2]")
    assert str(state) == "RUNNING on node[1-2] (requeued 2x)"


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
    assert result.status == "completed" and result.summary["world_size"] == 2
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
    try:
        subprocess.run(["scancel", blocker], check=True)  # afterok can no longer be met
        with pytest.raises(SlurmJobError, match=r"can never start: PENDING \(DependencyNeverSatisfied\).*"
                                                r"handle.cancel\(\) removes it"):
            handle.wait(echo=False, timeout=30)
    finally:
        handle.cancel()
    assert wait_for(handle, lambda s: s.terminal, timeout=30).state == "CANCELLED"


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
        assert sorted(cluster.running()) == ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]
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


@pytest.mark.slow
def test_requeue_signal_checkpoints_and_the_requeued_job_resumes(slurm_cluster, project):  # noqa: F811
    config = two_nodes(max_epochs=2, log_every_n_steps=4)
    handle = slurm.submit(digits_recipe(), config, cpus_per_task=1)
    wait_for(handle, lambda s: "restart 0" in handle.output())  # the batch shell's trap is in place
    # What SLURM sends before the time limit (--signal=B:USR1@90), sent now.
    subprocess.run(["scancel", "--signal=USR1", "--batch", handle.job_id], check=True)
    # SLURM holds a requeued job back for about two minutes (Reason=BeginTime). The test cuts that short,
    # but like those minutes, only after the first run's step daemons are gone and a few seconds have
    # passed: slurmd refuses a launch in the same second as the requeue revoked the job's credential.
    # A step daemon still there half a minute on (a busy machine) no longer holds the launch back. A
    # launch that fails all the same can hold the job back again (the likely cause of one CI timeout), so
    # the test releases it until the requeued batch shell has started ("restart 1"), not only once.
    deadline, held_since = time.monotonic() + 240, None
    while time.monotonic() < deadline and "restart 1" not in handle.output():
        state = handle.poll()
        if state.terminal:
            break
        held = state.restarts >= 1 and state.state == "PENDING" and state.reason == "BeginTime"
        held_since = (held_since or time.monotonic()) if held else None
        waited = time.monotonic() - held_since if held else 0.0
        if held and waited > 3 and (waited > 30 or not step_daemons(handle.job_id)):
            subprocess.run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=True)
            held_since = None  # held again only after a failed launch: wait as long again
        time.sleep(0.3)
    result = handle.wait(echo=False, timeout=120)
    starts = [e["info"]["step_start"] for e in handle.log.of_type("start")]
    assert starts[0] == 0 and starts[1] == 4  # stopped at the first log window, resumed from its checkpoint
    assert [e["status"] for e in handle.log.of_type("end")] == ["requeue", "completed"]
    assert handle.log.columns["step"] == list(range(1, 2 * 12 + 1))  # every step once, none repeated
    assert result.status == "completed" and handle.state.restarts == 1
    assert "requeueing job" in handle.output()


def test_a_gpu_config_asks_each_node_for_its_gpus_and_runs_one_rank_per_gpu(project):
    from nbtrain.hardware import Inventory, assume
    with assume(Inventory(cuda_devices=4, cuda_bf16=True, mps=False, cpu_cores=32)):  # the GPU nodes, not here
        config = TrainConfig(num_nodes=3, devices=4, accelerator="cuda", precision="bf16-mixed")
    script = slurm.submit(digits_recipe(), config, dry_run=True, partition="gpu", time="01:00:00")
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --nodes=3" in script
    assert "nproc=4" in script and "--nnodes=3" in script
    assert for_batch_job(config).backend == "nccl"  # the accelerator asked for decides, not this login node


@pytest.mark.slow
def test_the_exported_sbatch_file_trains_on_the_cluster(slurm_cluster, project):  # noqa: F811
    batch = slurm.export(digits_recipe(), two_nodes(max_steps=5), project / "job", cpus_per_task=1)
    job_id = subprocess.run(["sbatch", "--parsable", str(batch)], capture_output=True, text=True,
                            check=True).stdout.strip()
    handle = slurm.JobHandle(job_id, batch.parent, job_name="nbtrain")
    result = handle.wait(echo=False, timeout=120)
    assert result.status == "completed" and result.summary["world_size"] == 2
    assert handle.log.columns["step"] == [1, 2, 3, 4, 5]
    assert set(torch.load(batch.parent / "model.pt", weights_only=True)) == set(handle.model.state_dict())
