# %% [markdown]
# # 0 · Quick start: train, see it measured, change one thing
#
# nbtrain turns the PyTorch training-speed checklist into things you do on your own live model and
# *see* measured. This notebook trains a small network on handwritten digits (they ship with
# scikit-learn: no download), reads the measured summary, and changes one setting to see its effect.
# The other notebooks take one checklist item each.

# %%
import torch
from torch import nn
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})

# %% [markdown]
# ## Your model and data, as plain PyTorch

# %%
torch.manual_seed(0)
model = DigitsMLP()                       # 64 -> 128 -> 128 -> 10
train_data = DigitsDataset(train=True)    # 1,437 images of 8x8 pixels
val_data = DigitsDataset(train=False)     # 360 held out
loss_fn = nn.CrossEntropyLoss()

# %% [markdown]
# ## Train it, with the settings in one place
#
# `nbtrain.fit` takes the model, the data and a loss, plus settings by name (or a `TrainConfig`).
# Every setting is checked before anything runs; the result carries what was measured on this run.

# %%
first = nbtrain.fit(model, train_data, val_data=val_data, loss_fn=loss_fn,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3),
                    batch_size=32, max_epochs=3, name="batch 32")
print(first.table())
first.plot();

# %% [markdown]
# The table is measured, not estimated: samples per second, time per epoch, peak memory, how each
# step's time splits between loading data, copying it to the device, forward, backward and the
# optimizer — the first place to look for a bottleneck (notebook 10) — and the held-out accuracy.
#
# ## Change one setting, see the effect
#
# A larger batch does more work per step, so fewer steps are spent on Python and framework overhead.
# Same model, same data, a fresh start:

# %%
torch.manual_seed(0)
model = DigitsMLP()
second = nbtrain.fit(model, train_data, val_data=val_data, loss_fn=loss_fn,
                     optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3),
                     batch_size=256, max_epochs=3, name="batch 256")

runs = [first, second]
fig, (left, right) = plt.subplots(1, 2, layout="constrained")
right.bar([r.name for r in runs], [r.summary["samples_per_s"] for r in runs], color="tab:orange")
right.set(ylabel="samples/s (measured)", title="speed")
for r in runs:
    left.plot(r.history["samples"], r.history["loss"], label=r.name)
left.set(xlabel="samples seen", ylabel="training loss", title="loss")
left.legend()
plt.show()
for r in runs:
    print(f"{r.name:>9}: {r.summary['samples_per_s']:8,.0f} samples/s, held-out accuracy {100 * r.summary['val_acc']:.1f}%")

# %% [markdown]
# Faster — but per epoch the larger batch took 8 times fewer optimizer steps, and it shows in the
# accuracy. Notebook 2 is about exactly this trade and how scaling the learning rate answers it.
#
# Bad settings are reported all at once, each naming the option, the value and what is allowed:

# %%
try:
    nbtrain.TrainConfig(batch_size=0, precision="fp8")
except nbtrain.ConfigError as error:
    config_message = str(error)
    print(config_message)

# %% [markdown]
# ## The control panel
#
# `nbtrain.panel()` puts the same settings on widgets over the live model: pick a device and precision,
# set batch size, workers, accumulation, processes and the learning-rate rule, press **Run**, watch the
# live plot, and compare runs in the table below it. **Apply now** changes a running training at its next
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
for r in runs:
    assert r.status == "completed" and r.summary["last_loss"] < 0.5 * r.summary["first_loss"]
assert first.summary["val_acc"] > 0.85
assert second.summary["samples_per_s"] > 1.5 * first.summary["samples_per_s"]  # batch 256 vs 32: far less overhead
assert "batch_size=0" in config_message and "precision='fp8'" in config_message
assert [r.status for r in panel.runs] == ["completed", "completed"]
assert panel.runs[1].config.precision == "bf16-mixed" and panel.runs[0].config.batch_size == 128
assert panel_trained  # the panel trained this notebook's live model
print("all checks passed")
