"""The Ray launcher: the plan's ranks as Ray actors on the cluster the kernel is attached to.

`pip install "nbtrain[ray]"`. The kernel's driver joins the cluster it is attached to (`ray.init()`
finds RAY_ADDRESS or a local `ray start`; with neither it starts a one-machine cluster, which it shuts
down again when the run ends). Every rank is one actor, running nbtrain's own worker entry
(distributed/worker.py `run_job`) as a forked local rank does.

Actors, not Ray Train's TorchTrainer: TorchTrainer owns what nbtrain's worker already does for every
launcher, and does it differently: it joins the process group itself, reports through its own
`ray.train.report` and checkpoint storage (a storage path it writes to), and stops or retries workers by
its own failure policy. Carrying nbtrain's worker through it would mean two owners of one process group
and two ways to stop; an actor per rank runs the same worker entry, rendezvous (env://, rank 0's address)
and step-boundary stop vote as every other launcher, with Ray doing what it is for: placing processes on
the cluster's nodes with their CPUs or GPUs, and ending them.

Events travel through Ray, not a shared filesystem: a Ray cluster's nodes rarely see the kernel's
folders. Each actor holds a private copy of the run directory on its node (the inputs sent as bytes);
the kernel asks the actors for what their ranks wrote since it last asked (rank 0's events, every rank's
output lines), touches the stop file in each copy to stop, and once the run ended brings rank 0's
outputs, or the ranks' tracebacks, back into its own run directory, where the rest of nbtrain reads them.
"""
from __future__ import annotations

import os
import sys
import time

from ..plan import LaunchPlan
from ..pool import FileTail, worker_env
from ..rundir import INPUTS, OUTPUTS, RunDir
from ...config import TrainConfig
from ...hardware import Inventory
from .base import LauncherOptionError, Target, WorkerError, first_raised

try:
    import ray
except ImportError as missing:  # said where the launcher is asked for, not at nbtrain's import
    raise ModuleNotFoundError("launcher='ray' needs Ray: pip install \"nbtrain[ray]\" (ray[train]>=2.60)",
                              name="ray") from missing


class RankActor:
    """One rank: a private copy of the run directory on its node, the worker entry run on it."""

    def __init__(self, files: dict[str, bytes], sys_path: list[str], cwd: str):
        import tempfile
        # The kernel's import path and folder where this node has them (a module beside the notebook).
        sys.path[:0] = [p for p in sys_path if p not in sys.path and os.path.isdir(p)]
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.run = RunDir(tempfile.mkdtemp(prefix="nbtrain-ray-run-"))  # 0700
        self.run.write_files(files)
        self.replay = self.run.tail_events()
        self.tails = [(FileTail(str(self.run.path / name)), is_err) for name, is_err in (("out", False), ("err", True))]

    def address(self) -> tuple[str, int]:
        """Where rank 0 hosts the process group's store: this node's address and a free port."""
        import socket
        with socket.socket() as probe:
            probe.bind(("", 0))
            return ray.util.get_node_ip_address(), probe.getsockname()[1]

    def run_rank(self, env: dict) -> int:
        from ..worker import run_job
        os.environ.update(env)
        for fd, name in ((1, "out"), (2, "err")):  # the rank's output, C libraries' included, for the kernel
            sys.stdout.flush() if fd == 1 else sys.stderr.flush()
            opened = os.open(self.run.path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        return run_job(self.run)

    def news(self) -> tuple[list[dict], list[tuple[bool, str]]]:
        """The events and output lines written since the last call."""
        return self.replay(), [(is_err, line) for tail, is_err in self.tails for line in tail.lines()]

    def request_stop(self) -> None:
        self.run.request_stop()

    def outputs(self) -> dict[str, bytes]:
        return self.run.files(OUTPUTS)

    def errors(self) -> list[tuple[int, dict[str, bytes]]]:
        """(when written, files) of this rank's traceback and the recipe part that raised, if it raised."""
        found = sorted(self.run.path.glob("error-rank*.txt"))
        return [(path.stat().st_mtime_ns, self.run.files([path.with_suffix(".part").name, path.name]))
                for path in found]

    def pid(self) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def remove(self) -> None:
        self.run.remove()


class RayRanks:
    """The ranks' actors, as base.Ranks."""

    def __init__(self, run: RunDir, plan: LaunchPlan, actors, calls, shipped, started_ray: bool):
        self.run, self.plan, self.actors, self.calls = run, plan, actors, calls
        self.shipped, self.started_ray = shipped, started_ray
        here = ray.get_runtime_context().get_node_id()
        # The actors' processes on the kernel's machine (a pid on another node means nothing here).
        self.pids = [pid for node, pid in ray.get([actor.pid.remote() for actor in actors]) if node == here]
        self._events: list[dict] = []
        self._lines: list[tuple[bool, str]] = []
        self._closed = False

    def _pull(self) -> None:
        if self._closed:
            return
        try:
            news = ray.get([actor.news.remote() for actor in self.actors], timeout=30)
        except ray.exceptions.RayError:
            return  # an actor died: state() says so
        for rank, (events, lines) in enumerate(news):
            self._events += events
            self._lines += [(is_err, f"[rank {rank}] {line}") for is_err, line in lines]

    def events(self) -> list[dict]:
        self._pull()
        events, self._events = self._events, []
        return events

    def show(self, echo: bool) -> None:
        self._pull()
        lines, self._lines = self._lines, []
        for is_err, line in lines if echo else ():
            target = sys.stderr if is_err else sys.stdout
            target.write(line)
            target.flush()

    def state(self) -> str:
        done, _ = ray.wait(self.calls, num_returns=len(self.calls), timeout=0)
        codes = []
        for call in done:
            try:
                codes.append(ray.get(call))
            except ray.exceptions.RayError:
                return "failed"
        if any(code != 0 for code in codes):
            return "failed"
        if len(codes) < len(self.calls):
            return "running"
        self.run.write_files(ray.get(self.actors[0].outputs.remote()))  # rank 0 writes them
        return "completed"

    def request_stop(self) -> None:
        ray.get([actor.request_stop.remote() for actor in self.actors])

    def error(self) -> WorkerError:
        time.sleep(0.2)  # a rank's peers fail a moment after it; let its own report land
        written, died = [], None
        for rank, actor in enumerate(self.actors):
            try:
                written += ray.get(actor.errors.remote(), timeout=30)
            except ray.exceptions.RayError as error:
                died = died or (rank, error)
        for _, files in sorted(written, key=lambda found: found[0]):  # the earliest first, as run.errors() reads
            self.run.write_files(files)
        error = first_raised(self.run, self.plan.timeout_s, self.shipped)
        if error is None:
            rank, cause = died if died is not None else (None, "exited without a traceback")
            error = WorkerError(f"rank {rank}'s Ray actor died; the other ranks were stopped: "
                                f"{str(cause).strip().splitlines()[0]}", rank=rank)
        error.pids = list(self.pids)
        return error

    def close(self, echo: bool) -> None:
        if self._closed:
            return
        try:
            self.show(echo)
            ray.get([actor.remove.remote() for actor in self.actors], timeout=10)
        except ray.exceptions.RayError:
            pass  # a dead actor's node removes its temporary folder with the node's session
        finally:
            self._closed = True
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            _wait_gone(self.pids)
            if self.started_ray:  # a cluster this call started ends with it; one the user started stays
                ray.shutdown()


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until the actors' processes on this machine have exited (ray.kill returns before they do)."""
    import psutil
    mine = []
    for pid in pids:
        try:
            mine.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass  # gone already
    psutil.wait_procs(mine, timeout=timeout_s)


class RayTarget(Target):
    """The Ray cluster the kernel is attached to (one started here when none is): its inventory is the
    cluster's resources (ray.cluster_resources(): GPUs and CPUs, all nodes together), never the kernel's."""

    name = "ray"
    OPTIONS = {"num_cpus": "CPUs each rank's actor asks for: a number > 0 (default: the cluster's CPUs shared "
                           "among the ranks)",
               "resources": "custom Ray resources each rank's actor asks for: a dict of name -> amount > 0"}

    def __init__(self, **options):
        super().__init__(**options)
        self.started_ray = False

    def read_option(self, name: str, value):
        if name == "num_cpus":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise LauncherOptionError(f"launcher='ray': option num_cpus={value!r}: allowed: {self.OPTIONS[name]}")
            return value
        if not isinstance(value, dict) or not all(isinstance(k, str) and not isinstance(v, bool) and
                                                  isinstance(v, (int, float)) and v > 0 for k, v in value.items()):
            raise LauncherOptionError(f"launcher='ray': option resources={value!r}: allowed: {self.OPTIONS[name]}")
        return dict(value)

    def connect(self) -> None:
        """Join the cluster the kernel is attached to, or start a one-machine one (ended with the run)."""
        if ray.is_initialized():
            return
        # The actors on this machine import the nbtrain the kernel imported (as the local launcher's ranks
        # do); on other nodes, the one installed in the cluster's environment.
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": worker_env(1)["PYTHONPATH"]}}, include_dashboard=False)
        self.started_ray = True

    def inventory(self) -> Inventory:
        self.connect()
        offered = ray.cluster_resources()
        gpus = int(offered.get("GPU", 0))
        # Ray does not say a GPU's compute capability: bf16 is left to the rank's own check on its node.
        return Inventory(cuda_devices=gpus, cuda_bf16=bool(gpus), mps=False, cpu_cores=int(offered.get("CPU", 0)))

    def where(self) -> str:
        return f"the Ray cluster ({ray.get_runtime_context().gcs_address if ray.is_initialized() else 'not joined'})"

    def config_to_check(self, config: TrainConfig) -> TrainConfig:
        # Ray places every rank on the cluster's nodes: the world is checked against the cluster's total.
        return config if config.num_nodes == 1 else config.replace(devices=config.world_size, num_nodes=1,
                                                                    node_rank=None)

    def plan(self, config: TrainConfig, **keywords) -> LaunchPlan:
        plan = super().plan(config, **keywords)
        self.connect()
        cpus = self.options.get("num_cpus") or max(1, int(ray.cluster_resources().get("CPU", 1)) // plan.world_size)
        return plan.replace(threads_per_rank=max(1, int(cpus)))

    def start(self, run: RunDir, plan: LaunchPlan, shipped: tuple = ()) -> RayRanks:
        self.connect()
        started_ray, self.started_ray = self.started_ray, False  # the ranks end the cluster this target started
        size = plan.world_size
        per_rank = {"num_cpus": self.options.get("num_cpus") or plan.threads_per_rank or 1,
                    "num_gpus": 1 if plan.backend == "nccl" else 0}
        if self.options.get("resources"):
            per_rank["resources"] = self.options["resources"]
        actor_class = ray.remote(max_concurrency=3)(RankActor)  # news and stop while the rank trains
        files = run.files(INPUTS)
        actors = []
        try:
            actors = [actor_class.options(**per_rank).remote(files, sys.path, os.getcwd()) for _ in range(size)]
            host, port = ray.get(actors[0].address.remote())
            calls = []
            for rank, actor in enumerate(actors):
                # Each actor sees only its own device (Ray sets CUDA_VISIBLE_DEVICES): local rank 0 of 1.
                env = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": host, "MASTER_PORT": str(port)}
                calls.append(actor.run_rank.remote(env))
            return RayRanks(run, plan, actors, calls, shipped, started_ray)
        except BaseException:  # an interrupt while starting: no actor may outlive this call
            for actor in actors:
                ray.kill(actor, no_restart=True)
            if started_ray:
                ray.shutdown()
            raise

    def release(self) -> None:
        """A cluster this target started for a check that refused, or a run that never started, ends here."""
        if self.started_ray:
            self.started_ray = False
            ray.shutdown()


TARGET = RayTarget
