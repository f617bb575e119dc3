"""SLURM from the notebook, through submitit: `nbtrain.slurm.submit / attach / export`, the face of the SLURM
job's parts in distributed/ (where ranks run): `slurm_jobs` submits and follows a job (the slurm target with
its options: launchers/slurm.py), `slurm_task` is what each of its ranks runs, `slurm_options` checks the
sbatch options, `slurm_export` exports a recipe as train.py + train.sbatch.

This face sits beside `nbtrain.fit` (api.py), not below it: a submitted job continues the kernel's side of the
model exactly as fit's ranks do (api.kernel_side: the live engine, or on a first call no engine, only the one
seed and random numbers the ranks share, and the live engine made from theirs when the handle's wait completes).
"""
from ..distributed import slurm_jobs
from ..distributed.launchers.slurm import JobState, SlurmError, partition_inventory
from ..distributed.slurm_jobs import JobHandle, SlurmJobError, attach
from ..distributed.slurm_options import SlurmOptionError
from ..distributed.slurm_export import export

__all__ = ["submit", "attach", "export", "partition_inventory", "JobHandle", "JobState", "SlurmError",
           "SlurmJobError", "SlurmOptionError"]


def submit(recipe, config, *, dry_run: bool = False, engine=None, **options):
    """Submit `recipe` trained with `config` (num_nodes x devices) as a batch job; its JobHandle (or, with
    dry_run=True, the batch script). The options are the slurm target's (partition, time, job_name, run_root,
    python, signal_delay_s, log, any sbatch option): see distributed/slurm_jobs.submit. `engine`: the kernel's
    engine the job continues; None: the model's, as nbtrain.fit finds it."""
    first = None
    if engine is None and not dry_run:
        from ..api import kernel_side
        engine, first = kernel_side(recipe, config.replace(launcher="slurm"))
    return slurm_jobs.submit(recipe, config, dry_run=dry_run, engine=engine, first=first, **options)
