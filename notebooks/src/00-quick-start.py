# %% [markdown]
# # 0 · Quick start: train in a cell, see it measured, change one thing
#
# nbtrain turns the PyTorch training-speed checklist into things you do on your own live model and
# *see* measured. This notebook loads the `%%nbtrain` cell magic, trains a small network on handwritten
# digits (they ship with scikit-learn: no download), changes one setting and measures its effect head to
# head, and drives the control panel. The other notebooks take one checklist item each.

# %%
%load_ext nbtrain
import torch
from torch import nn
import matplotlib.pyplot as plt

import nbtrain
from nbtrain.demo import DigitsDataset, DigitsMLP

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})

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
# The summary is measured, not estimated. *samples/s* is the **steady** rate: the first steps (start-up,
# memory allocation) are set apart as warm-up, and the rate of the rest comes with a 95% interval — wide
# when the machine was busy, and then it says so. Below it: how each step's time splits between loading
# data, copying it to the device, forward, backward and the optimizer (the first place to look for a
# bottleneck, notebook 10), and the held-out accuracy.
#
# ## Change one setting
#
# A larger batch does more work per step, so fewer steps are spent on Python and framework overhead.
# A fresh model, everything else the same (names from earlier cells count):

# %%
%%nbtrain --max-epochs 3 --batch-size 256 --name second
torch.manual_seed(0)
model = DigitsMLP()

# %%
%nbtrain_compare first second

# %% [markdown]
# Each run above was short (its total time is in its summary), and the two ran one after the other. A run
# whose steady steps lasted under a second is *too short to compare*: the machine's load is read beside a run
# every 0.2 s, and a run that short fits in one burst of another process, or in the lull between two. Every
# run records how much of the machine other processes took, for the whole run and block by block: where that
# load could explain the difference, the *vs first* column says the machine was busier instead of giving a
# verdict. A load that stayed the same through both runs still slows both alike, and one that came and went
# is only as visible as its blocks, so a column that compares two runs measured apart is no speed claim. That
# needs a **head-to-head** measurement: `nbtrain.ab` trains short blocks of A and B in alternation on the live
# model — each block from the same saved state, so neither learns from the other and the model ends as it
# was — until the ratio's 95% interval is narrow:

# %%
batch_verdict = nbtrain.ab(model, train_data, loss_fn=loss_fn, a={"batch_size": 32}, b={"batch_size": 256},
                           budget_s=10, min_pairs=8)
print(batch_verdict)
for run in (first, second):
    print(f"{run.name:>7}: {run.summary.steps:>3} optimizer steps in 3 epochs, "
          f"held-out accuracy {100 * run.summary.val_acc:.1f}%")

# %% [markdown]
# The verdict's last part counts samples: the larger batch trains more of them per second, its interval
# wholly above 1. Its first parts answer what "faster" means to a user, the same model sooner: each side
# also trained for the same seconds from the same weights, both scored on `val_data`, with how long each took
# to reach the worse side's final held-out loss. On this tiny model those can go either way from one run to
# the next, and they need not agree with samples/s: in the same 3 epochs the larger batch took 18 optimizer
# steps against 135, and its held-out accuracy is lower. Notebook 2 is about exactly this trade, and how
# scaling the learning rate answers it.
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
# loss_fn=loss_fn, batch_size=256, max_epochs=3)` returns the same result object. Every run is kept in the
# run store; `%nbtrain_runs` lists them (here the last two):

# %%
%nbtrain_runs --last 2

# %% [markdown]
# ## The control panel
#
# `nbtrain.panel()` puts the settings on widgets over the live model: device and precision, batch size,
# workers, accumulation, devices and the learning-rate rule, **Run** / **Stop**, the live plot beside the
# settings, and the runs compared in a table. **Apply now** changes a running training at its next
# optimizer step. `%nbtrain --panel` opens it on the recipe already in the notebook — `model`,
# `train_data`, `loss_fn` (and `val_data`, `optimizer`) — so it trains the model defined above (from
# Python: `nbtrain.panel(globals())`). In JupyterLab it looks like this:
#
# ![the nbtrain control panel in JupyterLab](images/panel.png)

# %%
%nbtrain --panel --name panel

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
for record in panel.runs:
    print(f"{record.label():32} {record.status:10} {record.result.steady().text()}")
panel_trained = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

# %% [markdown]
# Two short runs one after the other again: their rates say what each run measured, not what bf16 does.
# Head to head:

# %%
# A and B name every setting they differ in: the live model's config is the panel's last (bf16-mixed).
bf16_verdict = nbtrain.ab(model, train_data, loss_fn=loss_fn, a={"batch_size": 128, "precision": "32-true"},
                          b={"batch_size": 128, "precision": "bf16-mixed"}, budget_s=10, min_pairs=8)
print(bf16_verdict)

# %% [markdown]
# On this CPU and this small model, bf16-mixed is no speed-up: head to head it measures slower, or no
# measurable difference, or on a busy machine too noisy to tell — never faster, whatever the two panel runs
# seemed to show. The brackets say how busy the machine was and, where some were, how many pairs of blocks
# were set aside because another process took more of the machine during one block of the pair than the other.
# The model's matrix multiplications are too small to gain from bf16, and autocast still pays to convert
# around each layer. Whether it helps depends on the processor and the model: notebook 6 measures it head to
# head on this MLP and on a convolutional network.
#
# ## Checks

# %%
from nbtrain.notebook.claims import checks_done, claim

for run in (first, second):
    assert run.status == "completed" and run.summary.last_loss < 0.5 * run.summary.first_loss
assert first.summary.val_acc > 0.85, first.summary.val_acc
assert second.summary.val_acc < first.summary.val_acc  # batch 256: lower accuracy after the same epochs
assert "--batch-size" in flag_message and "fp8" in flag_message
assert [r.status for r in panel.runs] == ["completed", "completed"], [(r.status, r.error) for r in panel.runs]
assert panel.runs[1].config.precision == "bf16-mixed" and panel.runs[0].config.batch_size == 128
assert panel_trained  # the panel trained this notebook's live model
assert bf16_verdict.label == "precision=bf16-mixed", bf16_verdict.label  # bf16 against float32, nothing else
# The speed claims: on a machine too busy to show one, said so (with how busy); asserted on CI or a quiet machine.
claim(batch_verdict.verdict.faster, batch_verdict, "batch 256 trains more samples/s than 32, beyond doubt at 95%")
claim(not bf16_verdict.verdict.faster, bf16_verdict, "bf16-mixed is no faster on this CPU")
print(checks_done())
