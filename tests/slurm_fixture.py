"""The real SLURM cluster the SLURM tests submit to: started once per session, stopped after.

It is scripts/slurm_cluster.py (munged, MariaDB + slurmdbd for accounting, slurmctld, two
slurmd nodes on 127.0.0.1, private ports and folders). Without the SLURM packages, or without root (slurmd runs as root),
the tests that need it skip and say why.
"""
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm_cluster.py"


def _load_cluster_module():
    spec = importlib.util.spec_from_file_location("nbtrain_slurm_cluster", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cluster_module = _load_cluster_module()


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = cluster_module.missing_binaries()
    if missing:
        pytest.skip(f"SLURM is not installed here (missing: {', '.join(missing)}); scripts/test.sh installs "
                    f"{cluster_module.PACKAGES} with apt-get when run as root")
    if os.getuid() != 0:
        pytest.skip("the private SLURM cluster runs slurmd as root (it starts job processes as their user); "
                    "run the tests as root, as CI does")
    # Its own folder under /tmp: munged wants every folder above its socket traversable by all.
    cluster = cluster_module.Cluster(None, nodes=2)
    cluster.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.conf))  # client commands and the jobs read it
        try:
            yield cluster
        finally:
            cluster.stop()
    still_running = cluster.running()
    shutil.rmtree(cluster.root, ignore_errors=True)
    assert not still_running, f"SLURM daemons outlived the session: {still_running}"
