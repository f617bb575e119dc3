"""The SLURM launcher: the plan's ranks as one batch job, submitted and followed through submitit.

submitit does the job's life: its SlurmExecutor writes the batch script (one `srun` task per
rank, each running distributed/slurm_task.py's RankTask on the run directory) and submits it; its Job reads
the state from SLURM's accounting (sacct), cancels, and requeues on preemption. nbtrain adds
what submitit does not do: the run directory's live events, the step all ranks stop and
checkpoint at (distributed/slurm_task.py), each rank's readable traceback, and the rank and node that a
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

from ..plan import LaunchPlan
from ..rundir import CONFIG, ENGINE_IN, ENGINE_OUT, FUNCTION, LAUNCH, MODEL, RECIPE, RESULT, RETURN, RunDir
from ..slurm_options import SlurmOptionError, check_options, minutes
from ..slurm_task import RankTask
from ...hardware import Inventory
from .base import Target, WorkerError, first_raised

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
                 poll_s: float = 1.0, owned: bool = True, on_state=None):
        self.job_id, self.run, self.back_to, self.shipped, self.poll_s = str(job_id), run, back_to, shipped, poll_s
        # owned: the kernel's call drives the job (fit), so closing cancels one still queued or running; a
        # submitted job (nbtrain.slurm.submit) outlives whoever follows it. on_state(JobState): each change.
        self.owned, self.on_state, self._told = owned, on_state, None
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
        if self.on_state is not None and state != self._told:
            self._told = state
            self.on_state(state)
        if not state.terminal:
            return "failed" if self.never_starts() else "running"
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

    def never_starts(self) -> bool:
        return self.current.state == "PENDING" and self.current.reason in NEVER_STARTS

    def error(self) -> WorkerError:
        """Why the job ended without completing: a rank killed (srun names it and its node), the first
        traceback a rank wrote, a job that never started (or can never start), or the end of its output."""
        state, output = self.current, self.output()
        if self.never_starts():
            left = "It was cancelled" if self.owned else "It is still queued; handle.cancel() removes it"
            return WorkerError(f"SLURM job {self.job_id} can never start: {state}: it asks for "
                               f"{NEVER_STARTS[state.reason]}. {left}")
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
        """The kernel that drove the job is done with it: a job it owns still queued or running is cancelled."""
        if self.owned and not self.poll(force=True).terminal:
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


class SlurmTarget(Target):
    """A SLURM partition (submitit's SlurmExecutor, with its options): checked against what a node of the
    partition offers (sinfo), never against the kernel's machine; where sinfo cannot tell, nothing is checked."""

    name = "slurm"
    OPTIONS = {"partition": "a partition name (sbatch --partition; default: the cluster's default partition)",
               "time": "a time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time)",
               "job_name": "a non-empty name on one line (default nbtrain)",
               "signal_delay_s": "whole seconds >= 0 before the time limit the ranks checkpoint and requeue",
               "run_root": "a folder every node sees, for the job's run directory (default .nbtrain/runs in the "
                           "project)",
               "python": "the interpreter the nodes run (default this one)"}

    def __init__(self, **options):
        super().__init__(**options)
        self.options.setdefault("job_name", "nbtrain")
        self.options.setdefault("signal_delay_s", SIGNAL_DELAY_S)

    def takes_any(self, name: str) -> bool:
        return True  # any other sbatch long option (account=..., exclusive=True, ...): check_options reads it

    def read_option(self, name: str, value):
        if name in ("job_name", "signal_delay_s"):
            parameters(LaunchPlan(), **{"job_name": "nbtrain", "signal_delay_s": SIGNAL_DELAY_S, "options": {},
                                        name: value})  # its own check: SlurmOptionError names it
            return value
        if name in ("run_root", "python"):
            if value is not None and (not isinstance(value, (str, Path)) or not str(value)):
                raise SlurmOptionError(f"launcher='slurm': option {name}={value!r}: allowed: {self.OPTIONS[name]}")
            return value
        check_options({name: value})
        return value

    def sbatch_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k not in self.OPTIONS or k in ("partition", "time")}

    def inventory(self) -> Inventory | None:
        return partition_inventory(self.options.get("partition"))

    def where(self) -> str:
        partition = self.options.get("partition")
        return f"a node of partition {partition!r} (sinfo)" if partition else "a node of the default partition (sinfo)"

    def parameters(self, plan: LaunchPlan) -> dict:
        return parameters(plan, self.options["job_name"], self.sbatch_options(), self.options["signal_delay_s"])

    def run_root(self) -> Path:
        root = self.options.get("run_root")
        return Path(root) if root is not None else Path.cwd() / ".nbtrain" / "runs"

    def python(self) -> str:
        return str(self.options.get("python") or sys.executable)

    def script(self, plan: LaunchPlan) -> str:
        """The batch script the job would be, nothing submitted (a dry run)."""
        return batch_script(self.parameters(plan), self.run_root() / "nbtrain-run-XXXXXXXX", self.python())

    def prepared_root(self) -> Path:
        """The run root, made (private) where it is not yet: every node sees the run directories under it."""
        root = self.run_root()
        if self.options.get("run_root") is None:
            root.parent.mkdir(mode=0o700, exist_ok=True)  # private first, so runs/ inherits nothing looser
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return root

    def shared_dir(self) -> RunDir:
        """A new private run directory under the run root."""
        return RunDir(tempfile.mkdtemp(prefix="nbtrain-run-", dir=self.prepared_root()))

    def submit(self, run: RunDir, plan: LaunchPlan) -> str:
        """Submit the run directory's ranks as one batch job; its id."""
        return submit_run(run, self.parameters(plan), self.python())

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> SlurmRanks:
        """The plan's ranks as one batch job, its inputs copied where the nodes see them; closing cancels it."""
        params = self.parameters(plan)  # a bad option refuses before anything is written
        shared = self.shared_dir()
        for name in (CONFIG, RECIPE, ENGINE_IN, FUNCTION, LAUNCH):
            if (run.path / name).exists():
                shutil.copy2(run.path / name, shared.path / name)
        try:
            job_id = submit_run(shared, params, self.python())
        except BaseException:
            shared.remove()
            raise
        return SlurmRanks(job_id, shared, plan.world_size, back_to=run, shipped=shipped)


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

TARGET = SlurmTarget
