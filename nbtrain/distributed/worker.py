"""One DDP rank: `python -m nbtrain.distributed.worker RUN_DIR`, run under torch.distributed.run.

The worker reads its run directory (see rundir.py) — how it was launched only from the
run's plan (launch.json, plan.py), its own place in the world from what torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) — joins the process group, builds
an Engine on the shipped recipe and config and continues the kernel's live engine (carry.py)
— the engine wraps the model in DDP (or shards it with FSDP), shards the data and skips the
gradient reduction on accumulation micro-steps — trains, and writes the events, the full
weights, the engine state for the kernel to continue from, every rank's peak memory and the
result back. A rank that raises writes its traceback to error-rank{N}.txt and exits 1, so the
launcher can report that rank's own error.

On one machine the kernel's warm zygote (zygote.py) forks the ranks and calls `run_job`
with the same environment, skipping the interpreter start and the torch import.

Either way a watchdog thread ends the process when the plan's owner (the kernel) is gone.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import sys
import threading
import time

import psutil
import torch
import torch.distributed as torch_dist

from .. import hardware
from ..engine import fsdp
from . import carry, requeue
from ..engine.engine import Engine
from ..metrics import MetricsLog
from .plan import LaunchPlan, started_since_boot
from .rundir import RunDir
from .tracebacks import user_traceback

OWNER_GONE_EXIT = 70


# A pid reused within half a second of its owner's start is not a real risk; a tolerance this wide
# keeps a clock step between the two reads inside started_since_boot from ending a healthy run.
_SAME_START_S = 0.5


def owner_alive(pid: int, started: float | None = None) -> bool:
    """Whether `pid` (started at `started` seconds since boot, when given) still runs."""
    try:
        owner = psutil.Process(pid)
        return owner.is_running() and owner.status() != psutil.STATUS_ZOMBIE and (
            started is None or abs(started_since_boot(owner) - started) < _SAME_START_S)
    except psutil.Error:
        return False


def watch_owner(pid: int, started: float | None, every_s: float = 0.5, run_dir: str | None = None) -> None:
    """Exit this process soon after `pid` stops existing (a thread polls it), removing `run_dir`,
    which the dead owner can no longer remove."""
    def watch():
        misses = 0
        while misses < 2:  # gone on two reads in a row: one odd read of /proc must not end a healthy run
            misses = 0 if owner_alive(pid, started) else misses + 1
            time.sleep(every_s)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)  # files only: safe even mid-collective
        os._exit(OWNER_GONE_EXIT)  # no other cleanup: the process group may be mid-collective

    threading.Thread(target=watch, name="nbtrain-owner-watch", daemon=True).start()


class _PrefixedStream:
    """Prefixes every line with `[rank N] `, for output that torchrun merges into one stream."""

    def __init__(self, stream, prefix: str):
        self._stream, self._prefix, self._at_line_start = stream, prefix, True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                out.append(self._prefix)
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _join_group(plan: LaunchPlan) -> None:
    backend, timeout = plan.backend, datetime.timedelta(seconds=plan.timeout_s)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if plan.store_port is not None:  # the launcher hosts the store on a port it bound itself: no port race
        store = torch_dist.TCPStore(plan.host, plan.store_port, size, is_master=False, timeout=timeout)
        torch_dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    else:  # torchrun's rendezvous set MASTER_ADDR / MASTER_PORT
        torch_dist.init_process_group(backend, timeout=timeout)
    # init_process_group returns on a rank once its own side of the mesh is up (torch has no join
    # barrier): a rank with a quick job would finish and close its sockets while a slower peer is
    # still connecting, which then fails with "connectFullMesh failed ... Connection closed by peer".
    # No rank goes on before every rank has joined.
    torch_dist.barrier(device_ids=[torch.cuda.current_device()] if backend == "nccl" else None)


def _train(run: RunDir, local_main: bool) -> None:
    config, recipe = run.config(), run.recipe()
    resume = requeue.resume_from(run.path)
    if resume is not None:  # a requeued SLURM job continues from its checkpoint
        config = config.replace(resume=str(resume))
    with hardware.assume(rank_share(hardware.inventory(), config)):
        engine = Engine(recipe, config)
    carried = run.engine_state()  # the kernel's live engine: this run continues it
    if carried is not None:
        carry.take_up(engine, carried)
    engine.check_schedule()
    log = MetricsLog()
    writer = run.event_writer() if local_main else None
    if writer:
        log.subscribe(writer)
    watch = log.subscribe(requeue.RequeueWatch(engine, run.path))
    result = engine.run(log=log)
    if watch.requested and result.status == requeue.STOP_REASON:
        if int(os.environ.get("RANK", 0)) == 0:
            requeue.save(engine, run.path)
        torch_dist.barrier()  # every rank returns knowing the checkpoint is saved (the job's requeue follows)
        if writer:
            writer.close()
        return
    # Every rank's own peak, so a sharded run shows what each process needed.
    peaks = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(peaks, result.summary.peak_mem_mb)
    result.summary = result.summary.replace(peak_mem_mb_per_rank=tuple(peaks))
    # A sharded model's full weights are gathered from every rank (a collective); the first
    # rank of each node hands them to its kernel.
    one_node = int(os.environ.get("LOCAL_WORLD_SIZE", -1)) == torch_dist.get_world_size()
    if fsdp.is_sharded(engine.model) or local_main:
        state = fsdp.full_state_dict(engine.model, everyone=not one_node)
    back = carry.gathered(engine) if carried is not None else None  # a collective, as the gathers above
    if local_main:
        if back is not None:
            run.save_engine_state(back)
        run.save_model(state)
        run.save_result(result.status, result.message, result.summary.to_dict())
        writer.close()


def rank_share(found: hardware.Inventory, config) -> hardware.Inventory:
    """What one rank checks of its machine: its device type and precision; how many ranks the target runs (a Ray
    cluster's actors, a partition's nodes) was checked by the target itself, where the run was started."""
    return dataclasses.replace(found, cpu_cores=max(found.cpu_cores, config.devices),
                               cuda_devices=max(found.cuda_devices, config.devices) if found.cuda_devices else 0)


def _threads(plan: LaunchPlan) -> int | None:
    # A batch job's plan leaves it to the script, which sets OMP_NUM_THREADS from the node's allocation.
    if plan.threads_per_rank is not None:
        return plan.threads_per_rank
    return int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS") else None


def run_job(run: RunDir) -> int:
    plan = run.plan()
    if plan.owner_pid is not None:  # a SLURM job has no owner: it outlives the kernel
        watch_owner(plan.owner_pid, plan.owner_started, run_dir=str(run.path))
    rank = int(os.environ.get("RANK", 0))
    if plan.prefix_output:  # torchrun merges the ranks' output into one stream
        sys.stdout = _PrefixedStream(sys.stdout, f"[rank {rank}] ")
        sys.stderr = _PrefixedStream(sys.stderr, f"[rank {rank}] ")
    threads = _threads(plan)
    if threads:
        torch.set_num_threads(threads)
    try:
        _join_group(plan)
        if run.is_function_run:
            fn, args = run.function()
            value = fn(*args)
            if rank == 0:
                run.save_return(value)
        else:
            _train(run, local_main=plan.writes_outputs(rank, int(os.environ.get("LOCAL_RANK", 0))))
        torch_dist.destroy_process_group()
        return 0
    except BaseException as exc:  # every failure, KeyboardInterrupt included, is reported as this rank's
        # The launcher reports it, once, from the root cause; with the recipe part that raised, if one did.
        run.save_error(rank, user_traceback(exc), getattr(exc, "nbtrain_part", None))
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--agent"]:  # `--agent RUN_DIR ARGS`: torch.distributed.run for one node, ended with the kernel
        plan = RunDir(argv[1]).plan()
        if plan.owner_pid is not None:
            watch_owner(plan.owner_pid, plan.owner_started)
        from torch.distributed.run import main as torchrun
        torchrun(argv[2:])
        return 0
    if len(argv) != 1:
        sys.stderr.write("usage: python -m nbtrain.distributed.worker RUN_DIR  (under torch.distributed.run)\n")
        return 2
    return run_job(RunDir(argv[0]))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a dead peer's sockets must not stall exit
