#!/usr/bin/env python3
"""A private SLURM cluster on this one machine: munged, MariaDB + slurmdbd, slurmctld and N slurmd "nodes".

    python scripts/slurm_cluster.py start [--dir DIR] [--nodes 2]   # prints `export SLURM_CONF=...`
    python scripts/slurm_cluster.py stop --dir DIR

Everything lives under one private folder: the munge key and socket, slurm.conf and
slurmdbd.conf, the accounting database, state, spool, logs and pid files. Daemons listen on
127.0.0.1 on ports picked free at start (the database on a unix socket only, in a folder only
root can enter), so the cluster clashes with nothing else on the machine; no /etc file is read
or written. Accounting runs as on real clusters: slurmctld reports every job to slurmdbd, so
`sacct` answers (submitit reads job states from it).
Client commands need SLURM_CONF=DIR/slurm.conf in their environment (jobs inherit it).
`stop` cancels the jobs first (slurmstepd outlives slurmd by design), then ends every
daemon by the PID in its pid file. The tests use `Cluster` from this module directly.
Standard library only, so it runs before any virtual environment exists.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "scontrol", "srun", "sinfo", "scancel",
           "slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb")
PACKAGES = "slurmctld slurmd slurm-client munge slurmdbd mariadb-server"


def missing_binaries() -> list[str]:
    """The SLURM/munge programs this machine lacks (empty when a cluster can start)."""
    return [name for name in DAEMONS if shutil.which(name) is None
            and not Path("/usr/sbin", name).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _alive(pid: int) -> bool:
    """Running and not a zombie (with no init to reap them, stopped daemons linger as Z)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


CLUSTER = "nbtrain"
REQUEUE_HOLD_S = 10


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, root: str | os.PathLike | None = None, nodes: int = 2, cpus_per_node: int = 2):
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="nbtrain-slurm-"))
        self.nodes = [f"node{i + 1}" for i in range(nodes)]
        self.cpus = cpus_per_node
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.db_socket = self.root / "db" / "mariadbd.sock"

    @property
    def env(self) -> dict:
        """This process's environment plus SLURM_CONF: what every client command needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- start ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> "Cluster":
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Not listable by others; traversable, because munged demands that of its socket's folders.
        os.chmod(self.root, 0o711)
        for sub in ("state", "log", "run", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._start_database()
            ctld_port, dbd_port, *node_ports = _free_ports(2 + len(self.nodes))
            self._start_slurmdbd(dbd_port)
            self._write_conf(ctld_port, dbd_port, node_ports)
            # The cluster must be known to the database before slurmctld registers with it.
            self._run([_binary("sacctmgr"), "-i", "add", "cluster", CLUSTER])
            self._run([_binary("slurmctld"), "-c", "-f", str(self.conf)])
            for node in self.nodes:
                self._run([_binary("slurmd"), "-f", str(self.conf), "-N", node])
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(exist_ok=True)
        os.chmod(munge, 0o755)  # munged insists that its socket's folder is not private
        key = munge / "munge.key"
        self._run([_binary("mungekey"), "--create", f"--keyfile={key}"])
        os.chmod(key, 0o600)
        self._run([_binary("munged"), f"--socket={self.munge_socket}", f"--key-file={key}",
                   f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
                   f"--seed-file={munge / 'munged.seed'}"])
        deadline = time.monotonic() + 10
        while True:
            cred = subprocess.run(["munge", "-S", str(self.munge_socket), "-n"], capture_output=True)
            if cred.returncode == 0 and subprocess.run(["unmunge", "-S", str(self.munge_socket)], input=cred.stdout,
                                                       capture_output=True).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError("munged did not answer on its socket:\n" + self._log_tail("munged.log"))
            time.sleep(0.1)

    def _start_database(self) -> None:
        """mariadbd on an empty data folder, reachable only through its socket in a root-only folder.

        No mariadb-install-db (2-7 s here): the server starts on an empty folder in under a second;
        without grant tables it asks no password, which the socket's folder (0700, root) makes safe:
        no TCP port is opened, and slurmdbd (root) is the only client.
        """
        db = self.root / "db"
        (db / "data").mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(db, 0o700)
        subprocess.Popen([_binary("mariadbd"), "--no-defaults", f"--datadir={db / 'data'}", "--user=root",
                          f"--socket={self.db_socket}", "--skip-networking", "--skip-grant-tables",
                          f"--pid-file={db / 'mariadbd.pid'}", f"--log-error={self.root / 'log' / 'mariadbd.log'}",
                          "--innodb-log-file-size=4M", "--innodb-buffer-pool-size=16M",
                          # A test cluster's accounting need not survive a crash: no fsync (creating the
                          # cluster's tables took 2.8 s with it here).
                          "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                          "--innodb-flush-method=nosync"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        self._wait_for(lambda: subprocess.run([_binary("mariadb"), "--no-defaults", "-S", str(self.db_socket), "-e",
                                               "SELECT 1"], capture_output=True).returncode == 0,
                       "mariadbd did not answer on its socket", "mariadbd.log")

    def _start_slurmdbd(self, port: int) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        conf = r / "slurmdbd.conf"
        lines = [f"AuthInfo=socket={self.munge_socket}", f"DbdHost={host}", "DbdAddr=127.0.0.1", f"DbdPort={port}",
                 "SlurmUser=root", f"PidFile={r / 'run' / 'slurmdbd.pid'}", f"LogFile={r / 'log' / 'slurmdbd.log'}",
                 "StorageType=accounting_storage/mysql", "StorageHost=localhost", "StorageUser=root",
                 "StorageLoc=slurm_acct_db"]
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # slurmdbd refuses a readable one
        with os.fdopen(fd, "w") as stream:
            stream.write("\n".join(lines) + "\n")
        # "localhost" is the socket the client library finds in MYSQL_UNIX_PORT: this database's private one.
        # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF.
        self._run([_binary("slurmdbd")], MYSQL_UNIX_PORT=str(self.db_socket))
        self._wait_for(lambda: _port_open(port), "slurmdbd did not listen", "slurmdbd.log")

    def _wait_for(self, ready, what: str, log: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} after {timeout_s:.0f} s:\n" + self._log_tail(log))
            time.sleep(0.05)

    def _write_conf(self, ctld_port: int, dbd_port: int, node_ports: list[int]) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        lines = [
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            # cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
            f"AuthInfo=socket={self.munge_socket},cred_expire={REQUEUE_HOLD_S}",
            "SlurmUser=root", "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            # Accounting as real clusters keep it: sacct reads every job's state from slurmdbd.
            "JobAcctGatherType=jobacct_gather/linux", "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={self.munge_socket}",  # how slurmctld and sacct reach munge for slurmdbd
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2",
            # batch_sched_delay=0: otherwise batch jobs start only every ~3 s. A requeued job, once its hold is
            # over, waits for the next pass of the main scheduler (every 60 s by default) or of the backfill one
            # (30 s): every 2 s here, so the preempted job's test took 40-70 s by chance, now ~40.
            "SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2",
            # As many sites: a job whose dependency can never be met ends (accounting then tells why; it keeps
            # only the reason a job had when it was queued, so a job left pending would say "Dependency").
            "DependencyParameters=kill_invalid_depend",
            "MinJobAge=300", "KillWait=5", "InactiveLimit=0",
            "EnforcePartLimits=ALL",  # as most sites: a job the partition can never run is refused at sbatch
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
        ]
        for node, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} Port={port} "
                         f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=self.env)
            if "UP" in ping.stdout:
                nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                                       env=self.env).stdout.split("\n")
                states = dict(line.split() for line in nodes if line.strip())
                if all(states.get(n) == "idle" for n in self.nodes):
                    return
            time.sleep(0.2)
        raise ClusterError(f"the SLURM cluster in {self.root} was not ready after {timeout_s:.0f} s:\n"
                           + self._log_tail("slurmctld.log") + "\n"
                           + "\n".join(self._log_tail(f"slurmd-{n}.log") for n in self.nodes))

    def _run(self, argv: list[str], **env) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, env={**self.env, **env})
        if done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")

    def _log_tail(self, name: str, lines: int = 15) -> str:
        path = self.root / "log" / name
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:])

    # --- stop -------------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        files = {"munged": self.root / "munge" / "munged.pid", "mariadbd": self.root / "db" / "mariadbd.pid",
                 "slurmdbd": self.root / "run" / "slurmdbd.pid", "slurmctld": self.root / "run" / "slurmctld.pid"}
        files.update({f"slurmd-{n}": self.root / "run" / f"slurmd-{n}.pid" for n in self.nodes})
        out = {}
        for name, path in files.items():
            try:
                out[name] = int(path.read_text().split()[0])
            except (FileNotFoundError, ValueError, IndexError):
                pass
        return out

    def stop(self, timeout_s: float = 15.0) -> None:
        """Cancel every job, then end slurmd, slurmctld and munged by PID; wait until they are gone."""
        pids = self.pids()
        if "slurmctld" in pids and _alive(pids["slurmctld"]):
            subprocess.run(["scancel", "--full", "--quiet", "--user", str(os.getuid())], env=self.env,
                           capture_output=True, timeout=10)
            self._wait_no_jobs(min(10.0, timeout_s))
        order = [k for k in pids if k.startswith("slurmd-")] + ["slurmctld", "slurmdbd", "mariadbd", "munged"]
        for name in order:
            pid = pids.get(name)
            if pid is None or not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s / 3
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

    def _wait_no_jobs(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            queue = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, env=self.env)
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.2)

    def running(self) -> list[str]:
        """The daemons of this cluster that are still alive."""
        return [name for name, pid in self.pids().items() if _alive(pid)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", help="the cluster's folder (start: created if missing; default a new temp dir)")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "stop" and not args.dir:
        parser.error("stop needs --dir (the folder `start` printed)")
    if missing_binaries():
        print(f"SLURM is not installed here (missing: {', '.join(missing_binaries())}); "
              f"apt-get install {PACKAGES}", file=sys.stderr)
        return 1
    cluster = Cluster(args.dir, nodes=args.nodes)
    try:
        if args.action == "start":
            cluster.start()
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            cluster.stop()
    except ClusterError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
