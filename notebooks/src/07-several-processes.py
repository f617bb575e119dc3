# requires: nbtrain.distributed.launch
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
# For a model too big for one device, `--strategy fsdp` shards it across the processes (the last section).

# %%
%load_ext nbtrain
import os

import torch
from torch import nn
from torch.utils.data import Subset, TensorDataset
from torchvision.ops import Conv2dNormActivation
from torchvision.transforms import v2
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.measure import paired

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
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
# `DataParallel` needs at least two GPUs, and nbtrain says so before anything trains:

# %%
try:
    nbtrain.fit(DigitsMLP(), train_data, loss_fn=loss_fn, strategy="dp", max_steps=1)
    dp_message = "DataParallel ran here (several GPUs)"
except nbtrain.ConfigError as error:
    dp_message = str(error)
print(dp_message)

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
print(f"global batch: DDP {ddp_run.summary.global_batch}, single {single_run.summary.global_batch}; "
      f"optimizer steps: {ddp_run.summary.steps} and {single_run.summary.steps}")
print(f"largest weight difference: {difference:.1e}")

# %% [markdown]
# The DDP run's live plot and summary follow rank 0: its training loss is the loss of its own 32 samples,
# not of the global batch of 64, so its curve and last loss differ from the single process's — compare the
# weights, as here, not those two losses. The held-out numbers, computed with the trained weights, agree.
#
# ## Scaling: 1 process vs 2, measured
#
# Whether two processes are faster depends on how much arithmetic each step has next to the cost of
# averaging the gradients between processes every step. Two models, each trained with 1 process and with
# 2 at the same global batch (each process one thread, so the question is one core against two):
#
# * the small MLP of this notebook: 26,000 parameters to average, and as many multiply-adds per sample;
# * a small convolutional network on the digits as 16×16 images: 56,000 parameters, but about 1.8 million
#   multiply-adds per sample in the forward pass (the MLP: 26,000) — far more arithmetic for each number
#   averaged.
#
# Processes start fresh for every run, so 1 and 2 cannot alternate in short blocks on one live model as
# `nbtrain.ab` does; instead the runs alternate 1, 2, 1, 2, ... (five pairs) and each pair gives one ratio of steady
# rates — a paired verdict, so a load that drifts on the machine falls on both sides.

# %%
digit_images = DigitsDataset(train=True, image=True)
image_data = TensorDataset(v2.Resize(16, antialias=True)(digit_images.x[:1280]), digit_images.y[:1280])


def make_cnn():
    return nn.Sequential(Conv2dNormActivation(1, 32, norm_layer=None), Conv2dNormActivation(32, 64, 3, 2, norm_layer=None),
                         Conv2dNormActivation(64, 64, 3, 2, norm_layer=None), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def steady_rate(make_model, data, devices):
    torch.manual_seed(0)
    result = nbtrain.fit(make_model(), data, loss_fn=loss_fn, optimizer=optimizer, accelerator="cpu",
                         devices=devices, batch_size=128 // devices, max_epochs=4)
    return result.steady().rate


scaling = {}
for name, make_model, data in (("small MLP", DigitsMLP, train_data), ("CNN", make_cnn, image_data)):
    rates = {1: [], 2: []}
    for _ in range(5):
        for devices in (1, 2):
            rates[devices].append(steady_rate(make_model, data, devices))
    scaling[name] = paired(rates[1], rates[2])
    print(f"{name:>9}, samples/s with 1 process: {', '.join(f'{r:,.0f}' for r in rates[1])}; "
          f"with 2: {', '.join(f'{r:,.0f}' for r in rates[2])}")
    print(f"{'':>9}  2 processes against 1: {scaling[name].text()}")

fig, ax = plt.subplots(figsize=(5.5, 1.9), layout="constrained")
names = list(scaling)
ax.errorbar([scaling[n].ratio for n in names], range(len(names)), fmt="o", capsize=4,
            xerr=[[scaling[n].ratio - scaling[n].low for n in names], [scaling[n].high - scaling[n].ratio for n in names]])
ax.axvline(1, color="grey", ls="--", lw=1)
ax.set_yticks(range(len(names)), names)
ax.set_ylim(-0.5, len(names) - 0.5)
ax.set_xlabel(f"2 processes against 1 (x, 95% interval), {cores} CPU cores")
plt.show()

# %% [markdown]
# Read it honestly. The small MLP has little arithmetic to halve, so averaging its gradients every step
# weighs heavily, and two processes are slower than one. The CNN has far more arithmetic for each number
# it averages, so it scales measurably better than the MLP. Whether it gains outright depends on a second
# core being actually free: this page was rendered on a small machine shared with other programs, and the
# verdict above is what the CNN gained (or lost) there. On GPUs the same trade holds, with NCCL over fast
# links making the all-reduce cheap and overlapped with backward — that is why DDP scales where
# DataParallel does not.
#
# ## Before asking for more: a forecast, then the run that checks it
#
# How fast would 4 or 8 processes be, or 2 machines? `nbtrain.forecast` answers from what this machine
# measures, as a range for each count, and names what bounds it. It reads the compute of one step at
# the per-process batch (on a CPU, of 2 processes at once: they share the cores), the bytes of gradients
# DDP averages every step (the model's parameters, in DDP's buckets), and the link between 2 local
# processes, timed on all-reduces of those very bucket sizes. A ring all-reduce of S bytes on N processes
# takes `2(N-1)/N * S / bandwidth + 2(N-1) * latency`; DDP overlaps it with backward somewhere between not
# at all (the low end of each range) and fully (the high end). The link between machines is not
# measured here, so it is given: 10 Gb/s at 50 us. `check=True` then runs the 2 processes this machine
# has, with the same config, and shows the measured rate against its range. The CNN above, 64 samples
# per process:

# %%
forecast = nbtrain.forecast(make_cnn(), image_data, loss_fn=loss_fn, optimizer=optimizer,
                            config=nbtrain.TrainConfig(accelerator="cpu", batch_size=64), devices=[1, 2, 4, 8],
                            nodes=[1, 2], link_gbps=10, link_latency_us=50, check=True, seconds=3)
print(forecast)
forecast.plot()
plt.show()

# %% [markdown]
# Every input says where it came from: measured here, given, or assumed. The 2-process run is the
# forecast's own test; in words, from the numbers above:

# %%
check, two, eight = forecast.checks[0], forecast.point(2, 1), forecast.point(8, 2)
print(f"2 processes: forecast {two.throughput[0]:,.0f}-{two.throughput[1]:,.0f} samples/s, measured "
      f"{check.steady.rate:,.0f} (95% interval {check.steady.low:,.0f}-{check.steady.high:,.0f}): "
      f"{'inside' if check.inside else 'outside'} the forecast")
print(f"16 processes on 2 machines: per-process efficiency {100 * eight.efficiency[0]:.0f}-"
      f"{100 * eight.efficiency[1]:.0f}%, bound by {eight.why}")

# %% [markdown]
# A model with more arithmetic per parameter keeps more of each added process; one whose all-reduce
# outlasts its compute gains little from more processes whatever the link, and the remedies under the
# table (gradient accumulation: one all-reduce per several batches; a larger batch per process) say by
# how much each would help, predicted by the same model.
#
# ## When the model does not fit one device: FSDP
#
# DDP keeps a whole copy of the model in every process: its weights, their gradients and the optimizer's
# state (momentum here; Adam keeps two numbers per weight). When that no longer fits one GPU, **FSDP**
# (Fully Sharded Data Parallel) shards all three across the processes: with N processes each holds 1/N
# of every parameter, gradient and optimizer state, and a block's full weights are gathered only for the
# moment of its forward and its backward, then freed. The price is communication: every step gathers the
# weights for the forward and again for the backward, and scatters the gradients — more traffic than
# DDP's one all-reduce of the gradients.
#
# In nbtrain: `--strategy fsdp --devices N` (torch's FSDP2, `fully_shard`; gloo on the CPU, NCCL on
# GPUs). The same model, seed and batches as the DDP run at the top (`--no-plot`: its curves are that
# run's):

# %%
%%nbtrain --devices 2 --strategy fsdp --accelerator cpu --batch-size 32 --max-epochs 4 --no-plot --name fsdp_run
torch.manual_seed(0)
model = DigitsMLP()

# %% [markdown]
# The workers trained a sharded model; what came back into the kernel is the whole model, gathered from
# the shards — plain tensors of their full shapes, holding the weights DDP trained (the second line is the
# largest difference from them):

# %%
fsdp_model = model
fsdp_difference = max((a - b).abs().max().item() for a, b in zip(fsdp_model.parameters(), ddp_model.parameters()))
print(f"the kernel's model after the FSDP run: {type(next(fsdp_model.parameters())).__name__}s of shapes "
      f"{[tuple(p.shape) for p in fsdp_model.parameters()]}")
print(f"largest weight difference from the DDP run: {fsdp_difference:.1e}")
per_rank = lambda run: ", ".join(f"{mb:.0f} MB" for mb in run.summary.peak_mem_mb_per_rank)
print(f"peak memory per rank ({fsdp_run.summary.mem_kind}): FSDP {per_rank(fsdp_run)}; DDP {per_rank(ddp_run)}")

# %% [markdown]
# To see the shards themselves, the same sharding by hand: `nbtrain.launch(fn, nprocs=2)` runs a function
# of this notebook in 2 fresh processes joined in one process group and returns rank 0's value; the
# function shards the model with torch's `fully_shard` and asks each rank what it holds:

# %%
def what_each_rank_holds():
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    sharded = DigitsMLP()
    whole = sum(p.numel() for p in sharded.parameters())
    fully_shard(sharded.net)   # one unit, gathered for its forward and backward
    fully_shard(sharded)
    here = sum(p.to_local().numel() for p in sharded.parameters())  # each parameter is now a DTensor shard
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, here)
    return whole, held, type(next(sharded.parameters())).__name__


whole, held, shard_type = nbtrain.launch(what_each_rank_holds, nprocs=2)
state_mb = 3 * 4 * whole / 2**20   # weights, gradients and momentum, 4 bytes each
print(f"the model: {whole:,} parameters; as {shard_type}s, rank 0 holds {held[0]:,} and rank 1 {held[1]:,}")
print(f"its weights, gradients and momentum in float32: {state_mb:.2f} MB in all")

# %% [markdown]
# Each rank holds half of every parameter — and so half of its gradient and its momentum. The per-rank
# peaks above do not show that saving (FSDP's are, if anything, a little higher than DDP's), and cannot:
# on the CPU a peak is the process's resident memory, hundreds of MB of it PyTorch itself, next to which
# this model's weights, gradients and momentum (the last line) vanish. FSDP is for a model whose
# weights, gradients and optimizer state run to gigabytes on a GPU, where the peak counts tensors only:
# shard them over N GPUs and each holds about 1/N, plus one block gathered at a time.
#
# What the sharding costs in speed, DDP and FSDP alternating (four pairs of runs, as for the scaling
# above):

# %%
def steady_rate_with(strategy):
    torch.manual_seed(0)
    result = nbtrain.fit(DigitsMLP(), train_data, loss_fn=loss_fn, optimizer=optimizer, accelerator="cpu",
                         devices=2, strategy=strategy, batch_size=32, max_epochs=4)
    return result.steady().rate


strategy_rates = {"ddp": [], "fsdp": []}
for _ in range(4):
    for strategy in ("ddp", "fsdp"):
        strategy_rates[strategy].append(steady_rate_with(strategy))
fsdp_vs_ddp = paired(strategy_rates["ddp"], strategy_rates["fsdp"])
print(f"samples/s, DDP: {', '.join(f'{r:,.0f}' for r in strategy_rates['ddp'])}; "
      f"FSDP: {', '.join(f'{r:,.0f}' for r in strategy_rates['fsdp'])}")
print(f"2 processes, FSDP against DDP: {fsdp_vs_ddp.text()}")

# %% [markdown]
# On this tiny model FSDP is several times slower than DDP: each step gathers every weight twice and
# scatters the gradients, for a model with far too little arithmetic to hide those messages behind. It
# trades speed for memory, so reach for it when the model, its gradients and optimizer state do not fit
# one device, not to go faster; on GPUs with fast links the gathering of the next block overlaps the
# compute of the current one, which hides much of that cost. (Checkpoints, `--checkpoint-every`, are
# refused with `--strategy fsdp`: they hold one process's full weights; use DDP to checkpoint.)
#
# **Takeaway:** `--devices N` runs your notebook's model as DDP without leaving the notebook; the result
# equals a single process with the whole global batch, so scale the learning rate as for any larger
# batch (notebook 2), and measure whether the extra processes pay for their communication. When the model
# does not fit one device, `--strategy fsdp` shards it and still hands the whole trained model back.
#
# ## Checks

# %%
assert "DataParallel" in dp_message
assert ddp_run.status == "completed" and ddp_run.summary.world_size == 2
assert ddp_run.summary.global_batch == single_run.summary.global_batch == 64
assert ddp_run.summary.steps == single_run.summary.steps
assert kernel_accuracy > 0.85          # the trained weights came back into the kernel's model
assert difference < 1e-4               # DDP with 2 x 32 equals one process with 64
assert ddp_run.summary.val_acc == single_run.summary.val_acc  # ... and so do the held-out numbers
assert scaling["small MLP"].high < 1.0, scaling["small MLP"]              # the small MLP: 2 processes are slower
assert scaling["CNN"].low > scaling["small MLP"].high, scaling          # the CNN scales measurably better
assert fsdp_run.status == "completed" and fsdp_run.summary.strategy == "fsdp"
assert fsdp_run.summary.world_size == 2 and fsdp_run.summary.global_batch == 64
assert all(type(p) is nn.Parameter for p in fsdp_model.parameters())   # the whole model came back, not shards
assert [p.shape for p in fsdp_model.parameters()] == [p.shape for p in ddp_model.parameters()]
assert fsdp_difference < 1e-4                                           # FSDP trained as DDP did
assert "per rank 0: " in fsdp_run.table() and len(fsdp_run.summary.peak_mem_mb_per_rank) == 2
assert shard_type == "DTensor" and held == [whole // 2, whole - whole // 2]  # each rank held half the model
assert state_mb < 1.0                                                   # ... invisible in a process's RSS
assert fsdp_vs_ddp.high < 1.0, fsdp_vs_ddp.text()                       # on this tiny model FSDP is slower
assert check.inside, forecast.table()                                   # the 2-process run lies in its forecast
assert eight.efficiency[0] < two.efficiency[0]                          # 16 processes over the network keep less
print("all checks passed")
