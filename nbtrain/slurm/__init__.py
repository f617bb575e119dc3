"""SLURM from the notebook, through submitit: `nbtrain.slurm.submit / attach / export` (see `jobs`).

`jobs` submits and follows a job (the slurm launcher's target with its options: launchers/slurm.py),
`task` is what each of its ranks runs, `options` checks the sbatch options, `standalone` exports a recipe
as train.py + train.sbatch.
"""
from ..launchers.slurm import JobState, SlurmError, partition_inventory
from .jobs import JobHandle, SlurmJobError, attach, submit
from .options import SlurmOptionError
from .standalone import export

__all__ = ["submit", "attach", "export", "partition_inventory", "JobHandle", "JobState", "SlurmError",
           "SlurmJobError", "SlurmOptionError"]
