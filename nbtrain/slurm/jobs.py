"""SLURM from the notebook: the same recipe as a batch job on N nodes x M processes.

    handle = nbtrain.slurm.submit(recipe, config, partition="gpu", time="01:00:00")
    handle.state                 # JobState: PENDING / RUNNING / COMPLETED / FAILED (reason)
    result = handle.wait()       # rank 0's events stream into handle.log; weights into recipe.model
    handle.cancel()              # scancel
    handle = nbtrain.slurm.attach(job_id)      # later, after a kernel restart too
    print(nbtrain.slurm.submit(recipe, config, dry_run=True))   # the batch script, nothing submitted
    nbtrain.slurm.export(recipe, config, "train-job/")          # train.py + train.sbatch

A submission is a run directory (rundir.py: config.json, recipe.pkl, then events.jsonl,
model.pt, result.json, error-rank{N}.txt) that every node must see, so it lives under the
project (`.nbtrain/runs/` by default, on the shared home of most clusters), plus the batch
script from slurm_script.py. `.nbtrain/slurm-jobs.json` maps job ids to run directories,
which is all `attach` needs. The kernel never holds the job: it only polls
`scontrol show job` and reads files, so detaching or restarting the kernel loses nothing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..config import TrainConfig, check_runnable
from ..hardware import Inventory
from ..metrics import MetricsLog
from ..runs.result import RunResult
from ..distributed.plan import for_batch_job
from ..distributed.rundir import RunDir
from .script import SIGNAL_DEFAULT, SlurmOptionError, sbatch_script
from .state import NEVER_STARTS, JobState, parse_job
from .standalone import export  # noqa: F401  (part of this module's interface)
from ..distributed.tracebacks import error_line, with_user_source

__all__ = ["submit", "attach", "export", "JobHandle", "JobState", "SlurmError", "SlurmJobError",
           "SlurmOptionError"]

_DRY_RUN_HINT = ("to see the batch script without submitting: nbtrain.slurm.submit(recipe, config, dry_run=True) "
                 "(or %%nbtrain --slurm-dry-run), or write it with nbtrain.slurm.export(recipe, config, folder)")


class SlurmError(RuntimeError):
    """SLURM is missing, or refused the job."""


class SlurmJobError(RuntimeError):
    """The job ended without completing: its state, and the failing rank's traceback when one was written."""

    def __init__(self, message: str, state: "JobState", rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.state, self.rank, self.traceback = state, rank, traceback


def project_dir() -> Path:
    """The project-local `.nbtrain/` folder (private), next to the notebook."""
    path = Path.cwd() / ".nbtrain"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def submit(recipe, config: TrainConfig, *, job_name: str = "nbtrain", dry_run: bool = False,
           run_root: str | os.PathLike | None = None, python: str | None = None,
           requeue_signal: str | None = SIGNAL_DEFAULT, socket_ifname: str | None = "auto",
           log: MetricsLog | None = None, **sbatch_options):
    """Submit `recipe` trained with `config` (num_nodes x devices) as a batch job; return its JobHandle.

    sbatch_options become sbatch long options: partition="gpu" -> --partition=gpu,
    exclusive=True -> --exclusive. dry_run=True returns the script text and submits nothing.
    """
    python = python or sys.executable
    root = Path(run_root) if run_root is not None else Path.cwd() / ".nbtrain" / "runs"
    plan = for_batch_job(config)
    if dry_run:
        return sbatch_script(plan, str(root / "nbtrain-run-XXXXXXXX"), python=python, job_name=job_name,
                             options=sbatch_options, requeue_signal=requeue_signal, socket_ifname=socket_ifname)
    # Refuse bad options before touching SLURM or the disk.
    sbatch_script(plan, str(root), python=python, job_name=job_name, options=sbatch_options,
                  requeue_signal=requeue_signal, socket_ifname=socket_ifname)
    sbatch = _require("sbatch")
    target = partition_inventory(sbatch_options.get("partition"))
    if target is not None:  # the partition's nodes run it, not this login node
        check_runnable(config, target)
    if run_root is None:
        project_dir()  # private .nbtrain/ first, so runs/ inherits nothing looser
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    run = RunDir.create(plan, config=config, recipe=recipe, parent=str(root))
    script = run.path / "job.sbatch"
    script.write_text(sbatch_script(plan, str(run.path), python=python, job_name=job_name,
                                    options=sbatch_options, requeue_signal=requeue_signal,
                                    socket_ifname=socket_ifname))
    try:
        done = _slurm([sbatch, "--parsable", str(script)])
    except SlurmError:
        run.remove()
        raise
    if done.returncode != 0:
        run.remove()
        raise SlurmError(f"sbatch rejected the job (exit {done.returncode}):\n{done.stderr.strip()}")
    job_id = done.stdout.strip().split(";")[0]
    _remember(job_id, run.path, job_name)
    return JobHandle(job_id, run.path, job_name=job_name, model=recipe.model, log=log)


def attach(job_id, *, model=None, log: MetricsLog | None = None) -> "JobHandle":
    """A handle on a job submitted earlier from this project (by any kernel). `model` gets the weights;
    without it, the model shipped with the job is rebuilt from its run directory."""
    record = _records().get(str(job_id))
    if record is None:
        known = ", ".join(sorted(_records(), key=int)[-5:]) or "none"
        raise SlurmError(f"job {job_id} was not submitted from this project ({Path.cwd()}); "
                         f"known jobs: {known}")
    return JobHandle(str(job_id), record["run_dir"], job_name=record["job_name"], model=model, log=log)


class JobHandle:
    """A submitted job: live state, rank 0's events replayed into `log`, the weights at the end."""

    def __init__(self, job_id: str, run_dir, *, job_name: str, model=None, log: MetricsLog | None = None,
                 poll_s: float = 0.5):
        self.job_id, self.job_name, self.poll_s = str(job_id), job_name, poll_s
        self.run = RunDir(run_dir)
        self.log = log if log is not None else MetricsLog()
        self._model = model
        self._replay = self.run.tail_events()
        self._output_offset = 0
        self._state = JobState("PENDING", "submitted")

    def __repr__(self) -> str:
        return f"<nbtrain SLURM job {self.job_id} {self.job_name!r}: {self._state}>"

    @property
    def state(self) -> JobState:
        return self.poll()

    @property
    def output_path(self) -> Path:
        return self.run.path / f"slurm-{self.job_id}.out"

    def output(self) -> str:
        """The job's output so far (every node's torchrun agent and worker output)."""
        path = self.output_path
        return path.read_text(errors="replace") if path.exists() else ""

    def poll(self) -> JobState:
        """Ask SLURM for the job's state once, and replay rank 0's new events into `log`."""
        self._state = self._query()
        for event in self._replay():
            self.log.emit(event)
        return self._state

    def wait(self, timeout: float | None = None, echo: bool = True, on_state=None) -> RunResult:
        """Follow the job to its end; load the trained weights; the RunResult, or SlurmJobError.

        echo: print the job's output as it grows. on_state(JobState): called on every change
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
                time.sleep(self.poll_s)
        except KeyboardInterrupt:
            self.cancel()
            raise KeyboardInterrupt(f"interrupted: SLURM job {self.job_id} was cancelled") from None
        self._echo(echo)
        return self._finish()

    def cancel(self) -> None:
        """scancel the job (every node's processes end; nothing is loaded)."""
        done = _slurm([_require("scancel"), self.job_id])
        if done.returncode != 0:
            raise SlurmError(f"scancel {self.job_id} failed: {done.stderr.strip()}")

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
        config = self.run.config()
        if state.state == "COMPLETED" and saved is not None:
            weights = self.run.load_model()
            if weights is not None:
                self.model.load_state_dict(weights)
            result = gathered_result(config, self.log, saved, "completed")
            result.extras.update(job_id=self.job_id, run_dir=str(self.run.path), slurm_state=str(state))
            return result
        errors = self.run.errors()
        if errors:
            rank, text = errors[0]  # the earliest written: the root cause, not a peer's broken pipe
            text = with_user_source(text)  # notebook frames get their cell's source lines
            error = SlurmJobError(f"SLURM job {self.job_id} {state}: rank {rank} raised {error_line(text)}\n\n"
                                  f"[rank {rank}] {text}", state, rank, text)
            error.nbtrain_part = self.run.error_part(rank)  # the recipe part that raised, as Recipe marks it
            raise error
        tail = "\n".join(self.output().splitlines()[-25:]) or "(no output)"
        raise SlurmJobError(f"SLURM job {self.job_id} {state}; the end of its output "
                            f"({self.output_path}):\n{tail}", state)

    def _query(self) -> JobState:
        done = _slurm([_require("scontrol"), "show", "job", "-o", self.job_id])
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:  # purged after MinJobAge: the run directory still knows
                why = "no longer listed by slurmctld; read from the run directory"
                if self.run.load_result() is not None:
                    return JobState("COMPLETED", why)
                return JobState("FAILED" if self.run.errors() else "GONE", why)
            raise SlurmError(f"scontrol show job {self.job_id} failed: {done.stderr.strip()}")
        return parse_job(done.stdout, self.job_id, self.job_name)

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
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    argv = [sinfo, "-h", "-o", "%G|%c"] + (["-p", str(partition)] if partition else [])
    try:
        done = _slurm(argv, timeout_s=20.0)
    except SlurmError:
        return None
    lines = [line.split("|") for line in done.stdout.splitlines() if "|" in line]
    if done.returncode != 0 or not lines:
        return None
    gpus = cores = 0
    for gres, cpus in lines:  # the best node of the partition: a job asks for what one node has
        count = sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres))
        gpus, cores = max(gpus, count), max(cores, int(cpus) if cpus.strip().isdigit() else 0)
    return Inventory(cuda_devices=gpus, cuda_bf16=bool(gpus), mps=False, cpu_cores=max(cores, 1))


_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def _slurm(argv: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """A SLURM client command; a controller that does not answer is an error, never a hang."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv[:2])} ...` got no answer from the SLURM controller in {timeout_s:g} s "
                         f"(is slurmctld up? `scontrol ping` tells)") from None


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


def _remember(job_id: str, run_dir: Path, job_name: str) -> None:
    records = _records()
    records[job_id] = {"run_dir": str(run_dir), "job_name": job_name, "submitted": time.time()}
    path = _records_path()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        json.dump(records, stream, indent=1)
    os.replace(tmp, path)
