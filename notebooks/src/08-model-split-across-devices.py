# requires: nbtrain.engine.split, nbtrain.distributed.launch
# %% [markdown]
# # 8 · A model split across devices, and combined with DDP
#
# **Checklist item:** when a model does not fit on one GPU, put its parts on different GPUs — the encoder
# on `cuda:0`, the decoder on `cuda:1` — and let the activations cross between them. Each device then
# holds only its part's weights, gradients and optimizer state. This combines with DDP: each process
# gets its own set of devices (4 GPUs = 2 processes × 2 parts).
#
# In nbtrain: `nbtrain.split(model, {"encoder": "cuda:0", "decoder": "cuda:1"})` places the parts and moves
# activations between them; the engine then leaves each part where it is. Here it runs with CPU
# "devices" — every part on `cpu` — which exercises the same mechanism; the **[GPU]** cell uses two GPUs
# when present.

# %%
import torch
from torch import nn
from torch.utils.data import Subset
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset
from nbtrain.measure import paired
from nbtrain.engine.split import device_map

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
torch.set_num_threads(1)
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"CUDA GPUs: {gpus}" + ("" if gpus >= 2 else " ([GPU] cell skipped: it needs 2)"))
train_data = Subset(DigitsDataset(train=True), range(1280))
val_data = DigitsDataset(train=False)


class EncoderDecoder(nn.Module):
    def __init__(self, width=512):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def fresh():
    torch.manual_seed(0)
    return EncoderDecoder()


adam = lambda params: torch.optim.Adam(params, lr=1e-3)  # every run below trains with the same optimizer

# %% [markdown]
# ## What each device holds
#
# Training with Adam keeps, per parameter, the weight, its gradient and two moment estimates: four
# float32 numbers. Counted from the live model:

# %%
def training_bytes(module):
    return 4 * sum(p.numel() * p.element_size() for p in module.parameters())

model = fresh()
held = {"whole model\non one device": training_bytes(model), "encoder\n(device 0)": training_bytes(model.encoder),
        "decoder\n(device 1)": training_bytes(model.decoder)}
plt.figure(figsize=(5.5, 2.6))
plt.bar(list(held), [b / 2**20 for b in held.values()], color=["grey", "tab:blue", "tab:orange"])
plt.ylabel("MiB: weights, grads, Adam state")
plt.show()
for name, b in held.items():
    print(f"{name.replace(chr(10), ' '):28} {b / 2**20:6.2f} MiB")

# %% [markdown]
# ## Split, and what crosses between the parts
#
# `split` moves each part to its device and adds hooks that carry activations across. Every step, the
# encoder's output goes to the decoder's device, and its gradient comes back in backward — we measure
# those bytes with a hook on the encoder:

# %%
nbtrain.split(model, {"encoder": "cpu", "decoder": "cpu"})  # on two GPUs: "cuda:0", "cuda:1"
print("device map:", device_map(model))
crossing = []
hook = model.encoder.register_forward_hook(lambda module, args, output: crossing.append(output.nbytes))
split_run = nbtrain.fit(model, train_data, val_data=val_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam,
                        accelerator="cpu", batch_size=64, max_epochs=2, name="split")
hook.remove()
per_step = crossing[0]
print(f"{len(crossing)} forward passes (training and validation); {per_step / 1024:.0f} KiB of activations cross forward each step "
      f"(and as much gradient back) — small next to the {held['decoder' + chr(10) + '(device 1)'] / 2**20:.1f} MiB "
      "the decoder's device holds")

# %% [markdown]
# The split model trains exactly like the model in one piece (on CPU "devices" nothing else changes):

# %%
whole = fresh()
whole_run = nbtrain.fit(whole, train_data, val_data=val_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam,
                        accelerator="cpu", batch_size=64, max_epochs=2, name="whole")
split_vs_whole = max((a - b).abs().max().item() for a, b in zip(model.parameters(), whole.parameters()))
print(f"largest weight difference, split vs whole: {split_vs_whole:.1e}; "
      f"held-out accuracy {100 * split_run.summary.val_acc:.1f}% and {100 * whole_run.summary.val_acc:.1f}%")

fig, ax = plt.subplots(figsize=(5.5, 2.4), layout="constrained")
ax.plot(whole_run.history["samples"], whole_run.history["loss"], lw=3, alpha=0.5, label="whole model")
ax.plot(split_run.history["samples"], split_run.history["loss"], "--", label="split: encoder | decoder")
ax.set(xlabel="samples seen", ylabel="training loss", title="Adam, batch 64: the same curve")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# What does the split cost in time? On CPU "devices" no bytes actually move — only the hooks run — so it
# should cost next to nothing; measured, with runs alternating whole, split, whole, split, ... (five pairs,
# a paired verdict as in notebook 7):

# %%
def steady_rate(split_it):
    net = fresh()
    if split_it:
        nbtrain.split(net, {"encoder": "cpu", "decoder": "cpu"})
    return nbtrain.fit(net, train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam, accelerator="cpu",
                       batch_size=64, max_epochs=6).steady().rate

rates = {False: [], True: []}
for _ in range(5):
    for split_it in (False, True):
        rates[split_it].append(steady_rate(split_it))
split_cost = paired(rates[False], rates[True])
print(f"split against whole, on CPU devices: {split_cost.text()}")

# %% [markdown]
# On CPU devices the verdict above finds no large cost either way. On two GPUs the activations really
# cross (here 128 KiB forward and back per step — small next to the compute of a model that needs two
# GPUs), and, worse, only one part works at a time: the encoder's GPU idles while the decoder runs.
# Pipelining micro-batches through the parts removes most of that idle time.
#
# ## Split and DDP together
#
# Two processes, each with its own split copy of the model, 32 samples each: the same update as one process
# with 64. The weights come back into the kernel's split model.

# %%
ddp_model = nbtrain.split(fresh(), {"encoder": "cpu", "decoder": "cpu"})
ddp_run = nbtrain.fit(ddp_model, train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam, accelerator="cpu",
                      devices=2, batch_size=32, max_epochs=2, name="split + DDP")
single = nbtrain.split(fresh(), {"encoder": "cpu", "decoder": "cpu"})
single_run = nbtrain.fit(single, train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam, accelerator="cpu",
                         devices=1, batch_size=64, max_epochs=2, name="split, 1 process")
ddp_vs_single = max((a - b).abs().max().item() for a, b in zip(ddp_model.parameters(), single.parameters()))
print(f"split + DDP (2 x 32) vs one split process (64): largest weight difference {ddp_vs_single:.1e}")

# %% [markdown]
# ## [GPU] Two GPUs: the memory really is divided
#
# With two GPUs the same split puts the parts on `cuda:0` and `cuda:1`; each device's peak memory shows
# what it held.

# %%
gpu_peaks = {}
if gpus < 2:
    print("skipped: needs 2 CUDA GPUs")
else:
    gpu_model = nbtrain.split(EncoderDecoder(width=4096), {"encoder": "cuda:0", "decoder": "cuda:1"})
    for index in range(2):
        torch.cuda.reset_peak_memory_stats(index)
    nbtrain.fit(gpu_model, train_data, loss_fn=nn.CrossEntropyLoss(), optimizer=adam, accelerator="cuda",
                batch_size=64, max_epochs=1)
    gpu_peaks = {f"cuda:{i}": torch.cuda.max_memory_allocated(i) for i in range(2)}
    print({k: f"{v / 2**20:.0f} MiB" for k, v in gpu_peaks.items()},
          f"vs {training_bytes(gpu_model) / 2**20:.0f} MiB for the whole model's training state")

# %% [markdown]
# **Takeaway:** split a model across devices only when it does not fit on one — each step waits for the
# activations to cross, and only one part works at a time (pipelining the micro-batches removes that idle
# time). When it fits, plain DDP is simpler and keeps every device busy. Both combine: DDP over processes, each with a
# split model.
#
# ## Checks

# %%
encoder_b, decoder_b = training_bytes(model.encoder), training_bytes(model.decoder)
assert encoder_b + decoder_b == held["whole model\non one device"] and max(encoder_b, decoder_b) < 0.7 * (encoder_b + decoder_b)
assert device_map(model) == {"encoder": "cpu", "decoder": "cpu"}
assert per_step == 64 * 512 * 4                      # one batch of encoder outputs crosses per step
assert split_vs_whole < 1e-6                          # splitting changes where, not what
assert ddp_run.status == "completed" and ddp_vs_single < 1e-4
assert not split_cost.above(0.1) and split_cost.high > 0.9, split_cost  # on CPU devices: no large cost either way
if gpus >= 2:
    assert max(gpu_peaks.values()) < 0.8 * sum(gpu_peaks.values())  # neither GPU holds it all
print("all checks passed")
