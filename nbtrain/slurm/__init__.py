"""SLURM from the notebook, through submitit: `nbtrain.slurm.submit / attach / export` (see `jobs`).

`jobs` submits and follows a job with submitit, `task` is what each of its ranks runs,
`options` checks the sbatch options, `standalone` exports a recipe as train.py + train.sbatch.
"""
from .jobs import (JobHandle, JobState, SlurmError, SlurmJobError, SlurmOptionError, attach, export,
                   partition_inventory, submit)

__all__ = ["submit", "attach", "export", "partition_inventory", "JobHandle", "JobState", "SlurmError",
           "SlurmJobError", "SlurmOptionError"]
