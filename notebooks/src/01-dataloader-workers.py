# %% [markdown]
# # 1 · DataLoaders and workers: keep the model fed
#
# **Checklist item:** load batches in background worker processes (`num_workers > 0`) so the next
# batch is ready while the model trains on this one. When loading is slow — files on a network disk,
# image decoding, augmentation — a training step spends most of its time *waiting for data*, and more
# workers are the cure.
#
# In nbtrain: `num_workers` (plus `persistent_workers`, `prefetch_factor`). Every run splits its step
# time into phases, so you can *see* the data phase shrink.

# %%
import time
import warnings

import torch
from torch import nn
from torch.utils.data import Dataset
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})
# Below we deliberately start more workers than cores (waiting on storage needs no core); torch warns
# about that on every loader, so that one warning is silenced here.
warnings.filterwarnings("ignore", message="This DataLoader will create")

# %% [markdown]
# ## A data-bound recipe
#
# The digits, read one at a time from "slow storage": each sample costs 2 ms of waiting (standing in
# for a read from a network file system or an object store) before it is returned, so a batch of 32
# takes over 60 ms to load — many times what the model (an MLP with 512 hidden units) needs to train
# on it.

# %%
class SlowStorageDigits(Dataset):
    def __init__(self, latency_s=0.002, samples=480):
        self.digits = DigitsDataset(train=True)
        self.latency_s, self.samples = latency_s, samples

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        time.sleep(self.latency_s)  # waiting on storage: no CPU used, so workers overlap it fully
        return self.digits[index]

train_data = SlowStorageDigits()


def train(workers, data=train_data, epochs=4):
    torch.manual_seed(0)
    return nbtrain.fit(DigitsMLP(hidden=512), data, loss_fn=nn.CrossEntropyLoss(), batch_size=32, max_epochs=epochs,
                       num_workers=workers, persistent_workers=workers > 0, name=f"{workers} workers")

# %% [markdown]
# ## Worker count swept
#
# The same training with 0 (load in the training process), 1, 2, 4 and 8 workers:

# %%
worker_counts = [0, 1, 2, 4, 8]
runs = {n: train(n) for n in worker_counts}
speed = {n: r.summary["samples_per_s"] for n, r in runs.items()}
data_share = {n: r.summary["phase_fraction"]["data"] for n, r in runs.items()}

fig, (left, right) = plt.subplots(1, 2, layout="constrained")
left.plot(worker_counts, [speed[n] for n in worker_counts], "o-")
left.set(xlabel="num_workers", ylabel="samples/s (measured)", title="speed")
right.bar([str(n) for n in worker_counts], [100 * data_share[n] for n in worker_counts], color="tab:red")
right.set(xlabel="num_workers", ylabel="% of step time", title="waiting for data", ylim=(0, 100))
plt.show()
for n in worker_counts:
    print(f"{n} workers: {speed[n]:7,.0f} samples/s, {100 * data_share[n]:3.0f}% of each step waiting for data")

# %% [markdown]
# With no workers, nearly every step is spent waiting for data. Each worker prepares whole batches in
# parallel, so the wait shrinks as workers are added; with enough of them the model, not the data,
# becomes the slower side, and more workers stop helping. The losses are the same in every run: workers change *when* a batch is ready, not which one:

# %%
same_losses = all(r.history["loss"] == runs[0].history["loss"] for r in runs.values())
print("identical losses with every worker count:", same_losses)

# %% [markdown]
# ## When loading needs the CPU
#
# Waiting on storage costs no CPU, so even 8 workers on a small machine overlap it. Decoding and
# augmentation are different: they compete for the same cores as training. Here each sample is
# augmented with real arithmetic instead of waiting (a blurred, noisy, shifted copy of the image):

# %%
class AugmentedDigits(Dataset):
    def __init__(self, samples=320, rounds=40):
        self.digits = DigitsDataset(train=True, image=True)
        self.samples, self.rounds = samples, rounds
        self.kernel = torch.full((1, 1, 3, 3), 1 / 9)

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        image, label = self.digits[index]
        for _ in range(self.rounds):  # CPU work per sample
            image = torch.nn.functional.conv2d(image[None], self.kernel, padding=1)[0] + 0.01 * torch.randn_like(image)
        return image.flatten(), label

cpu_counts = [0, 1, 2, 4]
cpu_runs = {n: train(n, AugmentedDigits(), epochs=1) for n in cpu_counts}
cores = len(__import__("os").sched_getaffinity(0))
plt.figure(figsize=(5, 3))
plt.plot(cpu_counts, [cpu_runs[n].summary["samples_per_s"] for n in cpu_counts], "o-", color="tab:purple")
plt.axvline(cores, color="grey", ls="--", label=f"{cores} CPU cores")
plt.xlabel("num_workers")
plt.ylabel("samples/s (measured)")
plt.legend()
plt.show()
for n in cpu_counts:
    print(f"{n} workers: {cpu_runs[n].summary['samples_per_s']:7,.0f} samples/s")

# %% [markdown]
# CPU-bound loading can gain at most about the number of *free* cores: beyond that, workers queue for
# the same cores as the training process, and starting them costs time too. On a small or shared
# machine that can mean no gain at all — measure on yours.
#
# **Takeaway:** if a run's *data* phase is a large share of its step time, add workers — starting near
# the number of cores, more when loading mostly waits on storage — and keep them alive between epochs
# (`persistent_workers=True`). The checklist tools search the count for you on your own model.
#
# ## Checks

# %%
assert data_share[0] > 0.5                              # the recipe really is data-bound without workers
assert speed[4] > 1.5 * speed[0]                        # workers overlap the loading
assert data_share[4] < data_share[0]                    # ... and the waiting shrinks
assert same_losses                                      # workers change timing, not training
assert all(r.status == "completed" for r in cpu_runs.values())
print("all checks passed")
