# requires: nbtrain.tools.diagnose, nbtrain.tools.checklist
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

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
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
# The verdict names the bound and a first thing to try; the ceilings under it (the loader alone, the
# model alone) say by how much the data side binds. It proposes workers up to the cores it sees; waiting
# on storage takes no core, so we go further, to 4 workers, and measure again:

# %%
%%nbtrain --profile --batch-size 32 --accelerator cpu --num-workers 4 --persistent-workers true --name after
# the same recipe (names from the cell above), loaded by 4 worker processes

# %%
fig, ax = plt.subplots(figsize=(7, 2.2), layout="constrained")
for row, d in enumerate((after, before)):
    left = 0.0
    for phase, ms in d.phase_ms.items():
        ax.barh(row, ms, left=left, color=f"C{list(d.phase_ms).index(phase)}", label=phase if row == 0 else None)
        left += ms
ax.set_yticks([0, 1], ["4 workers", "0 workers"])
ax.set_xlabel("ms per optimizer step (measured)")
fig.legend(ncol=6, fontsize=8, loc="outside upper center", frameon=False)
plt.show()
print(f"waiting for data: {100 * before.fractions['data']:.0f}% of the step with 0 workers, "
      f"{100 * after.fractions['data']:.0f}% with 4")

# %% [markdown]
# Each breakdown measured twenty steps, one after the other; the speed-up itself is measured head to head,
# in alternating blocks on the live model:

# %%
workers_verdict = nbtrain.ab(model, train_data, loss_fn=loss_fn, a={"batch_size": 32},
                             b={"batch_size": 32, "num_workers": 4, "persistent_workers": True},
                             block_steps=20, budget_s=8)
print(workers_verdict.text())

# %% [markdown]
# Four workers wait on storage side by side, so the step gets faster beyond doubt — and it is still
# data-bound: the second breakdown's ceilings say the model alone could go many times faster than the
# loader delivers. Its verdict names the next thing to try.
#
# ## The whole checklist, walked automatically
#
# `%nbtrain_checklist` starts from the current settings and tries each item in turn — the data held in
# memory, workers, batch size (with the learning rate scaled), accumulation, device, precision, optimizer
# kernels, channels_last, compile, DDP processes — with short trials on this model. It keeps an item only
# when the head-to-head interval of its speed-up lies above 3%, and says why it skipped the rest, within
# the time budget. Trials never keep their weights; the model ends as it started.

# %%
weights_before = [p.detach().clone() for p in model.parameters()]

# %%
%nbtrain_checklist --budget 30 --batch-size 32 --accelerator cpu --name walk

# %% [markdown]
# The walk's first item is `preload_data`: hold the training data in memory and cut each batch by index,
# in the DataLoader's order. This data set is not a `TensorDataset`, so nbtrain holds it only when asked
# (`preload_data=True`); the walk asks, after checking that a sample read twice comes back the same (no
# random augmentation) and that the data fits in memory — here it is 0.4 MB. Read once, held, the batches
# wait for nothing, and that beats any number of workers: the workers item that follows, measured against
# the data held in memory, only loses. The breakdown looked at one config's phases and pointed to workers;
# the walk compared the fixes head to head and found a better one for this data set. (A data set too large
# to hold, or one that augments at random, gets the reason in the preload row instead, and workers come
# next.) The two items used most of the 30 s budget; the table says which items it had no time for — on
# your own model give the walk minutes (`--budget 120`), not seconds.
#
# Each bar of the waterfall is one kept item's measured change in samples/s, from the starting
# configuration on the left to the best one found on the right. `walk.best_config` is that configuration,
# ready for `nbtrain.fit` (`--keep-best` makes it the default of later `%%nbtrain` cells). When the walk
# keeps a larger batch, its learning-rate note says how the rate was scaled — check the accuracy
# consequence as in notebook 2 before keeping it.
#
# **Takeaway:** measure first (`--profile`), fix the phase that bounds the step, measure again; let
# `%nbtrain_checklist` try the rest on your own model rather than guessing. From Python, the same tools are
# `nbtrain.profile(model, train_data, loss_fn=...)` and `nbtrain.checklist(...)`.
#
# ## Checks

# %%
items = {item.name: item for item in walk.items}
assert before.kind == "data-bound", before.verdict
assert after.fractions["data"] < before.fractions["data"]           # workers shrink the wait...
assert workers_verdict.verdict.faster, workers_verdict.text()        # ... and speed the step up, head to head
assert walk.changes().get("preload_data") is True and items["preload_data"].kept  # the walk holds the data...
assert items["preload_data"].verdict.above(1.0), items["preload_data"].verdict   # ... more than twice as fast
assert not items["workers"].kept                                     # ... and then workers only lose
assert walk.overall().above(0.3), walk.overall()                     # a real speed-up on a data-bound recipe
assert walk.elapsed_s < 30 * 1.5                                     # within its budget (slack for a busy machine)
assert all(torch.equal(a, b) for a, b in zip(weights_before, model.parameters()))  # trials left the model as it was
print("all checks passed")
