"""DDP from the kernel: fresh worker processes, live metrics and output, weights back.

    fit_distributed(recipe, config)   the recipe on config.devices ranks (x num_nodes)
    launch(fn, nprocs=2, args=())     any function under DDP; rank 0's return value

Never fork the kernel: it may hold CUDA. A notebook's classes travel by cloudpickle in
the run directory (rundir.py), beside the run's launch plan (plan.py): every decision about
how the ranks start is made once, there, and the ranks read nothing else about it. On one
machine the ranks are forked from a warm zygote; across machines each node runs torchrun; a Ray
cluster runs them as actors: the plan names the launcher (launchers/), and this module drives
any of them through one contract (launchers/base.py): it replays rank 0's events into the kernel's
MetricsLog as they are written, prints every rank's output with a `[rank N]` prefix, and a failing
rank, an interrupt or a collective timeout stops all of them.
"""
from __future__ import annotations

import time

from . import launchers
from ..engine import fsdp
from ..config import TrainConfig
from .launchers.base import supervise
from .launchers.local import LocalTarget
from ..metrics import MetricsLog
from . import carry, plan as plans
from ..recipe import Recipe
from ..records import start_info
from ..runs.result import RunResult, summarize
from .rundir import RunDir


def fit_distributed(recipe: Recipe, config: TrainConfig, log: MetricsLog | None = None, *,
                    timeout: float | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
                    host: str | None = None, echo: bool = True, stop=None, engine=None, first=None,
                    target=None) -> RunResult:
    """Train `recipe` with `config` as DDP (or FSDP) in fresh processes; its model gets the trained weights.

    engine: the kernel's live engine of `recipe.model` (DDP only): the ranks continue its optimizer,
    schedule, position and random numbers, and it continues from theirs once the run completes, as
    the model does from their weights (carry.py).
    first: a carry.FirstCall where the kernel holds no engine of the model yet: the ranks start from its seed and
    random numbers, and the kernel's engine is made once they completed, continuing from theirs.

    The launch options come from the config (timeout, node_rank, rdzv_endpoint, rdzv_host);
    the keywords, when given, override them:
    timeout: seconds a rank may wait in one collective before the run fails (default 1800).
    num_nodes > 1: node_rank and rdzv_endpoint ("host:port" of the c10d rendezvous; env
    NBTRAIN_NODE_RANK / NBTRAIN_RDZV_ENDPOINT otherwise) — run the same call on every node.
    c10d hands out global ranks in order of arrival; node_rank names this node's output.
    host (rdzv_host): where one machine's ranks meet (127.0.0.1 unless set), or this node's
    address among several.
    stop: a threading.Event; once set (from any thread), every rank stops after the same optimizer
    step and the weights trained so far come back, as when a run completes.
    target: where the ranks run (launchers.launcher_for(config), with its options), already checked by
    nbtrain.fit; None: the config's launcher with no options, unchecked here (the ranks' engines check it).
    """
    __tracebackhide__ = True
    target = target if target is not None else launchers.launcher_for(config)
    started = False
    try:
        if config.strategy == "fsdp":
            fsdp.check_shardable(recipe.model)  # before any process starts
        plan = target.plan(config, timeout=timeout, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, host=host)
        log = log if log is not None else MetricsLog()
        run = RunDir.create(plan, config=config, recipe=recipe,
                            engine_state=carry.sent(engine) if engine is not None else
                            first.state if first is not None else None)
    except BaseException:
        target.release()
        raise
    began = []  # when rank 0's run began, on this process's clock: its "start" event's arrival
    def note_start(event, _log):
        if event["type"] == "start" and not began:
            began.append(time.perf_counter())
    log.subscribe(note_start)
    try:
        job = target.start(run, plan, shipped=(recipe,))
        started = True
        status, error = supervise(job, log, echo, stop)
        if error is not None:
            raise error
        state = run.load_model() if status == "completed" else None
        notes = [carry.FSDP_NOTE] if config.strategy == "fsdp" else []
        notes += [target.checked] if target.checked else []
        if state is not None:
            recipe.model.load_state_dict(state)
            if engine is None and first is not None:
                engine = first.make()  # the kernel's live engine, from now on, continuing the ranks' run
            if engine is not None:
                notes += carry.bring_back(engine, run.load_engine_state())
        result = gathered_result(config, log, run.load_result(), status)
        if notes:
            result.summary = result.summary.with_notes(notes)
        # What the kernel's model holds now, for front-ends that speak of it (the workers' weights come
        # back only from a run that completed).
        result.extras["weights_loaded"] = state is not None
        if began:  # starting the ranks is the call's start-up, not "other" (nbtrain.fit's time split)
            result.extras["run_began"] = began[0]
        return result
    finally:
        if not started:
            target.release()
        log.unsubscribe(note_start)
        run.remove()


def launch(fn, nprocs: int = 2, args=(), *, timeout: float | None = None, backend: str | None = None,
           host: str = "127.0.0.1", echo: bool = True):
    """Run `fn(*args)` on `nprocs` fresh processes in one process group; return rank 0's value."""
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function, got {type(fn).__name__}")
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"launch: nprocs={nprocs!r}: allowed: a whole number >= 1")
    if backend is not None and backend not in plans.BACKENDS:
        raise ValueError(f"launch: backend={backend!r}: allowed: gloo, nccl or None (nccl with CUDA, else gloo)")
    plan = plans.for_function(nprocs, timeout=timeout, backend=backend, host=host)
    run = RunDir.create(plan, function=fn, args=args)
    try:
        job = LocalTarget().start(run, plan, shipped=(fn, args))
        status, error = supervise(job, MetricsLog(), echo)
        if error is not None:
            raise error
        if status != "completed":
            raise KeyboardInterrupt(f"launch interrupted; all {nprocs} processes were stopped")
        return run.load_return()
    finally:
        run.remove()


def gathered_result(config: TrainConfig, log: MetricsLog, saved: dict | None, status: str) -> RunResult:
    """The RunResult of a run the ranks trained: rank 0's saved result, else its end event, else a summary
    of the history the kernel received (a run stopped before its ranks reported: no `run_steps` then)."""
    end = log.last("end")
    if saved is not None and status == "completed":
        return RunResult(config, log, saved["summary"], saved["status"], saved["message"])
    if end is not None and status == "completed":
        return RunResult(config, log, end["summary"], end["status"], end.get("message", ""))
    info = dict(vars(start_info(log)))  # a copy of the record's fields, to add the summary's own to
    info.update(status=status, epochs_trained=float("nan"))
    message = (f"interrupted; the history up to step {log.columns['step'][-1] if len(log) else 0} is kept; the "
               "model keeps its weights from before the run (the workers were stopped, and a DDP run's training "
               "comes back into the model only when the run completes)")
    return RunResult(config, log, summarize(log, info), status, message)

