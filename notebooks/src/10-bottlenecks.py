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
# Last, `--compile`: a fix for the compute side of a step, measured with what it costs.

# %%
import statistics
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
# memory, batch size (with the learning rate scaled), workers, accumulation, device, precision, optimizer
# kernels, channels_last, compile, DDP processes — on this model. An item's candidates *race* the current
# settings: rounds of short blocks, one block of the current settings beside one block of each candidate
# still in the race, the model put back after every block. The pairs give each candidate's speed-up with
# its 95% interval as the race goes; a candidate leaves the race as soon as it cannot be kept, and an item
# is kept only when the interval of at least three pairs lies above 3%. The walk says why it skipped the
# rest, within the time budget. Blocks never keep their weights; the model ends as it started.

# %%
weights_before = [p.detach().clone() for p in model.parameters()]

# %%
%nbtrain_checklist --budget 30 --batch-size 32 --accelerator cpu --name walk

# %% [markdown]
# The walk's first item is `preload_data`: hold the training data in memory and cut each batch by index,
# in the DataLoader's order. This data set is not a `TensorDataset`, so nbtrain holds it only when asked
# (`preload_data=True`); the walk asks, after checking that a sample read twice comes back the same (no
# random augmentation) and that the data fits in memory — here it is 0.4 MB. Read once, held, the batches
# wait for nothing: tens of times faster, head to head. With the wait gone, each step is mostly fixed
# costs (a Python call per layer, the optimizer's loop over parameters), so the next item, a larger batch
# (learning rate scaled by the linear rule), spreads them over more samples; in the run stored here it was
# kept with its interval, and the smaller batch left the race early, behind the leader.
# Workers come after the batch — they only pay once a batch keeps them busy — and here they would mean
# going back to the DataLoader's per-sample reads: their first blocks sit far below the held rate, and
# they leave the race ("left after round ...: below a gain worth keeping" in the last column). A candidate
# may leave on the screen of its first blocks ("screened on 1 block each"), but only the pairs of three
# rounds or more can keep one. The breakdown looked at one config's phases and pointed to workers; the
# walk compared the fixes and found a better one for this data set. (A data set too large to hold, or one
# that augments at random, gets the reason in the preload row instead, and then workers are worth
# trying.) Later rows show what this CPU makes of the remaining items — bf16 is not kept here; the two
# other optimizer kernels race the current one (a fused kernel does the same update in one pass, its last
# bits of rounding may differ); two DDP processes cannot take turns with the live model, so they are set
# against the current settings measured right after them ("measured apart") — and
# the table says which items the 30 s budget had no time for: on your own model give the walk minutes
# (`--budget 120`), not seconds.
#
# Each bar of the waterfall is one kept item's measured change in samples/s, from the starting
# configuration on the left to the best one found on the right. `walk.best_config` is that configuration,
# ready for `nbtrain.fit` (`--keep-best` makes it the default of later `%%nbtrain` cells). When the walk
# keeps a larger batch, its learning-rate note says how the rate was scaled — check the accuracy
# consequence as in notebook 2 before keeping it.
#
# ## torch.compile, by hand
#
# The walk had no time left for `compile`; its row says why, and what to do instead. `torch.compile`
# traces the model's forward and backward into a graph and generates fused kernels for it: fewer, larger
# kernels and less Python per step. It can only speed up the compute, so it is worth trying once the
# step is compute-bound — here, with the digits held in memory as the walk found. It costs time up front:
# the first step compiles, and so does the first batch of a new shape (an epoch's last, shorter batch;
# `--drop-last true` avoids that one). First, whether it works here at all (on a CPU it needs a C++
# compiler):

# %%
import logging

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "no CUDA runtime": not news on a CPU
walked_model = model  # the walk's model, for the checks at the end
started = time.perf_counter()
try:
    torch.compile(lambda x: torch.relu(x) * 2)(torch.ones(4))
    compile_mode = "default"
    print(f"torch.compile works here: loading the compiler and compiling a two-operation function took "
          f"{time.perf_counter() - started:.1f} s (once per kernel)")
except Exception as error:  # no compiler, an unsupported Python, ...: say so, train without it
    compile_mode = "none"
    print(f"torch.compile is not available here ({type(error).__name__}: {str(error).splitlines()[0][:150]}); "
          "the cells below train without it and skip the comparison")

# %% [markdown]
# A fresh model on the digits held in memory, 60 steps as it is, then 60 more with `--compile default`.
# IPython fills in `{compile_mode}` from the notebook: the probe's answer, `default` here, or `none`
# where compile cannot run. On the same live model, the summary's note sets the compile cost apart from
# the step time and compares the compiled step with the eager step just measured:

# %%
%%nbtrain --max-steps 60 --batch-size 32 --accelerator cpu --no-plot --name eager
torch.manual_seed(0)
model = DigitsMLP()
train_data = DigitsDataset(train=True)  # a TensorDataset: held in memory, no wait for data

# %%
%%nbtrain --compile {compile_mode} --max-steps 60 --batch-size 32 --accelerator cpu --no-plot --name compiled
# the same model and data, trained on through torch.compile

# %%
slow_steps = {}
for run in (eager, compiled):
    typical = statistics.median(run.history["step_s"])
    steps_and_times = zip(run.history["step"], run.history["step_s"])
    slow_steps[run.name] = [(step, t) for step, t in steps_and_times if t > 50 * typical]
    slow = ", ".join(f"step {step} {1000 * t:.0f} ms" for step, t in slow_steps[run.name]) or "none"
    print(f"{run.name:>8} (compile={run.config.compile}): steps {run.history['step'][0]}-{run.history['step'][-1]}, "
          f"median step {1000 * typical:.2f} ms; over 50x that: {slow}")

# %% [markdown]
# The first compiled step (61) is the compile, and step 90 a second one, for the epoch's last, shorter
# batch (29 samples). The compiled run's samples/s and phase shares include both — its forward phase is
# most of its time — which is why nbtrain puts compiling in a note of its own: the compile cost, the
# steady compiled step against the eager step measured on this model just before, and after how many
# steps the cost is paid back. The cost is small here: the probe had loaded the compiler, and torch keeps
# compiled kernels in a cache on disk between kernels; a model's first compile on a fresh machine takes
# seconds. Two runs one after the other are no speed claim; head to head:

# %%
if compile_mode == "none":
    compile_verdict = None
    print("skipped: torch.compile is not available here")
else:
    compile_verdict = nbtrain.ab(model, train_data, loss_fn=loss_fn, a={"batch_size": 32, "compile": "none"},
                                 b={"batch_size": 32, "compile": compile_mode}, budget_s=8, min_pairs=6)
    print(compile_verdict.text())

# %% [markdown]
# On this CPU compile does not pay for this small network: the head-to-head finds no gain (on the
# machine that rendered this page the compiled step was measurably slower), and the note says it never
# pays off at this size. A step this small is mostly fixed costs — calling the compiled graph and checking
# its guards, the optimizer's own step — which compiling the model does not remove. On a GPU it is more
# often worth it: there each small operation is a kernel launch and a round trip through memory, and
# fusing them saves both, most for models with many element-wise operations (normalisations,
# activations). Measure it on your model and device the same way; the note says after how many steps the
# compile cost is paid back.
#
# **Takeaway:** measure first (`--profile`), fix the phase that bounds the step, measure again; let
# `%nbtrain_checklist` try the rest on your own model rather than guessing. From Python, the same tools are
# `nbtrain.profile(model, train_data, loss_fn=...)` and `nbtrain.checklist(...)`. Try `--compile` once the
# step is compute-bound, and keep it only where the head-to-head says it pays.
#
# ## Checks

# %%
items = {item.name: item for item in walk.items}
assert before.kind == "data-bound", before.verdict
assert after.fractions["data"] < before.fractions["data"]           # workers shrink the wait...
assert workers_verdict.verdict.faster, workers_verdict.text()        # ... and speed the step up, head to head
assert walk.changes().get("preload_data") is True and items["preload_data"].kept  # the walk holds the data...
assert items["preload_data"].verdict.above(1.0), items["preload_data"].verdict   # ... more than twice as fast
assert not (items["workers"].kept if "workers" in items else False)  # ... and then workers only lose (if reached)
assert not (items["precision"].kept if "precision" in items else False)  # bf16 does not help on this CPU
assert walk.overall().above(0.3), walk.overall()                     # a real speed-up on a data-bound recipe
assert walk.elapsed_s < 30 * 1.5                                     # within its budget (slack for a busy machine)
assert all(torch.equal(a, b) for a, b in zip(weights_before, walked_model.parameters()))  # trials left the model
assert not items["compile"].kept if "compile" in items else any(n == "compile" for n, _ in walk.skipped)
if compile_mode != "none":
    assert compiled.summary["compile_s"] > 0 and any("compile cost" in n for n in compiled.summary["notes"])
    assert {61, 90} <= {step for step, _ in slow_steps["compiled"]} and not slow_steps["eager"]  # compile, recompile
    assert not compile_verdict.verdict.above(0.05), compile_verdict.text()  # no real gain from compile here
print("all checks passed")
