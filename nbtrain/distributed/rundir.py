"""The run directory: everything a launcher and its workers exchange, as plain files.

One private (0700) temporary directory per run. The launcher (in the kernel, or a SLURM
submission) writes the inputs; workers (`python -m nbtrain.distributed.worker RUN_DIR`, one per rank)
read them and write the outputs. Nothing else passes between them, so the same contract
serves torchrun on this machine, two launchers on two machines, and a batch scheduler.

Inputs, written by the launcher before any worker starts:

    config.json     TrainConfig.to_record() of the run (values, options given)  (fit runs)
    recipe.pkl      cloudpickle of the Recipe; classes and functions     (fit runs)
                    defined in a notebook (__main__) travel by value
    engine-in.pt    the kernel's live engine state the ranks continue from (carry.py): optimizer,
                    schedule, scaler, position, random numbers; no weights  (fit runs, but fsdp)
    function.pkl    cloudpickle of (fn, args) for `nbtrain.launch`       (launch runs)
    launch.json     the run's LaunchPlan (plan.py): backend, world, threads, timeout,
                    rendezvous, output policy, owner, store port; the only thing the
                    workers read about how they were launched

Outputs:

    events.jsonl    one MetricsLog event per line, flushed as emitted, written by the
                    node's local rank 0 (global rank 0 on one machine); the launcher
                    tails it and replays every event into its own MetricsLog
    model.pt        the trained state_dict of the unwrapped model      (fit, local rank 0)
    engine-out.pt   the ranks' engine state the kernel's engine continues from (carry.py; fit runs
                    given engine-in.pt, local rank 0)
    return.pkl      cloudpickle of fn's return value                   (launch, rank 0)
    result.json     {"status", "message", "summary"} once the run ended (local rank 0)
    error-rank{N}.txt  the formatted traceback when rank N raised (user frames only)
    error-rank{N}.part the recipe part that raised there (loss_fn, training_step, ...), when one did:
                    the kernel says beside the error where that part came from (written first)
    rank{N}.out, rank{N}.err  rank N's stdout and stderr when the kernel's zygote started
                    it (under torchrun they go to the agent's streams, prefixed `[rank N]`)

A file appears whole: outputs are written to a temporary name and renamed.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import cloudpickle

from .plan import LaunchPlan

CONFIG, RECIPE, FUNCTION, LAUNCH = "config.json", "recipe.pkl", "function.pkl", "launch.json"
EVENTS, MODEL, RETURN, RESULT = "events.jsonl", "model.pt", "return.pkl", "result.json"
ENGINE_IN, ENGINE_OUT = "engine-in.pt", "engine-out.pt"
INPUTS = (LAUNCH, CONFIG, RECIPE, ENGINE_IN, FUNCTION)  # what a launcher writes before any worker starts
OUTPUTS = (MODEL, ENGINE_OUT, RETURN, RESULT)  # what the writing rank leaves once the run completed


class RunDir:
    def __init__(self, path):
        self.path = Path(path)

    # --- creating (launcher side) ---------------------------------------------------------

    @classmethod
    def create(cls, plan: LaunchPlan | None = None, *, config=None, recipe=None, function=None, args=(),
               engine_state: dict | None = None, parent: str | None = None, **plan_fields) -> "RunDir":
        """A new private run directory holding a fit run (config + recipe, and the `engine_state` its ranks
        continue from) or a function run, and its launch plan (`plan`, or one made of `plan_fields` where
        a caller needs only the files)."""
        path = tempfile.mkdtemp(prefix="nbtrain-run-", dir=parent)  # mkdtemp makes it 0700
        run = cls(path)
        try:
            run.write_plan(plan if plan is not None else LaunchPlan(**plan_fields))
            if recipe is not None:
                run._write_json(CONFIG, config.to_record())
                run._write_bytes(RECIPE, _pickled(recipe, "the recipe (model, data, loss, optimizer)"))
                if engine_state is not None:
                    run._write_bytes(ENGINE_IN, _saved(engine_state))
            if function is not None:
                run._write_bytes(FUNCTION, _pickled((function, tuple(args)), "fn and args"))
        except BaseException:
            run.remove()  # a run that cannot start leaves no folder behind
            raise
        return run

    def files(self, names) -> dict[str, bytes]:
        """The named files of this run directory that exist, as bytes (to send a run to another machine, or
        to bring its outputs back)."""
        return {name: (self.path / name).read_bytes() for name in names if (self.path / name).exists()}

    def write_files(self, files: dict[str, bytes]) -> None:
        """Files another copy of this run directory holds, written here whole (`files`' order kept)."""
        for name, data in files.items():
            self._write_bytes(name, data)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    # --- reading inputs (worker side) -----------------------------------------------------

    @property
    def is_function_run(self) -> bool:
        return (self.path / FUNCTION).exists()

    def plan(self) -> LaunchPlan:
        return LaunchPlan.from_json((self.path / LAUNCH).read_text())

    def write_plan(self, plan: LaunchPlan) -> None:
        """Written before any worker starts; rewritten only before then (the store port, once bound)."""
        self._write_bytes(LAUNCH, plan.to_json().encode())

    def config(self):
        from ..config import TrainConfig
        return TrainConfig.from_record(json.loads((self.path / CONFIG).read_text()))

    def recipe(self):
        recipe = cloudpickle.loads(self._private_bytes(RECIPE))
        if _wraps_steps(recipe.scheduler):  # an instance, shipped with its optimizer
            track_optimizer_steps(recipe.scheduler.optimizer)
        return recipe

    def engine_state(self) -> dict | None:
        """The kernel's engine state this run's ranks continue from, or None (none was sent)."""
        return _loaded(self._private_bytes(ENGINE_IN)) if (self.path / ENGINE_IN).exists() else None

    def function(self):
        return cloudpickle.loads(self._private_bytes(FUNCTION))

    def _private_bytes(self, name: str) -> bytes:
        """A pickle's bytes, only from a folder and file this user owns and nobody else can write:
        unpickling runs code, so a run directory someone else could change is refused."""
        for path in (self.path, self.path / name):
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                raise PermissionError(f"refusing to load {name} from {self.path}: a run directory and its files must "
                                      f"be owned by uid {os.getuid()}, writable by no one else, and not symlinks; "
                                      f"{path.name} is {oct(stat.S_IMODE(info.st_mode))}, uid {info.st_uid}")
        return (self.path / name).read_bytes()

    # --- outputs --------------------------------------------------------------------------

    def event_writer(self):
        """A MetricsLog view appending each event to events.jsonl, flushed at once."""
        stream = open(self.path / EVENTS, "a", encoding="utf-8")

        def write(event, _log):
            stream.write(json.dumps(event) + "\n")
            stream.flush()

        write.close = stream.close
        return write

    def request_stop(self) -> None:
        """Ask every rank to stop after the same optimizer step (requeue.py's watch votes on it)."""
        from .requeue import STOP_REQUESTED
        (self.path / STOP_REQUESTED).touch(mode=0o600)

    def tail_events(self):
        """An iterator factory: each call of the returned function yields the events added since."""
        state = {"offset": 0, "rest": ""}
        path = self.path / EVENTS

        def new_events() -> list[dict]:
            try:
                with open(path, encoding="utf-8") as stream:
                    stream.seek(state["offset"])
                    chunk = stream.read()
                    state["offset"] = stream.tell()
            except FileNotFoundError:
                return []
            text = state["rest"] + chunk
            lines = text.split("\n")
            state["rest"] = lines.pop()  # an unfinished line waits for its end
            return [json.loads(line) for line in lines if line]

        return new_events

    def save_model(self, state_dict) -> None:
        import torch
        tmp = self.path / (MODEL + ".tmp")
        torch.save(state_dict, tmp)
        os.replace(tmp, self.path / MODEL)

    def load_model(self):
        import torch
        path = self.path / MODEL
        return torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None

    def save_engine_state(self, state: dict) -> None:
        self._write_bytes(ENGINE_OUT, _saved(state))

    def load_engine_state(self) -> dict | None:
        """The ranks' engine state for the kernel's engine to continue from, or None (not written)."""
        return _loaded(self._private_bytes(ENGINE_OUT)) if (self.path / ENGINE_OUT).exists() else None

    def save_return(self, value) -> None:
        self._write_bytes(RETURN, cloudpickle.dumps(value))

    def load_return(self):
        return cloudpickle.loads((self.path / RETURN).read_bytes())

    def has_return(self) -> bool:
        return (self.path / RETURN).exists()

    def save_result(self, status: str, message: str, summary: dict | None) -> None:
        self._write_json(RESULT, {"status": status, "message": message, "summary": summary})

    def load_result(self) -> dict | None:
        path = self.path / RESULT
        return json.loads(path.read_text()) if path.exists() else None

    def save_error(self, rank: int, text: str, part: str | None = None) -> None:
        """Rank `rank`'s traceback; `part`: the recipe part that raised (the exception's `nbtrain_part`)."""
        if part:  # before the traceback, which is what the launcher waits for
            self._write_bytes(f"error-rank{rank}.part", part.encode())
        self._write_bytes(f"error-rank{rank}.txt", text.encode())

    def error_part(self, rank: int) -> str | None:
        """The recipe part that raised on rank `rank` (loss_fn, model, ...), or None."""
        path = self.path / f"error-rank{rank}.part"
        return path.read_text() if path.exists() else None

    def errors(self) -> list[tuple[int, str]]:
        """(rank, traceback text) of every rank that raised, the earliest written first."""
        found = sorted(self.path.glob("error-rank*.txt"), key=lambda p: p.stat().st_mtime_ns)
        return [(int(p.stem[len("error-rank"):]), p.read_text(errors="replace")) for p in found]

    # --- atomic writes --------------------------------------------------------------------

    def _write_bytes(self, name: str, data: bytes) -> None:
        tmp = self.path / (name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
        os.replace(tmp, self.path / name)

    def _write_json(self, name: str, value) -> None:
        self._write_bytes(name, json.dumps(value).encode())


class NotPicklableError(TypeError):
    """What the kernel would send to the workers does not pickle: bad input, said in one message.

    Its frames are nbtrain's and its way out is in the message, so in IPython (which shows
    `_render_traceback_` instead of the traceback) the message stands alone.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def _pickled(value, what: str) -> bytes:
    try:
        return cloudpickle.dumps(value)
    except Exception as error:  # pickle raises TypeError, PicklingError, AttributeError... for the same cause
        raise NotPicklableError(f"{what} cannot be sent to the worker processes: cloudpickle failed ({error}); allowed: "
                        "values that pickle (no open files, locks, sockets or generators): create those inside "
                        "the workers, e.g. in the dataset's __getitem__ or in fn") from None


def _saved(state: dict) -> bytes:
    import torch
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _loaded(data: bytes) -> dict:
    import torch
    # Random-number states hold numpy arrays and tuples, which weights_only refuses; the bytes come from
    # this user's private run directory (checked by _private_bytes), as the pickled recipe does.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _wraps_steps(scheduler) -> bool:
    """A scheduler instance whose construction wrapped its optimizer's step (all but ReduceLROnPlateau)."""
    import torch
    schedulers = torch.optim.lr_scheduler
    return isinstance(scheduler, schedulers.LRScheduler) and not isinstance(scheduler, schedulers.ReduceLROnPlateau)


def track_optimizer_steps(optimizer) -> None:
    """Put back the wrapper torch puts on an optimizer's step when a scheduler is built over it.

    torch counts optimizer.step calls through that wrapper, to warn a user whose scheduler steps
    first. An optimizer that travelled by pickle lost it (Optimizer.__getstate__ keeps its groups and
    state only) while its scheduler still expects it, so the scheduler's first step in a rank would warn
    that "optimizer.step() has been overridden after learning rate scheduler initialization", blaming
    the user for what the shipping did. A neutral scheduler built over the optimizer makes torch wrap
    its step again; the rates that scheduler sets on the way are put back.
    """
    import torch
    if "step" in vars(optimizer):  # wrapped already (an instance attribute over the class's step)
        return
    lrs = [(group["lr"], "initial_lr" in group) for group in optimizer.param_groups]
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    for group, (lr, had_initial) in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
        if not had_initial:
            group.pop("initial_lr")
