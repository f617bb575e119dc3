"""SLURM from the notebook: the same recipe as a batch job on N nodes x M processes, through submitit.

    handle = nbtrain.slurm.submit(recipe, config, partition="gpu", time="01:00:00")
    handle.state                 # JobState: PENDING / RUNNING / COMPLETED / FAILED (reason)
    result = handle.wait()       # rank 0's events stream into handle.log; weights into recipe.model
    handle.stop()                # every rank stops after the same step; the job completes with what it trained
    handle.cancel()              # scancel
    handle = nbtrain.slurm.attach(job_id)      # later, after a kernel restart too
    print(nbtrain.slurm.submit(recipe, config, dry_run=True))   # the batch script, nothing submitted
    nbtrain.slurm.export(recipe, config, "train-job/")          # train.py + train.sbatch, for plain sbatch

The job is the SLURM launcher's (launchers/slurm.py: submitit submits, follows, cancels and
requeues it). A submission is a run directory (rundir.py: config.json, recipe.pkl, then
events.jsonl, model.pt, result.json, error-rank{N}.txt, and submitit's files) that every node
must see, so it lives under the project (`.nbtrain/runs/` by default, on the shared home of
most clusters). `.nbtrain/slurm-jobs.json` maps job ids to run directories, which is all
`attach` needs. The kernel never holds the job, so detaching or restarting the kernel loses nothing.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from ..config import TrainConfig, check_runnable
from ..distributed.plan import for_batch_job
from ..distributed.rundir import RunDir
from ..hardware import Inventory
from ..launchers.slurm import (SIGNAL_DELAY_S, JobState, SlurmError, SlurmRanks, batch_script, parameters, sinfo,
                               submit_run)
from ..metrics import MetricsLog
from ..runs.result import RunResult
from .options import SlurmOptionError
from .standalone import export  # noqa: F401  (part of this module's interface)

__all__ = ["submit", "attach", "export", "JobHandle", "JobState", "SlurmError", "SlurmJobError",
           "SlurmOptionError"]

# Pending reasons that no amount of waiting fixes (sites that do not refuse such jobs at sbatch).
NEVER_STARTS = {"PartitionNodeLimit": "more nodes than the partition allows",
                "PartitionTimeLimit": "a longer time limit than the partition allows",
                "PartitionConfig": "resources the partition does not have",
                "BadConstraints": "constraints no node satisfies",
                "InvalidAccount": "an account that does not exist", "InvalidQOS": "a QOS that does not exist",
                "DependencyNeverSatisfied": "a dependency that can no longer be met"}


class SlurmJobError(RuntimeError):
    """The job ended without completing: its state, and the failing rank's traceback when one was written."""

    def __init__(self, message: str, state: JobState, rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.state, self.rank, self.traceback = state, rank, traceback


def project_dir() -> Path:
    """The project-local `.nbtrain/` folder (private), next to the notebook."""
    path = Path.cwd() / ".nbtrain"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def submit(recipe, config: TrainConfig, *, job_name: str = "nbtrain", dry_run: bool = False,
           run_root: str | os.PathLike | None = None, python: str | None = None,
           signal_delay_s: int = SIGNAL_DELAY_S, log: MetricsLog | None = None, **sbatch_options):
    """Submit `recipe` trained with `config` (num_nodes x devices) as a batch job; return its JobHandle.

    sbatch_options become sbatch long options: partition="gpu" -> --partition=gpu,
    exclusive=True -> --exclusive. dry_run=True returns the script text and submits nothing.
    signal_delay_s: how long before the time limit the ranks are told to checkpoint and requeue.
    """
    python = python or sys.executable
    root = Path(run_root) if run_root is not None else Path.cwd() / ".nbtrain" / "runs"
    plan = for_batch_job(config)
    params = parameters(plan, job_name, sbatch_options, signal_delay_s)  # refuses bad options first
    if dry_run:
        return batch_script(params, root / "nbtrain-run-XXXXXXXX", python)
    target = partition_inventory(sbatch_options.get("partition"))
    if target is not None:  # the partition's nodes run it, not this login node
        check_runnable(config, target)
    if run_root is None:
        project_dir()  # private .nbtrain/ first, so runs/ inherits nothing looser
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    run = RunDir.create(plan, config=config, recipe=recipe, parent=str(root))
    try:
        job_id = submit_run(run, params, python)
    except BaseException:
        run.remove()
        raise
    _remember(job_id, run.path, job_name, plan.world_size)
    return JobHandle(job_id, run.path, job_name=job_name, tasks=plan.world_size, model=recipe.model, log=log)


def attach(job_id, *, model=None, log: MetricsLog | None = None) -> "JobHandle":
    """A handle on a job submitted earlier from this project (by any kernel). `model` gets the weights;
    without it, the model shipped with the job is rebuilt from its run directory."""
    record = _records().get(str(job_id))
    if record is None:
        known = ", ".join(sorted(_records(), key=int)[-5:]) or "none"
        raise SlurmError(f"job {job_id} was not submitted from this project ({Path.cwd()}); "
                         f"known jobs: {known}")
    return JobHandle(str(job_id), record["run_dir"], job_name=record["job_name"], tasks=record.get("tasks", 1),
                     model=model, log=log)


class JobHandle:
    """A submitted job: live state, rank 0's events replayed into `log`, the weights at the end.

    `tasks`: the job's ranks (submitit's tasks). A job submitted without submitit (an exported
    train.sbatch) is followed the same way: its state from SLURM, its events and results from its run directory.
    """

    def __init__(self, job_id: str, run_dir, *, job_name: str, tasks: int = 1, model=None,
                 log: MetricsLog | None = None, poll_s: float = 1.0):
        self.job_id, self.job_name = str(job_id), job_name
        self.run = RunDir(run_dir)
        self.ranks = SlurmRanks(self.job_id, self.run, tasks, poll_s=poll_s)
        self.job = self.ranks.job  # submitit's Job
        self.log = log if log is not None else MetricsLog()
        self._model = model

    def __repr__(self) -> str:
        return f"<nbtrain SLURM job {self.job_id} {self.job_name!r}: {self.ranks.current}>"

    @property
    def state(self) -> JobState:
        return self.poll(force=True)

    def output(self) -> str:
        """Every rank's output so far, rank by rank, then the job's errors (srun's own lines among them)."""
        return self.ranks.output()

    def poll(self, force: bool = False) -> JobState:
        """The job's state from SLURM's accounting (at most every poll_s unless `force`); rank 0's new events
        replayed into `log`."""
        state = self.ranks.poll(force)
        for event in self.ranks.events():
            self.log.emit(event)
        return state

    def wait(self, timeout: float | None = None, echo: bool = True, on_state=None) -> RunResult:
        """Follow the job to its end; load the trained weights; the RunResult, or SlurmJobError.

        echo: print rank 0's output as it grows. on_state(JobState): called on every change
        (a notebook view shows it). An interrupt (Ctrl-C, the stop button) cancels the job.
        """
        __tracebackhide__ = True
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = None
        try:
            while True:
                state = self.poll()
                if on_state is not None and state != shown:
                    shown = state
                    on_state(state)
                if state.terminal:
                    break
                if state.state == "PENDING" and state.reason in NEVER_STARTS:
                    raise SlurmJobError(f"SLURM job {self.job_id} can never start: {state}: it asks for "
                                        f"{NEVER_STARTS[state.reason]}. It is still queued; handle.cancel() "
                                        f"removes it", state)
                self.ranks.show(echo)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"SLURM job {self.job_id} is still {state} after {timeout:g} s; "
                                       f"it keeps running (handle.wait() again, or handle.cancel())")
                time.sleep(0.2)
        except KeyboardInterrupt:
            self.cancel()
            raise KeyboardInterrupt(f"interrupted: SLURM job {self.job_id} was cancelled") from None
        self.ranks.show(echo)
        return self._finish()

    def stop(self) -> None:
        """Ask every rank to stop after the same optimizer step; the job then completes with what it trained."""
        self.ranks.request_stop()

    def cancel(self) -> None:
        """scancel the job (every node's processes end; nothing is loaded)."""
        self.ranks.cancel()

    @property
    def model(self):
        if self._model is None:
            self._model = self.run.recipe().model
        return self._model

    def _finish(self) -> RunResult:
        from ..distributed.launch import gathered_result
        if self.ranks.state() == "completed":
            weights = self.run.load_model()
            if weights is not None:
                self.model.load_state_dict(weights)
            result = gathered_result(self.run.config(), self.log, self.run.load_result(), "completed")
            result.extras.update(job_id=self.job_id, run_dir=str(self.run.path), slurm_state=str(self.ranks.current))
            return result
        cause = self.ranks.error()
        error = SlurmJobError(str(cause), self.ranks.current, cause.rank, cause.traceback)
        error.nbtrain_part = getattr(cause, "nbtrain_part", None)  # the recipe part that raised, as Recipe marks it
        raise error


def partition_inventory(partition: str | None) -> Inventory | None:
    """What a node of `partition` (the default one when None) offers, read with sinfo: GPUs from its
    generic resources (gres gpu:N or gpu:type:N), cores from its CPU count. None when sinfo cannot tell."""
    lines = sinfo("%G|%c", partition)
    if not lines:
        return None
    gpus = cores = 0
    for gres, cpus in lines:  # the best node of the partition: a job asks for what one node has
        count = sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres))
        gpus, cores = max(gpus, count), max(cores, int(cpus) if cpus.strip().isdigit() else 0)
    return Inventory(cuda_devices=gpus, cuda_bf16=bool(gpus), mps=False, cpu_cores=max(cores, 1))


_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def _records_path() -> Path:
    return project_dir() / "slurm-jobs.json"


def _records() -> dict:
    path = _records_path()
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _remember(job_id: str, run_dir: Path, job_name: str, tasks: int) -> None:
    records = _records()
    records[job_id] = {"run_dir": str(run_dir), "job_name": job_name, "tasks": tasks, "submitted": time.time()}
    path = _records_path()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        json.dump(records, stream, indent=1)
    os.replace(tmp, path)
