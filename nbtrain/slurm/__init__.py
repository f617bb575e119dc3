"""SLURM from the notebook, through submitit: `nbtrain.slurm.submit / attach / export`, the face of the SLURM
job's parts in distributed/ (where ranks run): `slurm_jobs` submits and follows a job (the slurm target with
its options: launchers/slurm.py), `slurm_task` is what each of its ranks runs, `slurm_options` checks the
sbatch options, `slurm_export` exports a recipe as train.py + train.sbatch.
"""
from ..distributed.launchers.slurm import JobState, SlurmError, partition_inventory
from ..distributed.slurm_jobs import JobHandle, SlurmJobError, attach, submit
from ..distributed.slurm_options import SlurmOptionError
from ..distributed.slurm_export import export

__all__ = ["submit", "attach", "export", "partition_inventory", "JobHandle", "JobState", "SlurmError",
           "SlurmJobError", "SlurmOptionError"]
