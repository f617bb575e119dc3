"""DDP from the kernel: fresh worker processes, live metrics and output, weights back.

    fit_distributed(recipe, config)   the recipe on config.devices ranks (x num_nodes)
    launch(fn, nprocs=2, args=())     any function under DDP; rank 0's return value

Never fork the kernel: it may hold CUDA. A notebook's classes travel by cloudpickle in
the run directory (rundir.py), beside the run's launch plan (plan.py): every decision about
how the ranks start is made once, there, and the ranks read nothing else about it. On one
machine the ranks are forked from a warm zygote, a fresh interpreter that imported torch
and never touched CUDA (pool.py, zygote.py), and join through a TCPStore the launcher
binds to 127.0.0.1 on a free port (the plan names it), so two runs
never collide. Across machines each node runs torch.distributed.run with a c10d
rendezvous. The launcher replays rank 0's events into the kernel's MetricsLog as they
are written, prints every rank's output with a `[rank N]` prefix, and owns the workers'
lifetime: a failing rank, an interrupt or a collective timeout stops all of them.
"""
from __future__ import annotations

import re
import signal
import socket
import sys
import time
from datetime import timedelta

from ..engine import fsdp
from ..config import TrainConfig
from ..metrics import MetricsLog
from . import carry, plan as plans
from .plan import LaunchPlan
from .pool import ZYGOTE, FileTail, ForkRefused, Relay, start, start_rank, terminate, worker_env
from ..recipe import Recipe
from ..records import start_info
from ..runs.result import RunResult, summarize
from .rundir import RunDir
from .tracebacks import error_line, with_user_source

_PEER_SYMPTOM = re.compile(r"connection (closed|reset) by peer|connectFullMesh failed", re.I)


class WorkerError(RuntimeError):
    """A rank failed: raised, was killed by a signal, or timed out in a collective."""

    def __init__(self, message: str, rank: int | None = None, traceback: str = "", signal_name: str | None = None):
        super().__init__(message)
        self.rank, self.traceback, self.signal_name = rank, traceback, signal_name
        self.pids: list[int] = []


def fit_distributed(recipe: Recipe, config: TrainConfig, log: MetricsLog | None = None, *,
                    timeout: float | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
                    host: str | None = None, echo: bool = True, stop=None, engine=None) -> RunResult:
    """Train `recipe` with `config` as DDP (or FSDP) in fresh processes; its model gets the trained weights.

    engine: the kernel's live engine of `recipe.model` (DDP only): the ranks continue its optimizer,
    schedule, position and random numbers, and it continues from theirs once the run completes, as
    the model does from their weights (carry.py).

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
    """
    __tracebackhide__ = True
    if config.strategy == "fsdp":
        fsdp.check_shardable(recipe.model)  # before any process starts
    plan = plans.for_fit(config, timeout=timeout, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, host=host)
    log = log if log is not None else MetricsLog()
    run = RunDir.create(plan, config=config, recipe=recipe,
                        engine_state=carry.sent(engine) if engine is not None else None)
    try:
        job = _start_torchrun(run, plan) if plan.nodes > 1 else _start_local(run, plan)
        job.shipped = (recipe,)
        status, error = job.supervise(log, echo, stop)
        if error is not None:
            raise error
        state = run.load_model() if status == "completed" else None
        notes = [carry.FSDP_NOTE] if config.strategy == "fsdp" else []
        if state is not None:
            recipe.model.load_state_dict(state)
            if engine is not None:
                notes += carry.bring_back(engine, run.load_engine_state())
        result = gathered_result(config, log, run.load_result(), status)
        if notes:
            result.summary = result.summary.with_notes(notes)
        # What the kernel's model holds now, for front-ends that speak of it (the workers' weights come
        # back only from a run that completed).
        result.extras["weights_loaded"] = state is not None
        return result
    finally:
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
        job = _start_local(run, plan)
        job.shipped = (fn, args)
        status, error = job.supervise(MetricsLog(), echo)
        if error is not None:
            raise error
        if status != "completed":
            raise KeyboardInterrupt(f"launch interrupted; all {nprocs} processes were stopped")
        return run.load_return()
    finally:
        run.remove()


# --- starting ------------------------------------------------------------------------------

def _start_local(run: RunDir, plan: LaunchPlan) -> "_Job":
    """The plan's ranks forked by the warm zygote, joined by a store bound to its host on a free port."""
    import torch.distributed as torch_dist
    host, nprocs = plan.host, plan.procs_per_node
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
    except OSError as error:
        listener.close()
        raise ValueError(f"host={host!r}: allowed: an address of this machine for the ranks to meet at (default "
                         f"127.0.0.1); binding to it failed: {error}") from None
    listener.listen(128)
    # The port is known once bound: the plan says it before any rank starts (no port race).
    plan = plan.replace(store_port=listener.getsockname()[1])
    run.write_plan(plan)
    store = torch_dist.TCPStore(host, plan.store_port, nprocs, True, timedelta(seconds=plan.timeout_s),
                                wait_for_workers=False, master_listen_fd=listener.detach())
    ranks, outputs = [], []
    try:
        for rank in range(nprocs):
            # Each rank's place in the world, as torchrun would set it; everything else is in the plan.
            env = worker_env(plan.threads_per_rank, {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nprocs),
                "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": "0", "MASTER_ADDR": host,
                "MASTER_PORT": str(plan.store_port)})
            out, err = str(run.path / f"rank{rank}.out"), str(run.path / f"rank{rank}.err")
            try:
                ranks.append(ZYGOTE.fork(str(run.path), rank, env, out, err))
            except ForkRefused as refused:
                sys.stderr.write(f"nbtrain: rank {rank} starts as a fresh interpreter (seconds slower): {refused}\n")
                ranks.append(start_rank(str(run.path), env, out, err))
            outputs += [(FileTail(out), f"[rank {rank}] ", False), (FileTail(err), f"[rank {rank}] ", True)]
    except BaseException:  # an interrupt while starting: no rank may outlive this call
        terminate(ranks)
        raise
    return _Job(run, plan, ranks, Relay(), ranks=list(range(nprocs)), keep=store, outputs=outputs)


def _start_torchrun(run: RunDir, plan: LaunchPlan) -> "_Job":
    """This node's part of a multi-node job: torch.distributed.run with a c10d rendezvous."""
    argv = ["-m", "nbtrain.distributed.worker", "--agent", str(run.path), f"--nnodes={plan.nodes}",
            f"--nproc-per-node={plan.procs_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={plan.rdzv_endpoint}", f"--rdzv-id={plan.rdzv_id}", "--max-restarts=0",
            f"--rdzv-conf=join_timeout={max(1, int(plan.timeout_s))}", "--monitor-interval=0.2"]
    if plan.host:
        argv.append(f"--local-addr={plan.host}")
    argv += ["-m", "nbtrain.distributed.worker", str(run.path)]
    agent = start(argv, worker_env(plan.threads_per_rank))
    relay = Relay()
    relay.follow(agent, "agent", f"[node {plan.node_rank}] ")
    return _Job(run, plan, [agent], relay, ranks=None)


# --- supervising ---------------------------------------------------------------------------

class _Job:
    """Running workers: replay events, print output, notice the first failure, stop everyone."""

    def __init__(self, run, plan, procs, relay, ranks, keep=None, outputs=()):
        self.run, self.plan, self.procs, self.relay, self.ranks = run, plan, procs, relay, ranks
        self.shipped = ()  # what the kernel sent, to find the source of the workers' frames
        self._keep = keep  # the store lives as long as the job
        self._outputs = list(outputs)  # (FileTail, prefix, is_err) of each rank's output file
        self._err_tail: list[str] = []

    def _show(self, echo: bool, final: bool = False) -> None:
        self.relay.show(echo)
        for tail, prefix, is_err in self._outputs:
            for line in (tail.rest() if final else tail.lines()):
                if is_err:
                    self._err_tail = (self._err_tail + [prefix + line])[-40:]
                if echo:
                    target = sys.stderr if is_err else sys.stdout
                    target.write(prefix + line)
                    target.flush()

    def supervise(self, log: MetricsLog, echo: bool, stop=None):
        __tracebackhide__ = True
        replay = self.run.tail_events()
        status, error = "completed", None
        try:
            while True:
                if stop is not None and stop.is_set():  # the ranks vote on it at their next log window
                    self.run.request_stop()
                    stop = None
                self._show(echo)
                for event in replay():
                    log.emit(event)
                codes = [p.poll() for p in self.procs]
                if any(c not in (None, 0) for c in codes):
                    status, error = "failed", self._diagnose(codes)
                    break
                if all(c == 0 for c in codes):
                    break
                time.sleep(0.05)
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            terminate(self.procs)
            self.relay.finish(echo)
            self._show(echo, final=True)
            for event in replay():
                log.emit(event)
            self._keep = None
        if error is not None:
            error.pids = [p.pid for p in self.procs]
        return status, error

    def _diagnose(self, codes) -> WorkerError:
        """The root cause: a rank killed by a signal, else the first traceback written."""
        time.sleep(0.2)  # a rank's peers fail a moment after it; let its own report land
        codes = [p.poll() if c is None else c for p, c in zip(self.procs, codes)]
        if self.ranks is not None:
            for rank, code in zip(self.ranks, codes):
                if code is not None and code < 0:
                    return _signal_error(rank, -code)
        # A peer's "connection closed" can land before the root cause is written: the cause goes first.
        errors = sorted(self.run.errors(), key=lambda found: bool(_PEER_SYMPTOM.search(found[1])))
        if errors:
            rank, text = errors[0]
            error = _raised_error(rank, text, self.plan.timeout_s, self.shipped)
            error.nbtrain_part = self.run.error_part(rank)  # the recipe part that raised, as Recipe marks it
            return error
        tail = "".join(self._err_tail + [line for lines in self.relay.tails.values() for line in lines])
        found = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", tail, re.S)
        if found and int(found.group(2)) < 0:
            return _signal_error(int(found.group(1)), -int(found.group(2)))
        which = [r for r, c in zip(self.ranks or ["launcher"], codes) if c not in (None, 0)]
        return WorkerError(f"{'rank ' if self.ranks else ''}{which[0]} exited with code "
                           f"{[c for c in codes if c not in (None, 0)][0]}; its last output:\n{tail}")


def _signal_error(rank: int, number: int) -> WorkerError:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return WorkerError(f"rank {rank} was killed by {name}; the other ranks were stopped", rank=rank,
                       signal_name=name)


def _raised_error(rank: int, text: str, timeout_s: float, shipped) -> WorkerError:
    text = with_user_source(text, shipped)
    last = error_line(text)
    if re.search(r"timed? ?out|timeout", last, re.I) and re.search(r"gloo|nccl|c10d|collective|store|wait", text, re.I):
        head = (f"rank {rank} timed out after {timeout_s:g} s waiting in a collective operation: another rank is "
                f"stuck or too slow (raise timeout= if that much waiting is expected)")
    elif re.search(r"connection (closed|reset) by peer", last, re.I):
        head = (f"rank {rank} lost its connection to another rank, which failed or was stopped first (on another "
                f"node, that node's launcher reports why)")
    else:
        head = f"rank {rank} raised {last}"
    return WorkerError(f"{head}\n\n[rank {rank}] {text}", rank=rank, traceback=text)


def gathered_result(config: TrainConfig, log: MetricsLog, saved: dict | None, status: str) -> RunResult:
    """The RunResult of a run the ranks trained: rank 0's saved result, else its end event, else a summary
    of the history the kernel received (a run stopped before its ranks reported: no `run_steps` then)."""
    end = log.last("end")
    if saved is not None and status == "completed":
        return RunResult(config, log, saved["summary"], saved["status"], saved["message"])
    if end is not None and status == "completed":
        return RunResult(config, log, end["summary"], end["status"], end.get("message", ""))
    info = dict(start_info(log))
    info.update(status=status, epochs_trained=float("nan"))
    message = (f"interrupted; the history up to step {log.columns['step'][-1] if len(log) else 0} is kept; the "
               "model keeps its weights from before the run (the workers were stopped, and a DDP run's training "
               "comes back into the model only when the run completes)")
    return RunResult(config, log, summarize(log, info), status, message)

