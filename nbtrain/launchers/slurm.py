"""The SLURM launcher: the plan's ranks as one batch job, submitted and followed through submitit.

submitit does the job's life: its SlurmExecutor writes the batch script (one `srun` task per
rank, each running slurm/task.py's RankTask on the run directory) and submits it; its Job reads
the state from SLURM's accounting (sacct), cancels, and requeues on preemption. nbtrain adds
what submitit does not do: the run directory's live events, the step all ranks stop and
checkpoint at (slurm/task.py), each rank's readable traceback, and the rank and node that a
hard kill ended (srun's own line).

Where a batch job's life differs from the contract (base.py):
- it outlives the kernel: `nbtrain.slurm.submit` leaves it running and `attach` finds it again;
  only when a run is driven by `supervise` (fit with launcher="slurm") does `close` cancel a
  job that has not ended (the kernel was interrupted);
- its ranks need a run directory every node sees, and a kernel's run directory is private
  temporary space: `start` copies the inputs into one under the project (`.nbtrain/runs/`, on
  the shared home of most clusters) and brings the outputs back once the job completed;
- it may wait in the queue, and a preempted job is requeued and resumes: state() stays
  "running" through both.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import tempfile
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.slurm import slurm as submitit_slurm

from ..distributed.plan import LaunchPlan
from ..distributed.rundir import CONFIG, ENGINE_IN, ENGINE_OUT, FUNCTION, LAUNCH, MODEL, RECIPE, RESULT, RETURN, RunDir
from ..slurm.options import SlurmOptionError, check_options, minutes
from ..slurm.task import RankTask
from .base import WorkerError, first_raised

SIGNAL_DELAY_S = 90  # submitit signals the job this long before its time limit: the ranks checkpoint and requeue
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}
_SRUN_TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? (\d+)[^:]*: (.+)")
_DRY_RUN_HINT = ("to see the batch script without submitting: nbtrain.slurm.submit(recipe, config, dry_run=True) "
                 "(or %%nbtrain --slurm-dry-run), or write it with nbtrain.slurm.export(recipe, config, folder)")


class SlurmError(RuntimeError):
    """SLURM is missing, or refused the job."""


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
    """submitit's sacct reader, also asking why a job waits and how it ended."""

    def _make_command(self):
        command = super()._make_command()
        return None if command is None else [("JobID,State,NodeList,Reason,ExitCode" if part == "JobID,State,NodeList"
                                               else part) for part in command]


class AccountedJob(submitit.SlurmJob):
    watcher = _Watcher(delay_s=600)  # nbtrain asks when it needs to (SlurmRanks.poll), not on a schedule


class _Executor(submitit.SlurmExecutor):
    job_class = AccountedJob


# --- submitting -------------------------------------------------------------------------------------

def parameters(plan: LaunchPlan, job_name: str, options: dict, signal_delay_s: int) -> dict:
    """submitit's parameters for the plan and the user's sbatch options (checked: SlurmOptionError)."""
    if not isinstance(job_name, str) or not job_name or any(c in job_name for c in "\n\r\0"):
        raise SlurmOptionError(f"job_name={job_name!r}: allowed: a non-empty name on one line")
    if isinstance(signal_delay_s, bool) or not isinstance(signal_delay_s, int) or signal_delay_s < 0:
        raise SlurmOptionError(f"signal_delay_s={signal_delay_s!r}: allowed: whole seconds >= 0 before the time limit")
    extra = check_options(options)
    out = dict(job_name=job_name, nodes=plan.nodes, ntasks_per_node=plan.procs_per_node,
               time=extra.pop("time", None), signal_delay_s=signal_delay_s, wckey=None,
               # A rank that dies ends its peers at once, instead of leaving them in a collective.
               srun_args=["--kill-on-bad-exit=1"], additional_parameters=extra)
    if plan.backend == "nccl":  # backend_for chose nccl: the ranks run on CUDA, one GPU each
        out["gpus_per_node"] = plan.procs_per_node
    return out


def batch_script(params: dict, folder: Path, python: str) -> str:
    """The batch script submitit would submit (it has no public dry run: its own writer)."""
    command = f"{shlex.quote(python)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return submitit_slurm._make_sbatch_string(command=command, folder=folder, **params)


def submit_run(run: RunDir, params: dict, python: str) -> str:
    """Submit the run directory's ranks with submitit; the job id."""
    require("sbatch")
    if params.get("time") is None:
        # submitit needs a time limit to tell a timeout from a preemption: the partition's, as sbatch would use.
        params = {**params, "time": partition_time_limit(params["additional_parameters"].get("partition"))}
    executor = _Executor(folder=run.path, python=shlex.quote(python))
    executor.update_parameters(**params)
    try:
        return executor.submit(RankTask(run.path)).job_id
    except submitit.core.utils.FailedJobError as error:
        raise SlurmError(f"sbatch rejected the job:\n{str(error).strip()}") from None


def partition_time_limit(partition: str | None) -> int | None:
    """The partition's default time limit in minutes (else its maximum; 0: none), as sbatch would apply it."""
    for default, most in sinfo("%L|%l", partition)[:1]:
        for limit in (default, most):
            try:
                return minutes(limit)
            except SlurmOptionError:  # "n/a": no default, look at the maximum
                continue
    return None


def sinfo(fields: str, partition: str | None) -> list[list[str]]:
    """sinfo's `|`-separated fields for each line of `partition` (the default one when None); [] when it cannot tell."""
    binary = shutil.which("sinfo")
    if binary is None:
        return []
    argv = [binary, "-h", "-o", fields] + (["-p", str(partition)] if partition else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20.0)
    except subprocess.TimeoutExpired:
        return []
    return [line.split("|") for line in done.stdout.splitlines() if "|" in line] if done.returncode == 0 else []


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SlurmError(f"SLURM was not found: `{binary}` is not on PATH on this machine. Run this where SLURM's "
                         f"client commands are installed (a login node); {_DRY_RUN_HINT}")
    return path


# --- following ----------------------------------------------------------------------------------------

class SlurmRanks:
    """A submitted job's ranks (base.Ranks): state from SLURM's accounting, events and outputs from the run
    directory. `back_to`: the kernel's run directory the outputs are copied into once the job completed."""

    def __init__(self, job_id: str, run: RunDir, tasks: int, *, back_to: RunDir | None = None, shipped=(),
                 poll_s: float = 1.0):
        self.job_id, self.run, self.back_to, self.shipped, self.poll_s = str(job_id), run, back_to, shipped, poll_s
        self.job = AccountedJob(folder=run.path, job_id=self.job_id, tasks=tuple(range(tasks)))
        # Its own reader: submitit's shared one keeps a finished job's state for good, which a later job with the
        # same id (a new cluster, ids wrapped around) would be given.
        self.job.watcher = _Watcher(delay_s=600)
        self.current = JobState("PENDING", "submitted")
        self._asked, self._replay, self._shown = float("-inf"), run.tail_events(), 0
        self._ran = False  # seen running once: a requeued job's PENDING after that is the queue's

    def poll(self, force: bool = False) -> JobState:
        """Ask SLURM's accounting for the job's state (at most every poll_s unless `force`). Once every rank
        returned (submitit's result files, as its Job.done reads them), the job has completed: accounting
        says so a moment later, when the batch script has exited."""
        if not self.current.terminal and self._every_rank_returned():
            self.current = JobState("COMPLETED", nodes=self.current.nodes)
        if self.current.state != "COMPLETED" and (force or time.monotonic() - self._asked >= self.poll_s):
            self._asked = time.monotonic()
            info = self.job.get_info(mode="force")
            if info:  # a job sacct does not list yet stays as it was (submitted)
                self.current = JobState(info.get("State", "UNKNOWN").split()[0], info.get("Reason", "None"),
                                        info.get("ExitCode", ""), info.get("NodeList", ""))
        if self.current.state == "RUNNING":
            self._ran = True
        elif self.current.state == "PENDING" and not self._ran and self.job.task(0).paths.stdout.exists():
            # slurmdbd records a start a moment after it happened (a short job can be over before sacct says
            # RUNNING); rank 0's output file, which submitit opens as the task starts, says so first
            self.current, self._ran = JobState("RUNNING", nodes=self.current.nodes), True
        return self.current

    def _every_rank_returned(self) -> bool:
        paths = [self.job.task(rank).paths.result_pickle for rank in range(self.job.num_tasks)]
        if not all(path.exists() for path in paths):
            return False
        return all(submitit.core.utils.pickle_load(path)[0] == "success" for path in paths)

    def events(self) -> list[dict]:
        return self._replay()

    def show(self, echo: bool) -> None:
        """Print rank 0's output as it grows (whole lines)."""
        if not echo:
            return
        try:
            with open(self.job.task(0).paths.stdout, "rb") as stream:
                stream.seek(self._shown)
                chunk = stream.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a half-written line waits for its end
        self._shown += len(complete)
        if complete:
            sys.stdout.write(complete.decode(errors="replace"))
            sys.stdout.flush()

    def state(self) -> str:
        state = self.poll()
        if not state.terminal:
            return "running"
        if state.state == "COMPLETED" and (self.run.load_result() is not None or self.run.has_return()):
            self._bring_back()
            return "completed"
        return "failed"

    def request_stop(self) -> None:
        self.run.request_stop()

    def output(self) -> str:
        """Every rank's output so far, rank by rank, then the job's errors (srun's own lines among them)."""
        texts = []
        for rank in range(self.job.num_tasks):
            for path in (self.job.task(rank).paths.stdout, self.job.task(rank).paths.stderr):
                if path.exists():
                    texts.append(path.read_text(errors="replace"))
        return "".join(texts)

    def cancel(self) -> None:
        """scancel the job (every node's processes end; nothing is loaded)."""
        require("scancel")
        try:
            self.job.cancel(check=True)
        except subprocess.CalledProcessError as error:
            raise SlurmError(f"scancel {self.job_id} failed (exit {error.returncode})") from None

    def error(self) -> WorkerError:
        """Why the job ended without completing: a rank killed (srun names it and its node), the first
        traceback a rank wrote, a job that never started, or the end of its output."""
        state, output = self.current, self.output()
        ended = _SRUN_TASK_ENDED.search(output)  # srun names the first rank that ended badly, and its node
        if ended and not ended.group(3).startswith("Exited"):  # killed (the OOM killer, a signal): no traceback
            node, rank, how = ended.group(1), int(ended.group(2)), ended.group(3).strip()
            return WorkerError(f"SLURM job {self.job_id} {state}: rank {rank} on {node} ended without a traceback "
                               f"({how}); the other ranks were stopped", rank=rank, signal_name=how)
        raised = first_raised(self.run, self.run.plan().timeout_s, self.shipped)
        if raised is not None:
            raised.args = (f"SLURM job {self.job_id} {state}: {raised}",)
            return raised
        if not output:  # e.g. a dependency that can never be met, which the cluster's DependencyParameters end
            return WorkerError(f"SLURM job {self.job_id} {state} before any rank started (`scontrol show job "
                               f"{self.job_id}` tells why while the controller still lists it)")
        tail = "\n".join(output.splitlines()[-25:])
        return WorkerError(f"SLURM job {self.job_id} {state}; the end of its output ({self.run.path}):\n{tail}")

    def close(self, echo: bool) -> None:
        """The kernel that drove the job is done with it: a job still queued or running is cancelled."""
        if not self.poll(force=True).terminal:
            self.cancel()
        self.show(echo)
        if self.back_to is not None:  # the copy under the project served its purpose
            self.run.remove()

    def _bring_back(self) -> None:
        if self.back_to is None:
            return
        for name in (MODEL, RESULT, ENGINE_OUT, RETURN):
            if (self.run.path / name).exists():
                shutil.copy2(self.run.path / name, self.back_to.path / name)


class SlurmLauncher:
    name = "slurm"

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> SlurmRanks:
        """The plan's ranks as one batch job in the default partition; its inputs copied where the nodes see them."""
        root = Path.cwd() / ".nbtrain" / "runs"
        root.parent.mkdir(mode=0o700, exist_ok=True)  # private first, so runs/ inherits nothing looser
        root.mkdir(mode=0o700, exist_ok=True)
        shared = RunDir(tempfile.mkdtemp(prefix="nbtrain-run-", dir=root))
        for name in (CONFIG, RECIPE, ENGINE_IN, FUNCTION, LAUNCH):
            if (run.path / name).exists():
                shutil.copy2(run.path / name, shared.path / name)
        try:
            job_id = submit_run(shared, parameters(plan, "nbtrain", {}, SIGNAL_DELAY_S), sys.executable)
        except BaseException:
            shared.remove()
            raise
        return SlurmRanks(job_id, shared, plan.world_size, back_to=run, shipped=shipped)


LAUNCHER = SlurmLauncher()
