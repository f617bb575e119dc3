"""SLURM from the notebook: the same recipe as a batch job on N nodes x M processes, through submitit.

    handle = nbtrain.slurm.submit(recipe, config, partition="gpu", time="01:00:00")
    handle.state                 # JobState: PENDING / RUNNING / COMPLETED / FAILED (reason)
    result = handle.wait()       # rank 0's events stream into handle.log; weights into recipe.model
    handle.stop()                # every rank stops after the same step; the job completes with what it trained
    handle.cancel()              # scancel
    handle = nbtrain.slurm.attach(job_id)      # later, after a kernel restart too
    print(nbtrain.slurm.submit(recipe, config, dry_run=True))   # the batch script, nothing submitted
    nbtrain.slurm.export(recipe, config, "train-job/")          # train.py + train.sbatch, for plain sbatch

submitit does the batch job's life: it writes the batch script (one `srun` task per rank, each
running task.py's RankTask), submits it, reads its state from SLURM's accounting (sacct),
cancels it, and requeues it on preemption. nbtrain keeps what submitit does not do: the run
directory (rundir.py: config.json, recipe.pkl, then events.jsonl, model.pt, result.json,
error-rank{N}.txt), whose events stream live into the kernel's log; the ranks' agreement on the
step to stop and checkpoint at (task.py, requeue.py); each rank's readable traceback; the rank
and node a hard-killed rank ran on. The run directory is also submitit's folder, so every node
must see it: it lives under the project (`.nbtrain/runs/` by default, on the shared home of most
clusters). `.nbtrain/slurm-jobs.json` maps job ids to run directories, which is all `attach`
needs. The kernel never holds the job, so detaching or restarting the kernel loses nothing.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.slurm import slurm as submitit_slurm

from ..config import TrainConfig, check_runnable
from ..distributed.plan import LaunchPlan, for_batch_job
from ..distributed.rundir import RunDir
from ..distributed.tracebacks import error_line, with_user_source
from ..hardware import Inventory
from ..metrics import MetricsLog
from ..runs.result import RunResult
from .options import SlurmOptionError, check_options, minutes
from .standalone import export  # noqa: F401  (part of this module's interface)
from .task import RankTask

__all__ = ["submit", "attach", "export", "JobHandle", "JobState", "SlurmError", "SlurmJobError",
           "SlurmOptionError"]

_DRY_RUN_HINT = ("to see the batch script without submitting: nbtrain.slurm.submit(recipe, config, dry_run=True) "
                 "(or %%nbtrain --slurm-dry-run), or write it with nbtrain.slurm.export(recipe, config, folder)")
SIGNAL_DELAY_S = 90  # submitit signals the job this long before its time limit: the ranks checkpoint and requeue
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}
# Pending reasons that no amount of waiting fixes (sites that do not refuse such jobs at sbatch).
NEVER_STARTS = {"PartitionNodeLimit": "more nodes than the partition allows",
                "PartitionTimeLimit": "a longer time limit than the partition allows",
                "PartitionConfig": "resources the partition does not have",
                "BadConstraints": "constraints no node satisfies",
                "InvalidAccount": "an account that does not exist", "InvalidQOS": "a QOS that does not exist",
                "DependencyNeverSatisfied": "a dependency that can no longer be met"}
_SRUN_TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? (\d+)[^:]*: (.+)")


class SlurmError(RuntimeError):
    """SLURM is missing, or refused the job."""


class SlurmJobError(RuntimeError):
    """The job ended without completing: its state, and the failing rank's traceback when one was written."""

    def __init__(self, message: str, state: "JobState", rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.state, self.rank, self.traceback = state, rank, traceback


@dataclass(frozen=True)
class JobState:
    """A job's state as SLURM's accounting (sacct, read by submitit) reports it."""
    state: str
    reason: str = "None"
    exit_code: str = "0:0"
    nodes: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def __str__(self) -> str:
        text = self.state
        if self.state == "RUNNING" and self.nodes:
            text += f" on {self.nodes}"
        details = [r for r in (self.reason,) if r and r != "None"]
        if self.terminal and self.exit_code not in ("", "0:0"):
            details.append(f"exit {self.exit_code}")
        return text + (f" ({', '.join(details)})" if details else "")


class _Watcher(submitit_slurm.SlurmInfoWatcher):
    """submitit's sacct reader, also asking for why a job waits and how it ended."""

    def _make_command(self):
        command = super()._make_command()
        return None if command is None else [("JobID,State,NodeList,Reason,ExitCode" if part == "JobID,State,NodeList"
                                               else part) for part in command]


class _Job(submitit.SlurmJob):
    watcher = _Watcher(delay_s=600)  # nbtrain asks when it needs to (JobHandle.poll), not on a schedule


class _Executor(submitit.SlurmExecutor):
    job_class = _Job


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
    """
    python = python or sys.executable
    root = Path(run_root) if run_root is not None else Path.cwd() / ".nbtrain" / "runs"
    plan = for_batch_job(config)
    parameters = _parameters(plan, job_name, sbatch_options, signal_delay_s)  # refuses bad options first
    if dry_run:
        # submitit has no public dry run: its own script writer, with the folder the job would get.
        return submitit_slurm._make_sbatch_string(command=_task_command(python, root / "nbtrain-run-XXXXXXXX"),
                                                  folder=root / "nbtrain-run-XXXXXXXX", **parameters)
    _require("sbatch")
    target = partition_inventory(sbatch_options.get("partition"))
    if target is not None:  # the partition's nodes run it, not this login node
        check_runnable(config, target)
    if parameters.get("time") is None:
        # submitit needs a time limit to tell a timeout from a preemption: the partition's, as sbatch would use.
        parameters["time"] = _partition_time_limit(sbatch_options.get("partition"))
    if run_root is None:
        project_dir()  # private .nbtrain/ first, so runs/ inherits nothing looser
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    run = RunDir.create(plan, config=config, recipe=recipe, parent=str(root))
    executor = _Executor(folder=run.path, python=shlex.quote(python))
    executor.update_parameters(**parameters)
    try:
        job = executor.submit(RankTask(run.path))
    except submitit.core.utils.FailedJobError as error:
        run.remove()
        raise SlurmError(f"sbatch rejected the job:\n{str(error).strip()}") from None
    _remember(job.job_id, run.path, job_name, plan.world_size)
    return JobHandle(job.job_id, run.path, job_name=job_name, tasks=plan.world_size, model=recipe.model, log=log)


def _parameters(plan: LaunchPlan, job_name: str, options: dict, signal_delay_s: int) -> dict:
    """submitit's parameters for the plan and the user's sbatch options (checked: SlurmOptionError)."""
    if not isinstance(job_name, str) or not job_name or any(c in job_name for c in "\n\r\0"):
        raise SlurmOptionError(f"job_name={job_name!r}: allowed: a non-empty name on one line")
    if isinstance(signal_delay_s, bool) or not isinstance(signal_delay_s, int) or signal_delay_s < 0:
        raise SlurmOptionError(f"signal_delay_s={signal_delay_s!r}: allowed: whole seconds >= 0 before the time limit")
    extra = check_options(options)
    parameters = dict(job_name=job_name, nodes=plan.nodes, ntasks_per_node=plan.procs_per_node,
                      time=extra.pop("time", None), signal_delay_s=signal_delay_s, wckey=None,
                      # A rank that dies ends its peers at once, instead of leaving them in a collective.
                      srun_args=["--kill-on-bad-exit=1"], additional_parameters=extra)
    if plan.backend == "nccl":  # backend_for chose nccl: the ranks run on CUDA, one GPU each
        parameters["gpus_per_node"] = plan.procs_per_node
    return parameters


def _task_command(python: str, folder: Path) -> str:
    return f"{shlex.quote(python)} -u -m submitit.core._submit {shlex.quote(str(folder))}"


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
    """A submitted job (a submitit Job): live state, rank 0's events replayed into `log`, the weights at the end.

    `tasks`: the job's ranks (submitit's tasks). A job submitted without submitit (an exported train.sbatch)
    is followed the same way: its state from SLURM, its events and results from its run directory.
    """

    def __init__(self, job_id: str, run_dir, *, job_name: str, tasks: int = 1, model=None,
                 log: MetricsLog | None = None, poll_s: float = 1.0):
        self.job_id, self.job_name, self.poll_s = str(job_id), job_name, poll_s
        self.run = RunDir(run_dir)
        self.job = _Job(folder=self.run.path, job_id=self.job_id, tasks=tuple(range(tasks)))
        self.log = log if log is not None else MetricsLog()
        self._model = model
        self._replay = self.run.tail_events()
        self._output_offset = 0
        self._state, self._asked = JobState("PENDING", "submitted"), float("-inf")

    def __repr__(self) -> str:
        return f"<nbtrain SLURM job {self.job_id} {self.job_name!r}: {self._state}>"

    @property
    def state(self) -> JobState:
        return self.poll(force=True)

    @property
    def output_path(self) -> Path:
        """Rank 0's output (and the job's own lines): what `wait` echoes."""
        return self.job.task(0).paths.stdout

    def output(self) -> str:
        """Every rank's output so far, rank by rank, then the job's errors (srun's own lines among them)."""
        texts = []
        for rank in range(self.job.num_tasks):
            for path in (self.job.task(rank).paths.stdout, self.job.task(rank).paths.stderr):
                if path.exists():
                    texts.append(path.read_text(errors="replace"))
        return "".join(texts)

    def poll(self, force: bool = False) -> JobState:
        """Ask SLURM's accounting for the job's state (at most every poll_s unless `force`), and replay
        rank 0's new events into `log`."""
        if force or time.monotonic() - self._asked >= self.poll_s:
            self._asked = time.monotonic()
            info = self.job.get_info(mode="force")
            if info:  # a job sacct does not list yet stays as it was (submitted)
                self._state = JobState(info.get("State", "UNKNOWN").split()[0], info.get("Reason", "None"),
                                       info.get("ExitCode", ""), info.get("NodeList", ""))
        for event in self._replay():
            self.log.emit(event)
        return self._state

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
                self._echo(echo)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"SLURM job {self.job_id} is still {self._state} after {timeout:g} s; "
                                       f"it keeps running (handle.wait() again, or handle.cancel())")
                time.sleep(0.2)
        except KeyboardInterrupt:
            self.cancel()
            raise KeyboardInterrupt(f"interrupted: SLURM job {self.job_id} was cancelled") from None
        self._echo(echo)
        return self._finish()

    def stop(self) -> None:
        """Ask every rank to stop after the same optimizer step; the job then completes with what it trained."""
        self.run.request_stop()

    def cancel(self) -> None:
        """scancel the job (every node's processes end; nothing is loaded)."""
        _require("scancel")
        try:
            self.job.cancel(check=True)
        except subprocess.CalledProcessError as error:
            raise SlurmError(f"scancel {self.job_id} failed (exit {error.returncode})") from None

    @property
    def model(self):
        if self._model is None:
            self._model = self.run.recipe().model
        return self._model

    # --- internals ---------------------------------------------------------------------------

    def _finish(self) -> RunResult:
        from ..distributed.launch import gathered_result
        state = self._state
        saved = self.run.load_result()
        if state.state == "COMPLETED" and saved is not None:
            weights = self.run.load_model()
            if weights is not None:
                self.model.load_state_dict(weights)
            result = gathered_result(self.run.config(), self.log, saved, "completed")
            result.extras.update(job_id=self.job_id, run_dir=str(self.run.path), slurm_state=str(state))
            return result
        output = self.output()
        ended = _SRUN_TASK_ENDED.search(output)  # srun names the first rank that ended badly, and its node
        if ended and not ended.group(3).startswith("Exited"):  # killed (the OOM killer, a signal): no traceback
            node, rank, how = ended.group(1), int(ended.group(2)), ended.group(3).strip()
            raise SlurmJobError(f"SLURM job {self.job_id} {state}: rank {rank} on {node} ended without a traceback "
                                f"({how}); the other ranks were stopped", state, rank)
        errors = self.run.errors()
        if errors:
            rank, text = errors[0]  # the earliest written: the root cause, not a peer's broken pipe
            text = with_user_source(text)  # notebook frames get their cell's source lines
            error = SlurmJobError(f"SLURM job {self.job_id} {state}: rank {rank} raised {error_line(text)}\n\n"
                                  f"[rank {rank}] {text}", state, rank, text)
            error.nbtrain_part = self.run.error_part(rank)  # the recipe part that raised, as Recipe marks it
            raise error
        if not output:  # e.g. a dependency that can never be met, which the cluster's DependencyParameters end
            raise SlurmJobError(f"SLURM job {self.job_id} {state} before any rank started (`scontrol show job "
                                f"{self.job_id}` tells why while the controller still lists it)", state)
        tail = "\n".join(output.splitlines()[-25:])
        raise SlurmJobError(f"SLURM job {self.job_id} {state}; the end of its output "
                            f"({self.run.path}):\n{tail}", state)

    def _echo(self, echo: bool) -> None:
        if not echo:
            return
        try:
            with open(self.output_path, "rb") as stream:
                stream.seek(self._output_offset)
                chunk = stream.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a half-written line waits for its end
        self._output_offset += len(complete)
        if complete:
            sys.stdout.write(complete.decode(errors="replace"))
            sys.stdout.flush()


def partition_inventory(partition: str | None) -> Inventory | None:
    """What a node of `partition` (the default one when None) offers, read with sinfo: GPUs from its
    generic resources (gres gpu:N or gpu:type:N), cores from its CPU count. None when sinfo cannot tell."""
    lines = _sinfo("%G|%c", partition)
    if not lines:
        return None
    gpus = cores = 0
    for gres, cpus in lines:  # the best node of the partition: a job asks for what one node has
        count = sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres))
        gpus, cores = max(gpus, count), max(cores, int(cpus) if cpus.strip().isdigit() else 0)
    return Inventory(cuda_devices=gpus, cuda_bf16=bool(gpus), mps=False, cpu_cores=max(cores, 1))


def _partition_time_limit(partition: str | None) -> int | None:
    """The partition's default time limit in minutes (else its maximum; 0: none), as sbatch would apply it."""
    for default, most in _sinfo("%L|%l", partition)[:1]:
        for limit in (default, most):
            try:
                return minutes(limit)
            except SlurmOptionError:  # "n/a": no default, look at the maximum
                continue
    return None


def _sinfo(fields: str, partition: str | None) -> list[list[str]]:
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return []
    argv = [sinfo, "-h", "-o", fields] + (["-p", str(partition)] if partition else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20.0)
    except subprocess.TimeoutExpired:
        return []
    return [line.split("|") for line in done.stdout.splitlines() if "|" in line] if done.returncode == 0 else []


_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SlurmError(f"SLURM was not found: `{binary}` is not on PATH on this machine. Run this where SLURM's "
                         f"client commands are installed (a login node); {_DRY_RUN_HINT}")
    return path


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
