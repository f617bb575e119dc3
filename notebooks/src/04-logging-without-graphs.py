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
leaky_kept = probe_losses  # what the leaky steps kept, counted below
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

# %% [markdown]
# How much memory does each kept value hold? The process's memory (right, below) says it roughly: it also
# moves with whatever else the allocator does. Counted exactly: walk the graph behind every kept tensor and
# add up the tensors autograd saved in it for a backward pass that never comes (each once; the weights,
# which the model holds anyway, left out).

# %%
fixed_kept = probe_losses


def kept_bytes(tensors):
    """Bytes the tensors and the autograd graphs behind them keep alive (each storage once, weights left out)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages, seen, todo = {}, set(), [t.grad_fn for t in tensors]
    for t in tensors:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_saved_"):  # the tensors this step of the graph saved for backward
                try:
                    saved = getattr(node, name)
                except RuntimeError:  # a weight the optimizer has since changed in place: left out anyway
                    continue
                for t in saved if isinstance(saved, (tuple, list)) else (saved,):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in weights:
                        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        todo += [next_node for next_node, _ in node.next_functions]
    return sum(storages.values())


kept = {"leaky": leaky_kept, "fixed": fixed_kept}
held = {name: [kept_bytes(values[:n]) for n in range(1, len(values) + 1)] for name, values in kept.items()}
# What each step adds: the first step's share set apart (the probe images, kept once by every graph).
per_step = {name: (h[-1] - h[0]) / (len(h) - 1) / 2**20 for name, h in held.items()}
print(f"kept by {len(leaky_kept)} logged values: leaky {held['leaky'][-1] / 2**20:.1f} MB "
      f"({per_step['leaky']:.2f} MB a step), fixed {held['fixed'][-1]:,} bytes ({per_step['fixed'] * 2**20:.0f} bytes a step)")

# %%
fig, (left, right) = plt.subplots(1, 2, layout="constrained")
for report, name, color in ((leaky, "leaky", "tab:red"), (fixed, "fixed", "tab:green")):
    steps = range(1, len(report.alive_per_step) + 1)
    left.plot(steps, report.alive_per_step, "o-", color=color, label=name)
    base = report.memory_per_step[0]
    right.plot(steps, [(m - base) / 2**20 for m in report.memory_per_step], "o-", color=color, label=f"{name}: process")
    right.plot(range(1, len(held[name]) + 1), [(h - held[name][0]) / 2**20 for h in held[name]], "--", color=color,
               label=f"{name}: kept graphs, counted")
left.set(xlabel="step", ylabel="tensors holding a graph", title="graphs kept alive")
right.set(xlabel="step", ylabel="MB more than after step 1", title="memory")
left.legend()
right.legend(fontsize=7)
for ax in (left, right):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
plt.show()
growth = {name: (r.memory_per_step[-1] - r.memory_per_step[0]) / 2**20 for name, r in (("leaky", leaky), ("fixed", fixed))}
print(f"the process's memory over {len(leaky.memory_per_step)} steps: leaky {growth['leaky']:+.0f} MB, "
      f"fixed {growth['fixed']:+.0f} MB (the kept graphs: {(held['leaky'][-1] - held['leaky'][0]) / 2**20:+.0f} MB)")

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
assert per_step["leaky"] > 1.0, per_step                            # each leaky step keeps megabytes...
assert per_step["fixed"] * 2**20 <= 64, per_step                     # ... and, fixed, one number (a few bytes)
assert growth["leaky"] > 0.5 * (held["leaky"][-1] - held["leaky"][0]) / 2**20, growth  # the process grew with them
print("all checks passed")
