"""Training elsewhere than the kernel: ranks on this machine or on several nodes.

`plan` decides once how a run's processes start (its launch plan, the only thing a worker reads
about that); `launch` starts a run from its plan; `rundir` is the private run directory the kernel
and the ranks share; `pool` and `zygote` fork local ranks from a clean interpreter; `worker` runs one
rank (the same Engine as the kernel); `requeue` lets the ranks vote to stop or requeue at one
step; `tracebacks` maps a rank's error back to the notebook cell.
"""
