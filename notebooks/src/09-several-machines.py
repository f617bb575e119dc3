# requires: nbtrain.distributed.launch, nbtrain.slurm
# %% [markdown]
# # 9 · Several machines: rendezvous, and SLURM jobs from the notebook
#
# **Checklist item:** past one machine, DDP runs one group of processes per node, and the nodes find each
# other through a **rendezvous**: every node runs the same program, points it at one agreed `host:port`,
# and is handed its ranks there. On a cluster, the scheduler (SLURM) allocates the nodes and starts that
# program on each.
#
# In nbtrain: `num_nodes=N` (with `devices` processes per node); `fit_distributed(..., node_rank=r,
# rdzv_endpoint="host:port")` is what each node runs; `nbtrain.slurm.submit(recipe, config, ...)` writes
# the batch script, submits it, and streams the job's metrics back (`dry_run=True` only shows the script).

# %%
import shutil
import socket
import subprocess
import threading
import time

import torch
from torch import nn
from torch.utils.data import Subset
import matplotlib.pyplot as plt

import nbtrain
import nbtrain.slurm
from nbtrain import TrainConfig, hardware
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.distributed.launch import fit_distributed

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
torch.set_num_threads(1)
train_data = Subset(DigitsDataset(train=True), range(1280))


def recipe():
    torch.manual_seed(0)
    return nbtrain.Recipe(model=DigitsMLP(), train_data=train_data, loss_fn=nn.CrossEntropyLoss(),
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))

# %% [markdown]
# ## Two "nodes" on this machine
#
# Each node is a separate call of the same function — on a real cluster, one per machine; here, two threads
# of this kernel. They meet at a c10d rendezvous on `127.0.0.1`, form one group of 2 ranks, train, and each
# caller gets the trained weights.

# %%
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{s.getsockname()[1]}"
config = TrainConfig(num_nodes=2, devices=1, batch_size=32, max_steps=12, log_every_n_steps=1, accelerator="cpu")
recipes, results, errors = [recipe(), recipe()], [None, None], []

def node(rank):
    try:
        results[rank] = fit_distributed(recipes[rank], config, node_rank=rank, rdzv_endpoint=endpoint,
                                        timeout=120, echo=False)
    except Exception as error:  # shown below, with the other node's outcome
        errors.append(error)

started = time.perf_counter()
threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
for t in threads:
    t.start()
for t in threads:
    t.join(240)
print(f"rendezvous at {endpoint}: {[r.status if r else None for r in results]} in "
      f"{time.perf_counter() - started:.1f} s; errors: {errors or 'none'}")
print(f"world size {results[0].summary['world_size']}, global batch {results[0].summary['global_batch']}")

# %% [markdown]
# Two nodes with 32 samples each make the update of one process with 64 — and both nodes' models ended
# with those weights. For scale, a single process that trains with batches of 32 (twice the steps, each on
# half the data) ends somewhere else. (Each node's own training loss is the loss of its 32 samples, not of
# the global batch, so the weights are what to compare.)

# %%
def train_alone(batch_size, steps):
    alone = recipe()
    nbtrain.fit(recipe=alone, config=TrainConfig(batch_size=batch_size, max_steps=steps, accelerator="cpu"))
    return alone.model

def largest_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))

single = train_alone(64, 12)
differences = [largest_difference(r.model, single) for r in recipes]
other = largest_difference(train_alone(32, 24), single)
print("largest weight difference from one process with batch 64, per node:", [f"{d:.1e}" for d in differences],
      f"— one process with batch 32: {other:.1e}")

fig, ax = plt.subplots(figsize=(5.5, 2.4), layout="constrained")
ax.bar(["node 0\n(2 x 32)", "node 1\n(2 x 32)", "one process\n(32, twice the steps)"], differences + [other],
       color=["tab:green", "tab:green", "tab:red"])
ax.set_yscale("log")
ax.set(ylabel="largest |weight difference|", title="against one process with batch 64")
plt.show()

# %% [markdown]
# ## The SLURM batch script
#
# For a cluster, nbtrain writes the batch script from the same config. The config is checked against the
# *cluster's* hardware — here two nodes with four GPUs each, stated with `hardware.assume` since this
# machine has none. The run folder must be one every node sees (a shared file system), and `python` the
# cluster's interpreter with nbtrain installed; by default they are this folder's `.nbtrain/runs` and this
# kernel's interpreter. `dry_run=True` shows the script and submits nothing:

# %%
cluster_node = hardware.Inventory(cuda_devices=4, cuda_bf16=True, mps=False, cpu_cores=32)
with hardware.assume(cluster_node):
    cluster_config = TrainConfig(accelerator="cuda", num_nodes=2, devices=4, precision="bf16-mixed",
                                 batch_size=64, max_epochs=3)
script = nbtrain.slurm.submit(recipe(), cluster_config, dry_run=True, partition="gpu", time="00:30:00",
                              run_root="/shared/nbtrain-runs", python="python3")
print(script)

# %% [markdown]
# One `srun` task per node starts `torchrun` with 4 processes; the first node of the allocation hosts the
# rendezvous; the job's id picks its port. In a cell, `%%nbtrain --slurm-dry-run --num-nodes 2 --devices 4
# --partition gpu` shows the same script for the cell's recipe, and `--slurm` submits it and follows the
# job live. `nbtrain.slurm.export(recipe, config, folder)` writes the script plus a `train.py` to submit by
# hand.
#
# ## A real submission — only where SLURM is
#
# With `sbatch` on this machine and a controller that answers, the recipe is submitted for real and
# followed from here; otherwise the cell says why it skipped.

# %%
def slurm_answers():
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no sbatch on this machine"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer"
    if done.returncode != 0 or "idle" not in done.stdout:
        return "no SLURM controller with an idle node answers"
    return None

why_not = slurm_answers()
job_result = None
if why_not:
    print("skipped:", why_not)
else:
    job = nbtrain.slurm.submit(recipe(), TrainConfig(batch_size=64, max_epochs=1, accelerator="cpu"), time="00:05:00")
    print("submitted:", job)
    try:
        job_result = job.wait(timeout=60)
    finally:
        if not job.state.terminal:
            job.cancel()
    print(job_result.table())

# %% [markdown]
# **Takeaway:** a multi-node run is the same DDP run with a rendezvous every node can reach; the global
# batch grows with the nodes (scale the learning rate, notebook 2). nbtrain writes and submits the SLURM
# script from the config you already tested in the notebook.
#
# ## Checks

# %%
assert not errors and [r.status for r in results] == ["completed", "completed"]
assert results[0].summary["world_size"] == 2 and results[0].summary["global_batch"] == 64
assert max(differences) < 1e-4                       # 2 nodes x 32 == 1 process x 64, on both nodes
assert other > 100 * max(differences)                # ... while batches of 32 in one process are another training
for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "--nnodes=2", '--nproc-per-node="$nproc"',
             "--rdzv-backend=c10d", "#SBATCH --partition=gpu"):
    assert line in script, line
if job_result is not None:
    assert job_result.status == "completed"
print("all checks passed")
