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
import sys
import time
from pathlib import Path

from . import launchers
from ..config import TrainConfig
from . import carry
from .rundir import RunDir
from .launchers.base import supervise
from .launchers.slurm import SIGNAL_DELAY_S, JobState, SlurmError, SlurmRanks
from ..metrics import MetricsLog
from ..runs.result import RunResult



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
           signal_delay_s: int = SIGNAL_DELAY_S, log: MetricsLog | None = None, engine=None, first=None,
           **sbatch_options):
    """Submit `recipe` trained with `config` (num_nodes x devices) as a batch job; return its JobHandle.

    The job is the slurm launcher's (`fit(..., launcher="slurm", launcher_options={...})`) with these options:
    sbatch_options become sbatch long options: partition="gpu" -> --partition=gpu,
    exclusive=True -> --exclusive. dry_run=True returns the script text and submits nothing.
    signal_delay_s: how long before the time limit the ranks are told to checkpoint and requeue.
    engine: the kernel's engine the job continues (optimizer, schedule, position, random numbers; the
    model's live engine when None, as fit and %%nbtrain --slurm pass it); it continues from the job's once
    the handle's wait() completes. first: a carry.FirstCall where the kernel holds no engine of the model yet
    (nbtrain.slurm.submit passes one, as fit does): the ranks start from its seed and random numbers, and the
    kernel's live engine is made from theirs once wait() completes. Without either the ranks start their own.
    """
    config = config.replace(launcher="slurm")
    target = launchers.launcher_for(config, job_name=job_name, run_root=run_root, python=python,
                                    signal_delay_s=signal_delay_s, **sbatch_options)  # refuses bad options first
    plan = target.plan(config)
    if dry_run:
        return target.script(plan)
    target.check(config)  # a node of the partition runs it, not this login node (sinfo; unknown: not checked)
    engine = engine if engine is not None else carry.live_engine(recipe.model)
    run = RunDir.create(plan, config=config, recipe=recipe, parent=str(target.prepared_root()),
                        engine_state=carry.sent(engine) if engine is not None else
                        first.state if first is not None else None)
    try:
        job_id = target.submit(run, plan)
    except BaseException:
        run.remove()
        raise
    _remember(job_id, run.path, job_name, plan.world_size)
    return JobHandle(job_id, run.path, job_name=job_name, tasks=plan.world_size, model=recipe.model, log=log,
                     engine=engine, first=first)


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
    Its ranks are the slurm launcher's (SlurmRanks), followed by the one loop that follows any launcher's
    (launchers/base.supervise); a handle outlives its kernel's interest: only an interrupt cancels the job.
    `engine`: the kernel's engine the job continues, and that continues from it once it completed.
    """

    def __init__(self, job_id: str, run_dir, *, job_name: str, tasks: int = 1, model=None,
                 log: MetricsLog | None = None, poll_s: float = 1.0, engine=None, first=None):
        self.job_id, self.job_name = str(job_id), job_name
        self.run = RunDir(run_dir)
        self.ranks = SlurmRanks(self.job_id, self.run, tasks, poll_s=poll_s, owned=False)
        self.job = self.ranks.job  # submitit's Job
        self.log = log if log is not None else MetricsLog()
        self._model, self._engine, self._first = model, engine, first

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
        self.ranks.on_state = on_state
        status, cause = supervise(self.ranks, self.log, echo, timeout=timeout)
        if status == "running":
            raise TimeoutError(f"SLURM job {self.job_id} is still {self.ranks.current} after {timeout:g} s; "
                               f"it keeps running (handle.wait() again, or handle.cancel())")
        if status == "interrupted":
            self.cancel()
            raise KeyboardInterrupt(f"interrupted: SLURM job {self.job_id} was cancelled") from None
        if cause is not None:
            error = SlurmJobError(str(cause), self.ranks.current, cause.rank, cause.traceback)
            error.nbtrain_part = getattr(cause, "nbtrain_part", None)  # the recipe part that raised, as Recipe marks it
            raise error
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
        from .launch import gathered_result
        weights = self.run.load_model()
        notes = []
        if weights is not None:
            self.model.load_state_dict(weights)
            if self._engine is None and self._first is not None:
                self._engine = self._first.make()  # the kernel's live engine from now on, continuing the job's run
            back = self.run.load_engine_state() if self._engine is not None else None
            if back is not None:  # the kernel's engine continues from the job's, as after any launcher's run
                notes = carry.bring_back(self._engine, back)
            self._engine = self._first = None  # brought back once: a second wait() must not load it again
        result = gathered_result(self.run.config(), self.log, self.run.load_result(), "completed")
        if notes:
            result.summary = result.summary.with_notes(notes)
        result.extras.update(job_id=self.job_id, run_dir=str(self.run.path), slurm_state=str(self.ranks.current),
                             weights_loaded=weights is not None)
        return result


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
