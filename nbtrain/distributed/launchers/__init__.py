"""Where a run's ranks run: one target per module, one contract for all (base.py: Target, Ranks, supervise).

    local       the plan's ranks forked on this machine by the kernel's warm zygote (local.py)
    torchrun    this node's part of a multi-node job, torch.distributed.run with c10d (torchrun.py)
    slurm       a batch job on a SLURM cluster's partition (slurm.py; options: partition, time, sbatch's)
    ray         actors on the Ray cluster the kernel is attached to (ray.py; `pip install "nbtrain[ray]"`)
    debug       rank 0 alone, in this process, through the same worker entry (debug.py: pdb steps into it)

`launcher_for(config, **options)` is the target the config's launcher names (local for one node, torchrun
for several), with its options set; it checks the config against what it offers, plans and starts the run.
Adding a launcher is one module here with a `Target` subclass named `TARGET`, its name in config.LAUNCHERS,
and its tests.
"""
from __future__ import annotations

import importlib
import importlib.util

from ...config import LAUNCHERS, TrainConfig
from .base import Target


def launcher_for(config: TrainConfig, **options) -> Target:
    """The target of `config.launcher` (None: local for one node, torchrun for several), holding `options`
    (a bad one raises LauncherOptionError naming it, its value and what is allowed)."""
    name = config.launcher or ("torchrun" if config.num_nodes > 1 else "local")
    if name not in LAUNCHERS:
        raise ValueError(f"launcher={name!r}: allowed: one of {', '.join(LAUNCHERS)}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as missing:
        if missing.name != f"{__name__}.{name}":
            raise  # the launcher is here; something it imports is not (it says what to install)
        raise ValueError(f"launcher={name!r}: this nbtrain has no {name} launcher; allowed here: "
                         f"{', '.join(n for n in LAUNCHERS if importlib.util.find_spec(f'{__name__}.{n}'))}") from None
    return module.TARGET(**options)
