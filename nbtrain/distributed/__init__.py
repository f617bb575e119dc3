"""Where ranks run: every place a run's ranks start, one folder (issue 52).

`launchers/` holds one target per place ranks run (local, torchrun, slurm, ray, debug: their options, their
check, `start`), `plan` decides once how a run's processes start (its launch plan, the only thing a worker
reads about that), `launch` runs it through the target; `rundir` is the private run directory the kernel and
the ranks share; `pool` and `zygote` fork local ranks from a clean interpreter; `worker` runs one rank (the
same Engine as the kernel); `carry` takes the kernel's live engine to the ranks and back; `requeue` lets the
ranks vote to stop or requeue at one step; `tracebacks` maps a rank's error back to the notebook cell. The
SLURM batch job's own parts: `slurm_jobs` (submit, attach, JobHandle: nbtrain.slurm's face), `slurm_task`
(a rank under submitit), `slurm_options` (sbatch options checked), `slurm_export` (train.py + train.sbatch).
"""
