"""Where a run's ranks run: one launcher per module, one contract for all (base.py).

    local       the plan's ranks forked on this machine by the kernel's warm zygote (local.py)
    torchrun    this node's part of a multi-node job, torch.distributed.run with c10d (torchrun.py)
    slurm       a batch job on a SLURM cluster (slurm.py)
    ray         actors on the Ray cluster the kernel is attached to (ray.py; `pip install "nbtrain[ray]"`)

The launch plan names the launcher, once (distributed/plan.py: LaunchPlan.launcher); `launcher_for`
finds it. Adding a launcher is one module here with a `LAUNCHER` that implements base.Launcher, its
name in config.LAUNCHERS, and its tests.
"""
from __future__ import annotations

import importlib
import importlib.util

from ..config import LAUNCHERS
from .base import Launcher, Ranks, WorkerError, supervise  # noqa: F401  (the contract, for launchers and callers)


def launcher_for(name: str) -> Launcher:
    """The launcher module `name`'s LAUNCHER (one of config.LAUNCHERS)."""
    if name not in LAUNCHERS:
        raise ValueError(f"launcher={name!r}: allowed: one of {', '.join(LAUNCHERS)}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as missing:
        if missing.name != f"{__name__}.{name}":
            raise  # the launcher is here; something it imports is not (it says what to install)
        raise ValueError(f"launcher={name!r}: this nbtrain has no {name} launcher; allowed here: "
                         f"{', '.join(n for n in LAUNCHERS if importlib.util.find_spec(f'{__name__}.{n}'))}") from None
    return module.LAUNCHER
