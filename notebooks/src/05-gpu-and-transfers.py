# %% [markdown]
# # 5 · The GPU, and as few host↔device transfers as possible
#
# **Checklist item:** put the model and each batch on the GPU; copy batches from *pinned* (page-locked)
# host memory with `non_blocking=True` so the copy overlaps the work; and avoid *sync points* —
# `.item()`, `.cpu()`, `print(tensor)`, `if tensor > 0:` — that make the CPU wait for the GPU in the
# middle of the loop.
#
# This notebook runs everywhere. Cells marked **[GPU]** measure on a CUDA GPU when there is one and say
# *skipped* otherwise; everything else runs on the CPU too.

# %%
import time
import warnings

import torch
from torch import nn
from torch.utils.data import TensorDataset
import matplotlib.pyplot as plt

import nbtrain
from nbtrain import TrainConfig
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})
has_gpu = torch.cuda.is_available()
device = torch.device("cuda" if has_gpu else "cpu")
print("training device:", torch.cuda.get_device_name(0) if has_gpu else "cpu (no CUDA GPU: [GPU] cells are skipped)")
train_data, val_data = DigitsDataset(train=True), DigitsDataset(train=False)

# %% [markdown]
# ## Moving the model and the data
#
# `model.to(device)` moves the parameters once; every batch has to be moved each step. nbtrain does
# both: `accelerator="auto"` picks the GPU when there is one, and the time spent moving batches is its
# own phase, **h2d**, in every run's step breakdown.

# %%
torch.manual_seed(0)
model = DigitsMLP()
run = nbtrain.fit(model, train_data, val_data=val_data, loss_fn=nn.CrossEntropyLoss(), accelerator="auto",
                  batch_size=128, max_epochs=2, name="auto")
print("model is on:", next(model.parameters()).device)
print("step time by phase:", {k: f"{100 * v:.0f}%" for k, v in run.summary["phase_fraction"].items()})

# %% [markdown]
# Pinning only helps copies *to a GPU*, so nbtrain pins only then (`pin_memory=None`, the default,
# means "when training on CUDA"; asking for it on a CPU run is ignored rather than warned about on every
# batch):

# %%
for asked in (None, True, False):
    for accelerator in ("cpu", "auto"):
        config = TrainConfig(pin_memory=asked, accelerator=accelerator)
        print(f"pin_memory={str(asked):5} accelerator={accelerator:4} -> pinned batches: {config.pin}")

# %% [markdown]
# ## Sync points: read the loss back every N steps, not every step
#
# `loss.item()` copies one number to the host — and to do it, the CPU waits until the GPU has finished
# *everything* queued so far. Done every step, the CPU can never run ahead and queue the next step
# while the GPU works. nbtrain keeps each step's loss on the device and reads a whole window back in
# one transfer every `log_every_n_steps` steps. Each read-back is one `steps` event in the run's log,
# so we can count them:

# %%
def train_logging_every(n, epochs=3):
    torch.manual_seed(0)
    return nbtrain.fit(DigitsMLP(), train_data, loss_fn=nn.CrossEntropyLoss(), batch_size=32,
                       max_epochs=epochs, log_every_n_steps=n, name=f"every {n}")

sync_runs = {n: train_logging_every(n) for n in (1, 10, 50)}
readbacks = {n: len(r.log.of_type("steps")) for n, r in sync_runs.items()}
steps = sync_runs[1].summary["steps"]

fig, (left, right) = plt.subplots(1, 2, layout="constrained")
left.bar([f"every {n}" for n in readbacks], list(readbacks.values()))
left.set(ylabel="loss read-backs (host syncs)", title=f"{steps} optimizer steps")
right.bar([f"every {n}" for n in sync_runs], [r.summary["samples_per_s"] for r in sync_runs.values()],
          color="tab:orange")
right.set(ylabel="samples/s (measured)", title=f"speed on {device.type}")
plt.show()
for n, r in sync_runs.items():
    print(f"log every {n:>2}: {readbacks[n]:>3} read-backs, {r.summary['samples_per_s']:8,.0f} samples/s, "
          f"same losses: {r.history['loss'] == sync_runs[1].history['loss']}")

# %% [markdown]
# The losses are identical — only *when* they are read changes. On a CPU there is no device to wait
# for, so any difference in speed here is the machine's noise; on a GPU the per-step sync stalls the
# queue (measured in the [GPU] cells below).
#
# ## [GPU] Pinned memory and `non_blocking`
#
# A copy from ordinary (pageable) memory goes through a staging buffer the driver pins on the fly; from
# pinned memory the GPU reads directly, and with `non_blocking=True` the call returns at once, so the
# CPU can go on queueing work while the bytes move.

# %%
def timed_copies(source, non_blocking, repeats=10):
    """(seconds until the calls returned, seconds until the copies were done) per copy."""
    source.to("cuda", non_blocking=non_blocking)  # warm up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        source.to("cuda", non_blocking=non_blocking)
    returned = time.perf_counter() - start
    torch.cuda.synchronize()
    done = time.perf_counter() - start
    return returned / repeats, done / repeats

copies = {}
if not has_gpu:
    print("skipped: no CUDA GPU here")
else:
    batch = torch.randn(16 * 1024 * 1024)  # 64 MiB, a large image batch
    pinned = batch.pin_memory()
    copies = {"pageable": timed_copies(batch, False), "pinned": timed_copies(pinned, False),
              "pinned, non_blocking": timed_copies(pinned, True)}
    for name, (returned, done) in copies.items():
        print(f"{name:>21}: {batch.nbytes / done / 1e9:5.1f} GB/s, control back after {1000 * returned:6.2f} ms "
              f"of {1000 * done:6.2f} ms")
    plt.figure(figsize=(6, 2.5))
    plt.barh(list(copies), [batch.nbytes / d / 1e9 for _, d in copies.values()])
    plt.xlabel("host -> device GB/s")
    plt.show()

# %% [markdown]
# ## [GPU] Finding sync points: CUDA's sync debug mode
#
# `torch.cuda.set_sync_debug_mode("warn")` warns at every operation that makes the CPU wait for the
# GPU — a quick way to find the `.item()` hiding in your loop.

# %%
sync_warnings = []
gpu_sync_runs = {}
if not has_gpu:
    print("skipped: no CUDA GPU here")
else:
    x = torch.randn(256, 64, device="cuda")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = DigitsMLP().cuda()(x).logsumexp(1).mean()
            loss.item()  # the sync
        sync_warnings = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    print(f"{len(sync_warnings)} synchronizing operation(s) found, e.g.: {sync_warnings[0][:100]}")
    gpu_sync_runs = {n: train_logging_every(n, epochs=3) for n in (1, 50)}
    for n, r in gpu_sync_runs.items():
        print(f"on the GPU, log every {n:>2}: {r.summary['samples_per_s']:8,.0f} samples/s")

# %% [markdown]
# **Takeaway:** move the model once and batches every step (nbtrain does both and times the copies as
# *h2d*); let batches come from pinned memory with `non_blocking=True` on CUDA (nbtrain's default there);
# and keep `.item()` out of the step — read losses back every N steps.
#
# ## Checks

# %%
assert next(model.parameters()).device.type == device.type
assert TrainConfig(pin_memory=True, accelerator="cpu").pin is False           # pinning never applies on a CPU run
assert readbacks[1] == steps and readbacks[50] == -(-steps // 50)            # one read-back per N steps, not per step
assert readbacks[50] * 10 < readbacks[1]
assert all(r.history["loss"] == sync_runs[1].history["loss"] for r in sync_runs.values())  # same numbers
if has_gpu:
    assert TrainConfig().pin is True
    (_, pageable_done), (_, pinned_done) = copies["pageable"], copies["pinned"]
    assert pinned_done < 1.05 * pageable_done                                # pinned copies are not slower
    returned, done = copies["pinned, non_blocking"]
    assert returned < 0.5 * done                                              # non_blocking gives control back early
    assert sync_warnings                                                      # .item() is a sync point
print("all checks passed")
