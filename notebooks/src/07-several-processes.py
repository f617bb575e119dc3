# requires: nbtrain.launch
# %% [markdown]
# # 7 · Several processes: DistributedDataParallel, launched from the kernel
#
# **Checklist item:** to use several GPUs, run one process per GPU with **DistributedDataParallel**
# (DDP), not `DataParallel`.
#
# | | `DataParallel` (DP) | `DistributedDataParallel` (DDP) |
# |---|---|---|
# | processes | one, with a thread per GPU | one per GPU (or per CPU share) |
# | each step | scatters the batch, **copies the model to every GPU**, gathers outputs on GPU 0 | each process has its own model copy and its own part of the data |
# | gradients | summed on GPU 0 | averaged by all-reduce, overlapped with backward |
# | limits | Python's GIL, GPU 0 does extra work; one machine | scales across GPUs and machines |
#
# In nbtrain: `--devices N` (`devices=N`) runs the cell's recipe as DDP in N fresh worker processes
# started from the kernel. Their metrics stream back live, and the trained weights come back into the
# kernel's model. On a CPU the processes share the cores — good for learning and testing DDP anywhere.

# %%
%load_ext nbtrain
import os
import time

import torch
from torch import nn
from torch.utils.data import Subset
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})
cores = len(os.sched_getaffinity(0))
# One thread per process, the kernel's included (nbtrain gives each of N workers cores / N threads): the
# scaling below is then one core against two, not a contest between thread pools on a busy machine.
torch.set_num_threads(1)
# 1,280 = 20 x 64 digits: every step of every process sees a full batch, so runs compare exactly.
train_data = Subset(DigitsDataset(train=True), range(1280))
val_data = DigitsDataset(train=False)
loss_fn = nn.CrossEntropyLoss()
optimizer = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)

# %% [markdown]
# `DataParallel` needs at least two GPUs, and nbtrain says so instead of failing later:

# %%
try:
    nbtrain.TrainConfig(strategy="dp")
    print("DataParallel is available here (several GPUs)")
except nbtrain.ConfigError as error:
    print(error)

# %% [markdown]
# ## DDP from the kernel
#
# Two processes, 32 samples each per step: a global batch of 64. The cell's model is defined in the
# notebook, shipped to the workers, trained there, and its trained weights are loaded back here.

# %%
%%nbtrain --devices 2 --accelerator cpu --batch-size 32 --max-epochs 4 --name ddp_run
torch.manual_seed(0)
model = DigitsMLP()

# %%
ddp_model = model
with torch.no_grad():
    kernel_accuracy = (ddp_model(val_data.x).argmax(1) == val_data.y).float().mean().item()
print(f"the kernel's model after the DDP run: {100 * kernel_accuracy:.1f}% on the held-out digits")

# %% [markdown]
# ## The same training as one process with the whole batch
#
# DDP averages the gradients of its processes, so 2 processes × 32 samples make the same update as one
# process with 64 — the weights agree to float rounding:

# %%
%%nbtrain --devices 1 --accelerator cpu --batch-size 64 --max-epochs 4 --name single_run
torch.manual_seed(0)
model = DigitsMLP()

# %%
single_model = model
difference = max((a - b).abs().max().item() for a, b in zip(ddp_model.parameters(), single_model.parameters()))
print(f"global batch: DDP {ddp_run.summary['global_batch']}, single {single_run.summary['global_batch']}; "
      f"optimizer steps: {ddp_run.summary['steps']} and {single_run.summary['steps']}")
print(f"largest weight difference: {difference:.1e}")

# %% [markdown]
# ## Scaling: 1 process vs 2, measured
#
# Whether two processes are faster depends on how much work each step has next to the cost of averaging
# gradients between processes. Two models: the small MLP, and a wide one (1,024 hidden units) with far
# more arithmetic per step. Same global batch and epochs; *wall* includes starting the processes.

# %%
def measure(devices, hidden):
    torch.manual_seed(0)
    started = time.perf_counter()
    result = nbtrain.fit(DigitsMLP(hidden), train_data, loss_fn=loss_fn, optimizer=optimizer, accelerator="cpu",
                         devices=devices, batch_size=128 // devices, max_epochs=4)
    return result.summary["samples_per_s"], time.perf_counter() - started

scaling = {(hidden, devices): measure(devices, hidden) for hidden in (128, 1024) for devices in (1, 2)}
fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
for i, devices in enumerate((1, 2)):
    ax.bar([j + 0.38 * i for j in range(2)], [scaling[(h, devices)][0] for h in (128, 1024)], 0.38,
           label=f"{devices} process{'es' if devices > 1 else ''}")
ax.set_xticks([0.19, 1.19], ["small MLP (128)", "wide MLP (1024)"])
ax.set(ylabel="samples/s (measured)", title=f"DDP on {cores} CPU cores")
ax.set_yscale("log")
ax.legend()
plt.show()
for (hidden, devices), (rate, wall) in scaling.items():
    print(f"hidden {hidden:>4}, {devices} process(es): {rate:9,.0f} samples/s, wall {wall:.1f} s")
for hidden in (128, 1024):
    ratio = scaling[(hidden, 2)][0] / scaling[(hidden, 1)][0]
    print(f"hidden {hidden:>4}: 2 processes run at {ratio:.2f}x the speed of 1")

# %% [markdown]
# Read it honestly. Two effects compete: each process does half the arithmetic, and every step the
# processes average their gradients. The small model has little arithmetic to halve, so the averaging
# weighs heavily; the wide model has about sixty times more arithmetic per step, so it can gain — when a
# second core is actually free. On a small or busy machine (like the one that rendered this page) these
# numbers move from run to run: measure on yours. On GPUs the same trade holds, with NCCL over fast links
# making the all-reduce cheap and overlapped with backward — that is why DDP scales where DataParallel does not.
#
# **Takeaway:** `--devices N` runs your notebook's model as DDP without leaving the notebook; the result
# equals a single process with the whole global batch, so scale the learning rate as for any larger
# batch (notebook 2), and measure whether the extra processes pay for their communication.
#
# ## Checks

# %%
assert ddp_run.status == "completed" and ddp_run.summary["world_size"] == 2
assert ddp_run.summary["global_batch"] == single_run.summary["global_batch"] == 64
assert ddp_run.summary["steps"] == single_run.summary["steps"]
assert kernel_accuracy > 0.85          # the trained weights came back into the kernel's model
assert difference < 1e-4               # DDP with 2 x 32 equals one process with 64
assert all(rate > 0 for rate, _ in scaling.values())
print("all checks passed")
