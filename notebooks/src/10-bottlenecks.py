# requires: nbtrain.diagnose, nbtrain.checklist
# %% [markdown]
# # 10 · Find the bottleneck first — then let the checklist walk itself
#
# **Checklist item:** before trying speed-ups, find out where a training step's time goes. A data-bound
# run gains nothing from mixed precision; a compute-bound one gains nothing from more workers.
#
# In nbtrain: `%%nbtrain --profile` (or `nbtrain.profile(...)`) measures a few steps of your live model
# phase by phase — data, host→device copy, forward, backward, optimizer — and says which one bounds the
# step and what to try. `%nbtrain_checklist` (or `nbtrain.checklist(...)`) then walks the whole checklist
# on the same model within a time budget, measuring every candidate, and draws the gains as a waterfall.

# %%
import time
import warnings

import torch
from torch import nn
from torch.utils.data import Dataset
import matplotlib.pyplot as plt

%load_ext nbtrain
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

# %% [markdown]
# ## The breakdown
#
# `--profile` in place of a training run: the cell defines the recipe as usual, and twenty steps of the
# live model are measured (the model and optimizer are put back afterwards):

# %%
%%nbtrain --profile --batch-size 32 --accelerator cpu --name before
torch.manual_seed(0)
model = DigitsMLP()
train_data = SlowStorageDigits()
loss_fn = nn.CrossEntropyLoss()

# %% [markdown]
# The verdict names the bound and a first thing to try. It proposes workers up to the cores it sees;
# waiting on storage takes no core, so we go further, to 4 workers, and measure again:

# %%
%%nbtrain --profile --batch-size 32 --accelerator cpu --num-workers 4 --persistent-workers true --name after
# the same recipe (names from the cell above), loaded by 4 worker processes

# %%
fig, ax = plt.subplots(figsize=(8, 2.4), layout="constrained")
for row, d in enumerate((before, after)):
    left = 0.0
    for phase, ms in d.phase_ms.items():
        ax.barh(row, ms, left=left, color=f"C{list(d.phase_ms).index(phase)}", label=phase if row == 0 else None)
        left += ms
ax.set_yticks([0, 1], ["0 workers", "4 workers"])
ax.set_xlabel("ms per optimizer step (measured)")
ax.legend(ncol=5, fontsize=8, loc="lower right")
plt.show()
print(f"{before.samples_per_s:,.0f} -> {after.samples_per_s:,.0f} samples/s; "
      f"waiting for data {100 * before.fractions['data']:.0f}% -> {100 * after.fractions['data']:.0f}% of the step")

# %% [markdown]
# ## The whole checklist, walked automatically
#
# `nbtrain.checklist` starts from the current settings and tries each item in turn — workers, batch size
# (with the learning rate scaled), accumulation, device, precision, DDP processes — with short timed
# trials on this model, keeping an item only when it measurably helps, within the time budget. Trials never
# keep their weights; the model ends as it started.

# %%
weights_before = [p.detach().clone() for p in model.parameters()]

# %%
%nbtrain_checklist --budget 25 --batch-size 32 --accelerator cpu --name walk

# %% [markdown]
# Each bar of the waterfall is one checklist item's measured change in samples/s, from the starting
# configuration on the left to the best one found on the right. `walk.best_config` is that configuration,
# ready for `nbtrain.fit` (`--keep-best` makes it the default of later `%%nbtrain` cells); the walk's learning-rate note says how the rate was
# scaled for a larger batch — check the accuracy consequence as in notebook 2 before keeping it.
#
# **Takeaway:** measure first (`--profile`), fix the phase that bounds the step, measure again; let
# `%nbtrain_checklist` try the rest on your own model rather than guessing. From Python, the same tools are
# `nbtrain.profile(model, train_data, loss_fn=...)` and `nbtrain.checklist(...)`.
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
