"""The warm start: one fresh interpreter that imported torch and forks each run's ranks.

`python -m nbtrain.distributed.zygote` is started by the kernel (never forked from it). It imports
torch, nbtrain and what a first optimizer step imports lazily, stays single-threaded and
never touches CUDA, so forking it is as safe as starting a new interpreter and costs
milliseconds instead of seconds. It checks that before every fork (torch's flag, and whether the
CUDA driver is loaded): were CUDA ever initialised here, it refuses, and the kernel starts that
rank as a fresh interpreter (slower, correct) and says why. Protocol on its stdin/stdout, one
JSON line each:

    kernel -> zygote   {"token": T, "run_dir": D, "env": {...}, "cwd": C, "sys_path": [...],
                        "stdout": F1, "stderr": F2}
    zygote -> kernel   {"started": T, "pid": P}      a rank is running
                       {"refused": T, "why": W}       CUDA is initialised here: start it fresh
                       {"exited": P, "code": C}      it ended (C < 0: killed by signal -C)

Each rank takes the kernel's current environment, folder and sys.path, starts a new
session, writes its output to F1/F2 (the kernel tails them with a
`[rank N]` prefix) and runs `worker.run_job`. The zygote and its ranks end themselves when
the kernel (NBTRAIN_OWNER_PID) is gone; an empty stdin (the kernel closed it) ends the zygote.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import sys
import time

import torch

from . import worker


def _warm_up() -> None:
    """Pay now for what the first step would import lazily (an optimizer's step imports torch._dynamo).

    Imports only: running an optimizer step here would initialise CUDA on a GPU machine (its
    graph-capture check asks for the current CUDA stream), and no fork of this process could
    then use the GPU."""
    torch.set_num_threads(1)  # no OpenMP worker threads exist when the zygote forks
    importlib.import_module("torch._dynamo")  # what the first optimizer step would import: ~1 s
    from torch.nn import parallel  # noqa: F401  (DistributedDataParallel)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: F401


def driver_loaded(maps: str = "/proc/self/maps") -> bool:
    """Whether the CUDA driver library is in this process: the CUDA runtime loads it when something
    initialises the driver, which torch's own flag misses when a C++ call did it (not torch.cuda._lazy_init)."""
    try:
        with open(maps) as mapped:
            return any("libcuda.so" in line for line in mapped)
    except OSError:  # no /proc (not Linux): torch's flag is all there is to read
        return False


def fork_unsafe() -> str | None:
    """Why a fork of this process could not use CUDA (None: it can)."""
    if torch.cuda.is_initialized():
        return "CUDA was initialised in nbtrain's worker starter (the zygote), and a fork of it cannot use the GPU"
    if driver_loaded():
        return ("the CUDA driver was loaded in nbtrain's worker starter (the zygote), and a fork of it cannot use "
                "the GPU")
    return None


def _rank(job: dict) -> None:
    """In the forked child: a session of its own, output to the run's files, then the rank's job."""
    code = 1
    try:
        os.setsid()
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        sys.path[:] = job["sys_path"]
        code = worker.run_job(worker.RunDir(job["run_dir"]))
    except BaseException:  # noqa: BLE001  (the rank must end here, never return into the zygote loop)
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> int:
    owner = int(os.environ["NBTRAIN_OWNER_PID"]) if os.environ.get("NBTRAIN_OWNER_PID") else None
    _warm_up()
    reply = sys.stdout
    reply.write(json.dumps({"ready": os.getpid()}) + "\n")
    reply.flush()
    pending, children, next_check = b"", set(), 0.0
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return 0  # the kernel closed the pipe: it is done with us
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in filter(None, lines):
                job = json.loads(line)
                why = fork_unsafe()
                if why is not None:  # the kernel starts this rank as a fresh interpreter instead
                    reply.write(json.dumps({"refused": job["token"], "why": why}) + "\n")
                    reply.flush()
                    continue
                pid = os.fork()
                if pid == 0:
                    _rank(job)
                children.add(pid)
                reply.write(json.dumps({"started": job["token"], "pid": pid}) + "\n")
                reply.flush()
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            reply.write(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
            reply.flush()
        if time.monotonic() >= next_check:
            if owner is not None and not worker.owner_alive(owner):  # polled: no thread may exist at fork
                os._exit(worker.OWNER_GONE_EXIT)  # the ranks watch the owner themselves
            next_check = time.monotonic() + 0.5


if __name__ == "__main__":
    sys.exit(serve())
