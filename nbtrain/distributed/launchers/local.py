"""The local launcher: the plan's ranks forked on this machine by the kernel's warm zygote.

The zygote (distributed/pool.py, zygote.py) is a fresh interpreter that imported torch and never
touched CUDA; each rank is a fork of it running the worker entry, its output in the run directory's
rank{N}.out / rank{N}.err. The ranks meet at a TCPStore the kernel binds to the plan's host on a free
port before any rank starts (the plan names the port: no port race, two runs never collide).
"""
from __future__ import annotations

import socket
import sys
from datetime import timedelta

from ..plan import LaunchPlan
from ..pool import ZYGOTE, FileTail, ForkRefused, Relay, start_rank, terminate, worker_env
from ..rundir import RunDir
from .base import Target
from .processes import ProcessRanks


class LocalTarget(Target):
    """This machine (its inventory: hardware.inventory()); no options."""

    name = "local"

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> ProcessRanks:
        """The plan's ranks forked by the warm zygote, joined by a store bound to its host on a free port."""
        import torch.distributed as torch_dist
        host, nprocs = plan.host, plan.procs_per_node
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((host, 0))
        except OSError as error:
            listener.close()
            raise ValueError(f"host={host!r}: allowed: an address of this machine for the ranks to meet at "
                             f"(default 127.0.0.1); binding to it failed: {error}") from None
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
                    sys.stderr.write(f"nbtrain: rank {rank} starts as a fresh interpreter (seconds slower): "
                                     f"{refused}\n")
                    ranks.append(start_rank(str(run.path), env, out, err))
                outputs += [(FileTail(out), f"[rank {rank}] ", False), (FileTail(err), f"[rank {rank}] ", True)]
        except BaseException:  # an interrupt while starting: no rank may outlive this call
            terminate(ranks)
            raise
        return ProcessRanks(run, plan, ranks, Relay(), ranks=list(range(nprocs)), shipped=shipped, keep=store,
                            outputs=outputs)


TARGET = LocalTarget
