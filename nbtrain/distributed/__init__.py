"""Training elsewhere than the kernel: ranks on this machine or on several nodes.

`launch` plans a run and starts it; `rundir` is the private run directory the kernel and the
ranks share; `pool` and `zygote` fork local ranks from a clean interpreter; `worker` runs one
rank (the same Engine as the kernel); `requeue` lets the ranks vote to stop or requeue at one
step; `tracebacks` maps a rank's error back to the notebook cell.
"""
