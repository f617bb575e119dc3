"""Training elsewhere than the kernel: ranks on this machine or on several nodes.

`plan` decides once how a run's processes start (its launch plan, the only thing a worker reads
about that, its launcher included); `launch` runs it through the launcher the plan names
(nbtrain/launchers/); `rundir` is the private run directory the kernel
and the ranks share; `pool` and `zygote` fork local ranks from a clean interpreter; `worker` runs one
rank (the same Engine as the kernel); `requeue` lets the ranks vote to stop or requeue at one
step; `tracebacks` maps a rank's error back to the notebook cell.
"""
