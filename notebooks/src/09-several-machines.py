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
# rdzv_endpoint="host:port")` is what each node runs; `nbtrain.slurm.submit(recipe, config, ...)` submits
# the run as a SLURM job through [submitit](https://github.com/facebookincubator/submitit) and streams the
# job's metrics back (`dry_run=True` only shows the batch script). A job that hits its time limit, is
# preempted or crashes continues from a checkpoint: `--checkpoint-every` and `--resume last`.
#
# Where the ranks run is one choice, the **launcher**: `local` (this machine), `torchrun` (the call above on
# every node), `slurm` (a batch job), `ray` (a Ray cluster, the usual route on a cloud or Kubernetes).

# %%
%load_ext nbtrain
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

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
print(f"world size {results[0].summary.world_size}, global batch {results[0].summary.global_batch}")

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
# For a cluster, submitit writes the batch script from the same config. The config is checked against the
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
# `srun` starts one task per rank, 4 per node, each one submitit's runner (`submitit.core._submit`) on the
# run folder, where nbtrain's task turns SLURM's view of it into the rank's place in the world: the first
# node's address as SLURM knows it (its `NodeAddr`, right even where node names do not resolve) hosts the
# rendezvous, the job's id picks its port. `--kill-on-bad-exit=1` ends every rank as soon as one dies. In
# a cell, `%%nbtrain --slurm-dry-run --num-nodes 2 --devices 4 --partition gpu` shows the same script for
# the cell's recipe, and `--slurm` submits it and follows the job live. For a cluster where you submit by
# hand, `nbtrain.slurm.export(recipe, config, folder)` writes a `train.py` and a `train.sbatch` of its own
# (torchrun per node; it is not requeued on preemption).
#
# ## Interrupted, then resumed: checkpoints
#
# Long runs get cut short: a job reaches its time limit or is preempted, a kernel is interrupted or
# restarted. `--checkpoint-every N` (optimizer steps, or a duration such as `10m`) writes a checkpoint —
# the weights, the optimizer's state, every random generator's state and the position in the epoch —
# to a temporary file renamed into place, so a crash mid-write never leaves a broken one. `--resume last`
# continues from the newest checkpoint in `--checkpoint-dir` (default `.nbtrain/checkpoints`).
#
# A run planned for 100 steps, with a checkpoint every 25, is interrupted at step 60. In JupyterLab you
# would press ■ (interrupt the kernel): the run stops at the next step and keeps what it trained. So that
# this notebook runs on its own, its loss function sends the kernel that same interrupt at its 60th call:

# %%
checkpoints = Path(".nbtrain/checkpoints/notebook-09")
shutil.rmtree(checkpoints, ignore_errors=True)  # a rerun of this notebook starts without old checkpoints


class InterruptAt(nn.CrossEntropyLoss):
    """Cross-entropy that interrupts the kernel at its `call`-th call, as the ■ button does."""

    def __init__(self, call):
        super().__init__()
        self.call, self.calls = call, 0

    def forward(self, output, target):
        self.calls += 1
        if self.calls == self.call:
            os.kill(os.getpid(), signal.SIGINT)
        return super().forward(output, target)

# %%
%%nbtrain --max-steps 100 --batch-size 32 --checkpoint-every 25 --checkpoint-dir .nbtrain/checkpoints/notebook-09 --no-plot --name cut
torch.manual_seed(0)
model = DigitsMLP()
loss_fn = InterruptAt(60)
optimizer = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)

# %%
print("checkpoints written:", ", ".join(sorted(p.name for p in checkpoints.glob("step-*.pt"))))

# %% [markdown]
# The same cell again, as after a kernel restart — a fresh model, an ordinary loss function — with
# `--resume last`. It loads the checkpoint of step 50 and trains what was left of the 100 planned steps
# (steps the interrupted run took after its last checkpoint are trained again):

# %%
%%nbtrain --max-steps 100 --batch-size 32 --checkpoint-every 25 --checkpoint-dir .nbtrain/checkpoints/notebook-09 --resume last --no-plot --name resumed
torch.manual_seed(0)
model = DigitsMLP()
loss_fn = nn.CrossEntropyLoss()

# %% [markdown]
# Did the interruption change what was learned? The same 100 steps once more, never interrupted, and the
# two models compared bit for bit:

# %%
resumed_model = model

# %%
%%nbtrain --max-steps 100 --batch-size 32 --no-plot --name straight
torch.manual_seed(0)
model = DigitsMLP()

# %%
bit_identical = all(torch.equal(a, b) for a, b in zip(resumed_model.state_dict().values(), model.state_dict().values()))
print(f"the first run stopped after step {cut.history['step'][-1]} ({cut.status}); the resumed run trained steps "
      f"{resumed.history['step'][0]} to {resumed.history['step'][-1]} ({resumed.status})")
print(f"resumed model == uninterrupted model, every weight bit for bit: {bit_identical}")

fig, ax = plt.subplots(figsize=(6.5, 2.4), layout="constrained")
ax.plot(straight.history["step"], straight.history["loss"], color="lightgrey", lw=5, label="uninterrupted")
ax.plot(cut.history["step"], cut.history["loss"], color="tab:red", lw=1, label="interrupted at step 60")
ax.plot(resumed.history["step"], resumed.history["loss"], color="tab:blue", lw=1, ls="--",
        label="resumed from step 50")
ax.set(xlabel="optimizer step", ylabel="training loss", yscale="log")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The resumed run's losses lie on the uninterrupted run's from step 51 on, its last loss is that run's,
# and the final weights are equal bit for bit (on a CPU in `32-true`; on a GPU, kernels that are not
# deterministic may differ in the last bits): the batches came in the same order, from the same place in
# the epoch, with the same optimizer and random-generator state. Checkpoints work the same with
# `--devices N`: rank 0 writes them, every rank resumes from them (`--strategy fsdp` refuses them,
# notebook 7).
#
# On a cluster nbtrain does this without a flag. The script above asks SLURM to signal every rank 90 s
# before the time limit (`#SBATCH --signal=USR2@90`; a preemption sends the same). submitit's own answer
# would be to checkpoint on rank 0 in the middle of whatever step it is in; nbtrain's ranks instead mark the
# signal in the run folder, agree at their next log window to stop after the same step, rank 0 writes the
# checkpoint there, and only then does submitit requeue the job, whose ranks resume from that checkpoint
# (the project's tests preempt a job on a local cluster and get the weights of an uninterrupted run).
# `--checkpoint-every` adds checkpoints on a schedule, for the crashes that give no warning.
#
# ## A real submission — only where SLURM is
#
# With `sbatch` on this machine and a controller that answers, the recipe is submitted for real as a
# 2-node job and followed from here (this notebook was built against the project's own two-node cluster on
# one machine, `python scripts/slurm_cluster.py start`); otherwise the cell says why it skipped.

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
    job = nbtrain.slurm.submit(recipe(), TrainConfig(num_nodes=2, devices=1, batch_size=32, max_epochs=1,
                                                     accelerator="cpu"), time="00:05:00", cpus_per_task=1)
    print("submitted:", job)
    try:
        job_result = job.wait(timeout=100, echo=False, on_state=lambda state: print("SLURM job:", state))
    finally:
        if not job.state.terminal:
            job.cancel()
    print(job_result.table())

# %% [markdown]
# ## Past SLURM: a Ray cluster
#
# On a cloud or Kubernetes cluster the usual engine is Ray. `pip install "nbtrain[ray]"`, attach the
# kernel to the cluster (`ray.init(address=...)`; without it, a one-machine cluster is started for the
# call), and the same cell with `--launcher ray` (or `nbtrain.fit(..., launcher="ray")`) runs each rank as a
# Ray actor there: live progress in the cell, the weights back in the notebook's model. This notebook does
# not run it: Ray is an
# optional extra of some 500 MB.

# %% [markdown]
# **Takeaway:** a multi-node run is the same DDP run with a rendezvous every node can reach; the global
# batch grows with the nodes (scale the learning rate, notebook 2). nbtrain submits the config you already
# tested in the notebook as a SLURM job (through submitit), or runs it on a Ray cluster (`--launcher ray`).
# Checkpoint long runs (`--checkpoint-every`): `--resume last` continues exactly where the last checkpoint
# left off.
#
# ## Checks

# %%
assert not errors and [r.status for r in results] == ["completed", "completed"]
assert results[0].summary.world_size == 2 and results[0].summary.global_batch == 64
assert max(differences) < 1e-4                       # 2 nodes x 32 == 1 process x 64, on both nodes
assert other > 100 * max(differences)                # ... while batches of 32 in one process are another training
for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
             "#SBATCH --partition=gpu", "#SBATCH --time=30", "#SBATCH --signal=USR2@90", "--kill-on-bad-exit=1",
             "submitit.core._submit"):
    assert line in script, line
assert cut.status == "interrupted" and cut.history["step"][-1] == 60          # stopped at the interrupt...
assert sorted(p.name for p in checkpoints.glob("step-*.pt"))[:2] == ["step-00000025.pt", "step-00000050.pt"]
assert resumed.status == "completed" and resumed.history["step"][0] == 51   # ... resumed from step 50's checkpoint
assert resumed.history["step"][-1] == straight.history["step"][-1] == 100   # ... to the planned end
assert bit_identical                                                        # the weights of an uninterrupted run
assert resumed.summary.last_loss == straight.summary.last_loss
if job_result is not None:
    assert job_result.status == "completed" and job_result.summary.world_size == 2
print("all checks passed")
