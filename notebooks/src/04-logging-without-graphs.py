# requires: nbtrain.tools.leaks
# %% [markdown]
# # 4 · Logging without keeping graphs
#
# **Checklist item:** when you log a number from the training step, log the *number* — not a tensor that
# still carries its autograd graph. A tensor computed with gradients on keeps every intermediate result
# it was computed from alive for as long as you keep it. Keep one per step in a list and memory grows
# step after step until the run dies. (And don't fix it with `.item()` every step on a GPU: that is a
# sync point — notebook 5.)
#
# This notebook reproduces the leak on a live model, lets nbtrain's detector find it and name the line,
# and measures the fix.

# %%
%load_ext nbtrain
import statistics

import torch
from torch import nn
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
torch.manual_seed(0)
train_data, val_data = DigitsDataset(train=True), DigitsDataset(train=False)
model = DigitsMLP(hidden=1024)
loss_fn = nn.CrossEntropyLoss()
probe_x, probe_y = val_data.x, val_data.y   # 360 held-out digits, watched at every step

# %% [markdown]
# ## The leak
#
# A common wish: watch the held-out loss at every step. This training step computes it — with gradients
# on, as everything in a training step is — and keeps it in a list:

# %%
probe_losses = []

def leaky_step(model, batch):
    x, y = batch
    loss = loss_fn(model(x), y)
    probe_losses.append(loss_fn(model(probe_x), probe_y))  # keeps this step's whole probe graph alive
    return loss

# %% [markdown]
# ## Found by the tool
#
# `%%nbtrain --find-leaks` trains a few steps of the cell's recipe on the live model — here with the
# `training_step` the cell names — tracks every tensor that carries a graph, and reports whether they pile
# up: where they are made, what holds them, and the line to change. It puts the model and optimizer back as
# they were afterwards. (From Python: `nbtrain.leaks.find_graph_leaks(model, train_data, training_step=...)`.)

# %%
%%nbtrain --find-leaks --steps 16 --name leaky
training_step = leaky_step

# %% [markdown]
# ## Fixed
#
# Compute what you only *watch* without gradients, and keep it on the device (read it back when you
# print, like nbtrain does with losses):

# %%
probe_losses = []

def fixed_step(model, batch):
    x, y = batch
    loss = loss_fn(model(x), y)
    with torch.no_grad():
        probe_losses.append(loss_fn(model(probe_x), probe_y))  # a plain number on the device, no graph
    return loss


# %%
%%nbtrain --find-leaks --steps 16 --name fixed
training_step = fixed_step

# %%
fig, (left, right) = plt.subplots(1, 2, layout="constrained")
for report, name, color in ((leaky, "leaky", "tab:red"), (fixed, "fixed", "tab:green")):
    steps = range(1, len(report.alive_per_step) + 1)
    left.plot(steps, report.alive_per_step, "o-", color=color, label=name)
    base = report.memory_per_step[0]
    right.plot(steps, [(m - base) / 2**20 for m in report.memory_per_step], "o-", color=color, label=name)
left.set(xlabel="step", ylabel="tensors holding a graph", title="graphs kept alive")
right.set(xlabel="step", ylabel="MB more than after step 1", title="memory")
left.legend()
for ax in (left, right):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
plt.show()
growth = {name: (r.memory_per_step[-1] - r.memory_per_step[0]) / 2**20 for name, r in (("leaky", leaky), ("fixed", fixed))}
# The step-to-step change, as its median: one allocation the process makes for another reason (memory
# measured here is the whole process's) moves one step, not the typical one.
per_step = {name: statistics.median(b - a for a, b in zip(r.memory_per_step, r.memory_per_step[1:])) / 2**20
            for name, r in (("leaky", leaky), ("fixed", fixed))}
print(f"memory over {len(leaky.memory_per_step)} steps: leaky {growth['leaky']:+.0f} MB ({per_step['leaky']:+.1f} MB "
      f"a typical step), fixed {growth['fixed']:+.0f} MB ({per_step['fixed']:+.1f} MB a typical step)")

# %% [markdown]
# Each leaky step kept the activations of a forward pass over 360 probe images; the fixed step keeps one
# number. The same mistake in its most common form is `history.append(loss)` or `total += loss`: smaller
# per step (the graph of a loss that went through `backward()` has already freed its buffers), but it
# grows without end all the same, and the detector finds it the same way.
#
# **Takeaway:** log `.detach()`ed tensors (or compute watched values under `torch.no_grad()`), keep them
# on the device, and read them back every N steps — nbtrain's own loss logging works this way.
#
# ## Checks

# %%
assert leaky.leaking and not fixed.leaking
assert leaky.alive_per_step[-1] > leaky.alive_per_step[1] + 8       # one more kept graph per step
assert max(fixed.alive_per_step) <= 3                                # nothing piles up
assert "leaky_step" in leaky.fix or "probe_losses" in leaky.fix or ".item()" in leaky.fix
assert growth["leaky"] > 20 and per_step["leaky"] > 1.0, per_step  # memory grows step after step...
assert per_step["fixed"] < 0.25 * per_step["leaky"], per_step         # ... and, fixed, a typical step adds nothing
print("all checks passed")
