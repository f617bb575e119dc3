"""The torchrun launcher: this node's part of a job across machines, torch.distributed.run with a c10d
rendezvous at the plan's endpoint. The same call runs on every node; the agent starts this node's ranks
and its output carries theirs, each line prefixed `[rank N]` by the rank itself (plan.prefix_output)."""
from __future__ import annotations

from ..plan import LaunchPlan
from ..pool import Relay, start, worker_env
from ..rundir import RunDir
from .base import Target
from .processes import ProcessRanks


class TorchrunTarget(Target):
    """This node's part of a multi-node job: checked against this machine, which runs its ranks; no options."""

    name = "torchrun"

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> ProcessRanks:
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
        return ProcessRanks(run, plan, [agent], relay, ranks=None, shipped=shipped)


TARGET = TorchrunTarget
