"""The debug target: rank 0 alone (world size 1), in this process, through the same worker entry and run
directory as every launcher's ranks (as submitit's DebugExecutor runs a job in the calling process), so a
test or `pdb` steps into a rank: `fit(..., launcher="debug")` or `%%nbtrain --launcher debug`.

The rank runs to its end inside `start` (no live progress while it trains: its events are replayed
afterwards); the process group it joins (gloo, one rank, a store this process hosts), the environment
variables a rank reads and torch's thread count are this process's only while it runs.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

from ..plan import LaunchPlan
from ..rundir import RunDir
from .base import Target, WorkerError, first_raised

# What a rank reads of its place in the world (as torchrun sets it): set while rank 0 runs here, then put back.
_RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}


class DebugRanks:
    """Rank 0 once it ran here (base.Ranks): its events from the run directory, its output already printed."""

    def __init__(self, run: RunDir, plan: LaunchPlan, code: int, shipped=()):
        self.run, self.plan, self.code, self.shipped = run, plan, code, shipped
        self._replay = run.tail_events()

    def events(self) -> list[dict]:
        return self._replay()

    def show(self, echo: bool) -> None:
        pass  # the rank printed to this process's own output as it ran

    def state(self) -> str:
        return "completed" if self.code == 0 else "failed"

    def request_stop(self) -> None:
        self.run.request_stop()

    def error(self) -> WorkerError:
        return first_raised(self.run, self.plan.timeout_s, self.shipped) or \
            WorkerError(f"rank 0 ended with code {self.code} and wrote no traceback", rank=0)

    def close(self, echo: bool) -> None:
        pass


class DebugTarget(Target):
    """This process: one rank, this machine's inventory; no options."""

    name = "debug"

    def plan(self, config, **keywords) -> LaunchPlan:
        # No owner to watch (the rank is the owner) and this process's threads stay as they are.
        return super().plan(config, **keywords).replace(owner_pid=None, owner_started=None, threads_per_rank=None)

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> DebugRanks:
        import torch
        import torch.distributed as torch_dist
        from ..worker import run_job
        if torch_dist.is_initialized():
            raise ValueError("launcher='debug': this process is already in a process group (a rank of another "
                             "run); allowed: launcher='local' from a process outside one")
        host = plan.host or "127.0.0.1"
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        plan = plan.replace(store_port=port)
        run.write_plan(plan)
        store = torch_dist.TCPStore(host, port, 1, True, timedelta(seconds=plan.timeout_s), wait_for_workers=False)
        saved_env = {name: os.environ.get(name) for name in (*_RANK_ENV, "MASTER_ADDR", "MASTER_PORT")}
        threads = torch.get_num_threads()
        os.environ.update(_RANK_ENV, MASTER_ADDR=host, MASTER_PORT=str(port))
        try:
            code = run_job(run)
        finally:
            if torch_dist.is_initialized():  # a rank that raised leaves its group: this process lives on
                torch_dist.destroy_process_group()
            del store
            torch.set_num_threads(threads)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return DebugRanks(run, plan, code, shipped)


TARGET = DebugTarget
