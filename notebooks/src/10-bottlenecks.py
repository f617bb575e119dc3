# requires: nbtrain.diagnose, nbtrain.checklist
# %% [markdown]
# # 10 · Find the bottleneck first — then let the checklist walk itself
#
# **Checklist item:** before trying speed-ups, find out where a training step's time goes. A data-bound
# run gains nothing from mixed precision; a compute-bound one gains nothing from more workers.
#
# In nbtrain: `nbtrain.profile(...)` measures a few steps of your live model phase by phase — data,
# host→device copy, forward, backward, optimizer — and says which one bounds the step and what to try.
# `nbtrain.checklist(...)` then walks the whole checklist on the same model within a time budget,
# measuring every candidate, and draws the gains as a waterfall.

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
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores, on purpose


class SlowStorageDigits(Dataset):
    """The digits, each read with 1 ms of storage latency (as in notebook 1)."""

    def __init__(self, latency_s=0.001):
        self.digits, self.latency_s = DigitsDataset(train=True), latency_s

    def __len__(self):
        return len(self.digits)

    def __getitem__(self, index):
        time.sleep(self.latency_s)
        return self.digits[index]


torch.manual_seed(0)
model = DigitsMLP()
train_data = SlowStorageDigits()
loss_fn = nn.CrossEntropyLoss()
start = nbtrain.TrainConfig(batch_size=32, accelerator="cpu")

# %% [markdown]
# ## The breakdown
#
# Twenty measured steps of the live model (the model and optimizer are put back afterwards):

# %%
before = nbtrain.profile(model, train_data, loss_fn=loss_fn, config=start, steps=20)
print(before.table())
before.plot();

# %% [markdown]
# The verdict names the bound and a first thing to try. It proposes workers up to the cores it sees;
# waiting on storage takes no core, so we go further, to 4 workers, and measure again:

# %%
after = nbtrain.profile(model, train_data, loss_fn=loss_fn, config=start.replace(num_workers=4, persistent_workers=True),
                        steps=20)
print(after.table())

fig, ax = plt.subplots(figsize=(8, 2.4), layout="constrained")
for row, (label, d) in enumerate((("before", before), ("4 workers", after))):
    left = 0.0
    for phase, ms in d.phase_ms.items():
        ax.barh(row, ms, left=left, color=f"C{list(d.phase_ms).index(phase)}", label=phase if row == 0 else None)
        left += ms
ax.set_yticks([0, 1], ["before", "4 workers"])
ax.set_xlabel("ms per optimizer step (measured)")
ax.legend(ncol=5, fontsize=8, loc="lower right")
plt.show()

# %% [markdown]
# ## The whole checklist, walked automatically
#
# `nbtrain.checklist` starts from the current settings and tries each item in turn — workers, batch size
# (with the learning rate scaled), accumulation, device, precision, DDP processes — with short timed
# trials on this model, keeping an item only when it measurably helps, within the time budget. Trials never
# keep their weights; the model ends as it started.

# %%
weights_before = [p.detach().clone() for p in model.parameters()]
walk = nbtrain.checklist(model, train_data, loss_fn=loss_fn, config=start, budget_s=25)
print(walk.table())
walk.plot();

# %% [markdown]
# Each bar of the waterfall is one checklist item's measured change in samples/s, from the starting
# configuration on the left to the best one found on the right. `walk.best_config` is that configuration,
# ready for `nbtrain.fit` or `%%nbtrain --config`; the walk's learning-rate note says how the rate was
# scaled for a larger batch — check the accuracy consequence as in notebook 2 before keeping it.
#
# **Takeaway:** measure first (`nbtrain.profile`), fix the phase that bounds the step, measure again; let
# `nbtrain.checklist` try the rest on your own model rather than guessing.
#
# ## Checks

# %%
assert before.kind == "data-bound", before.verdict
assert after.fractions["data"] < before.fractions["data"] and after.samples_per_s > 1.3 * before.samples_per_s
assert walk.final > 1.3 * walk.baseline                 # the walk found a real speed-up on a data-bound recipe
assert "num_workers" in walk.changes()                  # ... starting with the item the breakdown pointed to
assert walk.elapsed_s < 25 * 1.5                        # within its budget (with slack for a busy machine)
assert all(torch.equal(a, b) for a, b in zip(weights_before, model.parameters()))  # trials left the model as it was
print("all checks passed")
