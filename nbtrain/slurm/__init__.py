"""SLURM from the notebook: `nbtrain.slurm.submit / attach / export` (see `jobs`).

`jobs` submits and follows a job, `script` writes its batch script, `state` reads
`scontrol show job`, `standalone` exports a recipe as train.py + train.sbatch.
"""
from .jobs import (JobHandle, JobState, SlurmError, SlurmJobError, SlurmOptionError, attach, export,
                   partition_inventory, submit)

__all__ = ["submit", "attach", "export", "partition_inventory", "JobHandle", "JobState", "SlurmError",
           "SlurmJobError", "SlurmOptionError"]
