"""The launch plan: every decision about how a run's processes start, made once, here.

A run's plan is derived when the run starts, from its TrainConfig (plus the keywords
fit_distributed and launch take), written into the run directory as launch.json (rundir.py),
and is the only thing a worker or a torchrun agent reads for these decisions:

    launcher                where the ranks run: local | torchrun | slurm | ray | debug (launchers/)
    backend                 gloo | nccl, decided by backend_for() for every kind of run
    nodes, procs_per_node   the world; threads_per_rank: each rank's torch threads
    timeout_s               how long a rank may wait in one collective
    host, rdzv_endpoint, node_rank, rdzv_id     where the ranks meet
    prefix_output           ranks prefix their own lines with [rank N] (torchrun merges streams)
    shared_run_dir          every node sees this directory: global rank 0 alone writes outputs
    owner_pid, owner_started    the process whose end ends the workers (None: a batch job)
    store_port              the TCPStore the kernel bound for one machine's ranks (else torchrun's)

The multi-node options' environment fallbacks (NBTRAIN_NODE_RANK, NBTRAIN_RDZV_ENDPOINT,
NBTRAIN_RDZV_ID) are read here and nowhere else. Values are read by TrainConfig's own
option readers, so a launch keyword is checked exactly as the same config option is.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from ..config import DEFAULT_TIMEOUT_S, TrainConfig
from ..options import ConfigError

BACKENDS = ("gloo", "nccl")
LOOPBACK = ("127.0.0.1", "localhost")


def backend_for(device: str) -> str:
    """The process-group backend for ranks on `device`: nccl for CUDA, gloo for the rest.

    Callers pass the device the ranks will use: this machine's resolved one for a run started
    here, the accelerator asked for in a batch job (the login node may have no GPU).
    """
    return "nccl" if device == "cuda" else "gloo"


@dataclass(frozen=True)
class LaunchPlan:
    launcher: str = "local"
    backend: str = "gloo"
    nodes: int = 1
    procs_per_node: int = 1
    threads_per_rank: int | None = None  # None: OMP_NUM_THREADS, which the batch script sets per node
    timeout_s: float = DEFAULT_TIMEOUT_S
    host: str | None = None
    rdzv_endpoint: str | None = None
    node_rank: int | None = None
    rdzv_id: str | None = None
    prefix_output: bool = False
    shared_run_dir: bool = False
    owner_pid: int | None = None
    owner_started: float | None = None
    store_port: int | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def writes_outputs(self, rank: int, local_rank: int) -> bool:
        """One writer per run directory: global rank 0 when every node shares it, else each node's first rank."""
        return (rank if self.shared_run_dir else local_rank) == 0

    def replace(self, **changes) -> "LaunchPlan":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


# --- the plans -------------------------------------------------------------------------------

def for_fit(config: TrainConfig, *, timeout=None, node_rank=None, rdzv_endpoint=None, host=None) -> LaunchPlan:
    """A fit run started from this kernel; the keywords, when given, override the config's launch options."""
    timeout_s = _timeout(config.timeout if timeout is None else timeout)
    host = config.rdzv_host if host is None else host
    launcher = config.launcher or ("torchrun" if config.num_nodes > 1 else "local")
    common = dict(launcher=launcher, backend=backend_for(config.device_type), nodes=config.num_nodes,
                  procs_per_node=config.devices, threads_per_rank=_threads(config.devices), timeout_s=timeout_s)
    if launcher == "ray":
        # Ray owns its actors' lifetime (they end with the kernel's driver) and places them on its nodes,
        # each rank with a run directory of its own there: global rank 0 writes the outputs.
        return LaunchPlan(shared_run_dir=True, **common)
    if launcher == "slurm":  # a batch job: it outlives the kernel
        return for_batch_job(config)
    common.update(_owner())
    if launcher in ("local", "debug"):  # this machine's ranks (debug: rank 0 in the kernel itself)
        return LaunchPlan(host=_host(host) or LOOPBACK[0], **common)
    endpoint = config.rdzv_endpoint if rdzv_endpoint is None else rdzv_endpoint
    endpoint = endpoint or os.environ.get("NBTRAIN_RDZV_ENDPOINT")
    if endpoint is None and config.num_nodes == 1:  # torchrun on this machine alone: it hosts the rendezvous
        endpoint = f"{_host(host) or LOOPBACK[0]}:{_free_port(_host(host) or LOOPBACK[0])}"
    endpoint = _endpoint(endpoint)
    node_rank = next((r for r in (node_rank, config.node_rank) if r is not None), os.environ.get("NBTRAIN_NODE_RANK"))
    node_rank = _node_rank(0 if node_rank is None and config.num_nodes == 1 else node_rank, config.num_nodes)
    # Ranks on a loopback rendezvous must also advertise loopback, or peers try the public address.
    local = _host(host) or (LOOPBACK[0] if endpoint.rsplit(":", 1)[0].strip("[]") in LOOPBACK else None)
    return LaunchPlan(host=local, rdzv_endpoint=endpoint, node_rank=node_rank,
                      rdzv_id=os.environ.get("NBTRAIN_RDZV_ID", "nbtrain"), prefix_output=True, **common)


def for_function(nprocs: int, *, timeout=None, backend: str | None = None, host: str = LOOPBACK[0]) -> LaunchPlan:
    """`nbtrain.launch(fn, nprocs)` on this machine; backend None: nccl when CUDA has a device per rank."""
    if backend is None:
        import torch
        enough = torch.cuda.device_count() >= nprocs  # NVML's count: is_available() would initialise CUDA
        backend = backend_for("cuda" if enough else "cpu")
    return LaunchPlan(backend=backend, procs_per_node=nprocs, threads_per_rank=_threads(nprocs),
                      timeout_s=_timeout(timeout), host=_host(host), **_owner())


def for_batch_job(config: TrainConfig) -> LaunchPlan:
    """A SLURM job (submitted, or exported as train.sbatch): it outlives the kernel, so no owner; every node
    sees its run directory and writes to one output file. Where the nodes meet, and each rank's threads,
    the batch script decides on the allocation."""
    return LaunchPlan(launcher="slurm", backend=backend_for(config.accelerator), nodes=config.num_nodes,
                      procs_per_node=config.devices, timeout_s=_timeout(config.timeout),
                      prefix_output=True, shared_run_dir=True)


# --- reading values with TrainConfig's own readers --------------------------------------------

def _read(option: str, value, allowed: str | None = None, name: str | None = None, **context):
    """`value` as TrainConfig reads `option` (checked beside the options in `context`); a bad value raises
    a ValueError naming it (as `name`, the caller's keyword) and what is allowed (the config's own words
    unless `allowed` says it for this call)."""
    try:
        return getattr(TrainConfig(**context, **{option: value}), option)
    except ConfigError as error:
        raise ValueError(f"{name or option}={value!r}: allowed: {allowed or error.problems[0].allowed}") from None


def _timeout(value) -> float:
    if isinstance(value, str):  # a Python keyword takes a number; text is what flags give the config
        raise ValueError(f"timeout={value!r}: allowed: a number of seconds > 0 (how long a rank may wait in one "
                         "collective)")
    seconds = _read("timeout", value)
    return DEFAULT_TIMEOUT_S if seconds is None else seconds


def _endpoint(value) -> str:
    allowed = ("'host:port' of the c10d rendezvous that every node reaches (e.g. '10.0.0.1:29400'), needed with "
               "num_nodes > 1")
    endpoint = _read("rdzv_endpoint", value, allowed)
    if endpoint is None:
        raise ValueError(f"rdzv_endpoint={value!r}: allowed: {allowed}")
    return endpoint


def _node_rank(value, nodes: int) -> int:
    allowed = f"a whole number from 0 to {nodes - 1} (this machine's place among num_nodes={nodes})"
    rank = _read("node_rank", value, allowed, num_nodes=nodes)
    if rank is None:
        raise ValueError(f"node_rank={value!r}: allowed: {allowed}")
    return rank


def _host(value) -> str | None:
    if value is None:
        return None
    return _read("rdzv_host", value, "an address of this machine for the ranks to meet at (default 127.0.0.1)",
                 name="host")


def _free_port(host: str) -> int:
    import socket
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _threads(procs: int) -> int:
    """This machine's cores shared among its ranks (oversubscribed ranks slow each other down)."""
    return max(1, (os.cpu_count() or 1) // procs)


def started_since_boot(process) -> float:
    """When `process` started, in seconds since the machine booted: unlike its wall-clock start
    time this does not move when the system clock is set (NTP, a laptop waking), so it tells a
    running owner from a later process that reused its pid."""
    import psutil
    return process.create_time() - psutil.boot_time()


def _owner() -> dict:
    import psutil
    owner = psutil.Process(os.getpid())
    return {"owner_pid": owner.pid, "owner_started": started_since_boot(owner)}
