# %% [markdown]
# # 0 · Quick start: train in a cell, see it measured, change one thing
#
# nbtrain turns the PyTorch training-speed checklist into things you do on your own live model and
# *see* measured. This notebook loads the `%%nbtrain` cell magic, trains a small network on handwritten
# digits (they ship with scikit-learn: no download), changes one setting to see its effect, and drives
# the control panel. The other notebooks take one checklist item each.

# %%
%load_ext nbtrain
import torch
from torch import nn
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})

# %% [markdown]
# ## A `%%nbtrain` cell
#
# The cell is plain PyTorch: it defines `model`, `train_data` and `loss_fn` (and here `val_data` and
# `optimizer`). The first line says *how* to train — the flags are the settings of `nbtrain.TrainConfig`,
# all checked before anything runs. The cell then trains with a live progress bar and plot, shows the
# measured summary, keeps the result in a variable (`--name`) and records it in a run store that
# survives a kernel restart.

# %%
%%nbtrain --max-epochs 3 --batch-size 32 --name first
torch.manual_seed(0)
model = DigitsMLP()                       # 64 -> 128 -> 128 -> 10
train_data = DigitsDataset(train=True)    # 1,437 images of 8x8 pixels
val_data = DigitsDataset(train=False)     # 360 held out
loss_fn = nn.CrossEntropyLoss()
optimizer = lambda params: torch.optim.AdamW(params, lr=3e-3)

# %% [markdown]
# The summary is measured, not estimated: samples per second, time per epoch, peak memory, how each
# step's time splits between loading data, copying it to the device, forward, backward and the
# optimizer — the first place to look for a bottleneck (notebook 10) — and the held-out accuracy.
#
# ## Change one setting, see the effect
#
# A larger batch does more work per step, so fewer steps are spent on Python and framework overhead.
# A fresh model, everything else the same (names from earlier cells count):

# %%
%%nbtrain --max-epochs 3 --batch-size 256 --name second
torch.manual_seed(0)
model = DigitsMLP()

# %%
%nbtrain_compare first second

# %%
for run in (first, second):
    print(f"{run.name:>7}: {run.summary['samples_per_s']:9,.0f} samples/s, "
          f"held-out accuracy {100 * run.summary['val_acc']:.1f}%")

# %% [markdown]
# Faster — but per epoch the larger batch took 8 times fewer optimizer steps, and it shows in the
# accuracy. Notebook 2 is about exactly this trade and how scaling the learning rate answers it.
#
# Bad settings are refused before anything trains, each naming the flag, the value and what is
# allowed — and the kernel stays as it was:

# %%
from IPython.core.error import UsageError

try:
    get_ipython().run_cell_magic("nbtrain", "--batch-size 0 --precision fp8", "model = DigitsMLP()")
except UsageError as error:
    flag_message = str(error)
    print(flag_message)

# %% [markdown]
# The same runs from Python, without the magic, are one call: `nbtrain.fit(model, train_data,
# loss_fn=loss_fn, batch_size=256, max_epochs=3)` returns the same result object.
#
# ## The control panel
#
# `nbtrain.panel()` puts the settings on widgets over the live model: pick a device and precision, set
# batch size, workers, accumulation, processes and the learning-rate rule, press **Run**, watch the live
# plot, and compare runs in the table below it. **Apply now** changes a running training at its next
# optimizer step. It reads `model`, `train_data`, `loss_fn` (and `val_data`, `optimizer`) from the
# notebook, so it trains the model defined above.

# %%
panel = nbtrain.panel(globals())

# %% [markdown]
# In JupyterLab you would press the buttons; so that this notebook runs top to bottom on its own, the
# next cell sets two controls and presses **Run** from code, twice — once as it is, once in bf16.

# %%
panel.controls.batch_size.value = "128"
panel.controls.max_epochs.value = "2"
before = [p.detach().clone() for p in model.parameters()]
panel.run_button.click()
panel.wait()
panel.controls.precision.select("bf16-mixed")
panel.run_button.click()
panel.wait()
print(panel.status_text)
for record in panel.runs:
    s = record.result.summary
    print(f"{record.label():45} {record.status:10} {s['samples_per_s']:9,.0f} samples/s  loss {s['last_loss']:.3f}")
panel_trained = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

# %% [markdown]
# ## Checks

# %%
for run in (first, second):
    assert run.status == "completed" and run.summary["last_loss"] < 0.5 * run.summary["first_loss"]
assert first.summary["val_acc"] > 0.85, first.summary["val_acc"]
# Batch 256 vs 32: far less overhead per sample. Compared on each run's fastest step (its cost with the
# machine at its quietest), so other programs' bursts on a shared machine cannot decide it.
typical = {run.name: run.config.batch_size / min(run.history["step_s"]) for run in (first, second)}
assert typical["second"] > 1.5 * typical["first"], typical
assert "--batch-size" in flag_message and "fp8" in flag_message
assert [r.status for r in panel.runs] == ["completed", "completed"], [(r.status, r.error) for r in panel.runs]
assert panel.runs[1].config.precision == "bf16-mixed" and panel.runs[0].config.batch_size == 128
assert panel_trained  # the panel trained this notebook's live model
print("all checks passed")
