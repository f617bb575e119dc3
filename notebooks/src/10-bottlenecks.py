# requires: nbtrain.tools.diagnose, nbtrain.walk
# %% [markdown]
# # 10 · Find the bottleneck first — then let the checklist walk itself
#
# **Checklist item:** before trying speed-ups, find out where a training step's time goes. A data-bound
# run gains nothing from mixed precision; a compute-bound one gains nothing from more workers.
#
# In nbtrain: `%%nbtrain --profile` (or `nbtrain.profile(...)`) measures a few steps of your live model
# phase by phase — data, host→device copy, forward, backward, optimizer — and says which one bounds the
# step and what to try. `%%nbtrain --ceilings` (or `nbtrain.ceilings(...)`) measures the step's four
# ceilings — data, host, compute, memory — and says which one binds, by how much, and the remedies in the
# order the numbers favour. `%nbtrain_checklist` (or `nbtrain.checklist(...)`) then walks the whole checklist
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
# The verdict names the bound, by how much (the ceilings under it: the loader alone against the model
# alone), and the remedies in order: first hold the data in memory (the walk below tries that), then
# workers, up to the cores it sees. Workers first, by hand: waiting on storage takes no core, so we go
# further than it proposes, to 4 workers, and measure again:

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
# ## Four ceilings: data, host, compute, memory
#
# The breakdown says where a step's time goes; it cannot say *why* forward and backward take it. Once the
# data waits for nothing, four things can bound a step, and `nbtrain.ceilings` measures each on the spot
# as the samples/s the step could reach if only that limit were left:
#
# - **data**: the loader alone, no model;
# - **host**: the fixed cost of a step — Python, dispatching each operation, the optimizer's loop over its
#   tensors — whatever the batch. The step is timed at your batch and at 2 samples of it, in turns:
#   t(b) = fixed + per-sample × b. The intercept is the host's, the slope the device's; the host ceiling
#   is the step with the slope taken away;
# - **compute**: the step's FLOPs (counted by `torch.utils.flop_counter`) at the peak FLOP/s of a matmul
#   timed now, in the step's dtype;
# - **memory**: the bytes the step's operations read and write, at the bandwidth of a large copy timed now.
#
# Three models of one kind each, on this CPU: 48 layers 8 wide at batch 8 (every operation tiny), a
# 1024-wide MLP at batch 512 (big matmuls), and the digits MLP behind the slow storage of above:

# %%
digits = DigitsDataset(train=True)
tiny = nn.Sequential(nn.Linear(64, 8), *[m for _ in range(48) for m in (nn.Linear(8, 8), nn.Tanh())],
                     nn.Linear(8, 10))
wide = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
cases = {
    "48 tiny layers, batch 8": nbtrain.ceilings(tiny, digits, loss_fn=loss_fn,
                                                config=nbtrain.TrainConfig(batch_size=8, accelerator="cpu")),
    "1024-wide MLP, batch 512": nbtrain.ceilings(wide, digits, loss_fn=loss_fn,
                                                 config=nbtrain.TrainConfig(batch_size=512, accelerator="cpu")),
    "digits MLP, slow storage, batch 32": nbtrain.ceilings(model, train_data, loss_fn=loss_fn,
                                                           config=nbtrain.TrainConfig(batch_size=32,
                                                                                      accelerator="cpu")),
}
for name, c in cases.items():
    print(f"{name}:\n{c.table()}\n")

# %% [markdown]
# Each table lists the four ceilings binding first, each with its 95% interval and how it was measured,
# then the model alone (one batch held in memory, trained for real), the verdict, and the first remedies,
# each tagged with the ceiling it lifts. The three side by side:

# %%
from nbtrain.measure.ceilings import COLORS

fig, ax = plt.subplots(figsize=(7, 2.9), layout="constrained")
for row, (name, c) in enumerate(reversed(list(cases.items()))):
    for ceiling, offset in zip(("data", "host", "compute", "memory"), (0.21, 0.07, -0.07, -0.21)):
        r = c.ceiling(ceiling)
        high = min(r.high, 1e3 * r.value)  # an unbounded top drawn as a long whisker
        ax.errorbar(r.value, row + offset, xerr=[[r.value - r.low], [high - r.value]], fmt="o", capsize=3,
                    markersize=5, color=COLORS[ceiling], label=ceiling if row == 0 else None)
    ax.plot([c.model.rate] * 2, [row - 0.32, row + 0.32], color="black", linestyle="--",
            label="model alone" if row == 0 else None)
ax.set_yticks(range(len(cases)), [f"{name}\n{c.kind}" for name, c in reversed(list(cases.items()))], fontsize=8)
ax.set_xscale("log")
ax.set_xlabel("samples/s each ceiling allows (log scale)")
fig.legend(ncol=5, fontsize=8, loc="outside lower center", frameon=False)
plt.show()

# %% [markdown]
# Each row is one model; each dot a ceiling in samples/s on a log scale, its whiskers the 95% interval;
# the dashed tick is the model alone, its batch held in memory: the step without the loader. Host,
# compute and memory are ceilings of that step, so their dots lie right of its tick; the data ceiling can
# lie anywhere, and left of the tick it binds — as for the slow storage, whose red loader dot sits far
# left of the model's tick while the others lie far to its right. In the tiny layers' row the orange host
# dot sits nearest the tick, with memory and compute over a hundred times further right: the step took
# about as long at 2 samples as at 8, so each step pays the same fixed cost, and the remedies are a
# larger batch (the fit predicts its gain), a foreach optimizer and fewer operations (`torch.compile`),
# in the order of the operations each one would save — lower precision is not among them first. In the
# wide MLP's row the blue compute dot is nearest the tick: of the step's own ceilings, its FLOPs at the peak
# FLOP/s measured here allow the least, memory and host lie further right, and its remedies are lower precision (the row says
# against what, with the bf16 matmul timed here: on a CPU float32 without TF32; on a GPU float32 matmuls
# at the current `matmul_precision` and cuDNN convolutions with TF32 on, their default) and fused kernels.
# (`c.plot()` draws one model's ceilings the same way, binding on top; the panel's Ceilings button shows it.)
# A row's label says "too noisy to tell" instead of a ceiling where other processes took enough of the CPU
# while the model alone (or, for the loader, the loader alone) was read to have moved it by half again: the
# model's line in its table says how much they took. The dots still show which ceiling is nearest.
#
# The verdict is also data, for code that acts on it (the checklist walk will): the binding ceiling,
# each ceiling over it, and the remedies in order, each with the config option that tries it:

# %%
for name, c in cases.items():
    verdict = c.bottleneck()
    if verdict.kind == "too noisy to tell":  # the machine's load moved the readings: the nearest ceiling is shown
        print(f"{name}: too noisy to tell on this machine just now ({verdict.withheld.words}); "
              f"nearest: {verdict.binding}")
    print(f"{name}: {verdict.kind}; ceilings over it: "
          + ", ".join(f"{k} {v:,.1f}x" for k, v in verdict.ratios.items() if k != verdict.binding)
          + f"; try in turn: {', '.join(r.item for r in verdict.remedies[:4])}")

# %% [markdown]
# **What a GPU adds.** On a GPU the host and the device work side by side: the host queues kernels, the
# GPU runs them. A step is host-bound when the GPU runs out of queued work — many small kernels, each
# shorter than its own launch. There `nbtrain.ceilings` also measures the GPU's busy time: the union of
# the kernels' intervals from `torch.profiler` over the step's wall time, with the kernels per step, and
# decides host against device by it. The numbers below are the project's first GPU run (an H200,
# ResNet-18 on 32×32 images held on the GPU, float32, AdamW), not this page's: at batch 256 the GPU was
# busy 28% of the step (365 kernels a step), at batch 2048 87% — at nearly the same time per step, so a
# larger batch was almost free (60.0k samples/s at batch 512, 175.5k at 2048). bf16 was *slower* there
# (45.4k against 60.0k at batch 512): float32 convolutions already ran on TF32 tensor cores, cuDNN's
# default, and autocast only added cast kernels to a host-bound step. That is why the precision remedy
# comes last on a host-bound step, and why its row says what it is compared against.
#
# ## The whole checklist, walked automatically
#
# `%nbtrain_checklist` follows the bottleneck. It reads the four ceilings above at the current settings,
# tries the items that answer the binding one (in the order of its remedies), keeps what a race shows, and
# reads the ceilings again at what it kept — until nothing that answers the binding ceiling gains, or the
# budget ends. An item rejected under one bottleneck is tried again once the bottleneck moves. An item's
# candidates *race* the current settings: rounds of short blocks, one block of the current settings beside
# one block of each candidate still in the race, the model put back after every block. The pairs give each
# candidate's speed-up with its 95% interval as the race goes; a candidate leaves the race as soon as it
# cannot be kept, and an item is kept only when the interval of at least three pairs lies above 3%; a race
# that ends undecided says why. The walk says why it skipped the
# rest, within the time budget. Blocks never keep their weights; the model ends as it started. (The
# ceilings above measured other models too; `model` and `train_data` are still the digits MLP and its
# slow storage, which the walk takes from the notebook.)

# %%
weights_before = [p.detach().clone() for p in model.parameters()]

# %%
%nbtrain_checklist --budget 30 --batch-size 32 --accelerator cpu --name walk

# %% [markdown]
# The table reads top to bottom as the path: the first column is the bottleneck each row was tried for.
# The walk starts data-bound, as the breakdown above said, so its first item is `preload_data`: hold the
# training data in memory and cut each batch by index, in the DataLoader's order. This data set is not a
# `TensorDataset`, so nbtrain holds it only when asked (`preload_data=True`); the walk asks, after checking
# that a sample read twice comes back the same (no random augmentation) and that the data fits in memory —
# here it is 0.4 MB. Read once, held, the batches wait for nothing: tens of times faster, head to head.
# The walk then reads the ceilings again where its budget leaves room for a reading (the `path:` line under
# the table lists each reading's bottleneck, or says "ceilings not read"): with the wait gone, each step is
# mostly fixed costs (a Python call per layer, the optimizer's loop over parameters) — host-bound — so the
# next items are what answers the host: a larger batch (learning rate scaled by the linear rule) spreads
# those costs over more samples, then the optimizer's kernels. On a busy machine the 30 s may end first,
# and those rows say "time budget" instead.
# Workers answer a data-bound step; once the data is held there is no DataLoader left for them, and the
# row says so. (A data set too large to hold, or one that augments at random, gets the reason in the
# preload row instead, and then workers are raced.) A candidate may leave on the screen of its first
# blocks ("screened on 1 block each"), but only the pairs of three rounds or more can keep one. Once
# nothing answering the bottleneck gains, the items not tried yet are tried once each — bf16 is not kept
# on this CPU — and the table says which items the 30 s budget had no time for: on your own model give the
# walk minutes (`--budget 120`), not seconds.
#
# Each bar of the chart is one item's measured speed-up over the configuration current in its own race (its
# leader's ratio with the 95% interval as whiskers; kept green, not kept grey), in the order walked, with the
# bottleneck it was tried for under its name; the dashed line is the keep rule (the interval above 1.03x). Each
# race ran at its own load, so the bars are not a cascade and do not multiply: the last bar is the walk's
# choice raced against the starting configuration at the end, the one speed-up the walk claims. `walk.best_config` is that configuration, ready for `nbtrain.fit` (`--keep-best`
# makes it the default of later `%%nbtrain` cells). When the walk
# keeps a larger batch, its learning-rate note says how the rate was scaled — check the accuracy
# consequence as in notebook 2 before keeping it.
#
# ## Time to quality: the same model, sooner?
#
# Samples per second are a means; what a user wants is the same model sooner. So train the start and the walk's
# choice from the same weights (seed 0) on the same slow storage, eight seconds of training each (`max_time=8`),
# each scored on the held-out digits about every tenth of a second at the rate the walk measured for it (a
# validation takes time too, so the faster run validates less often per sample), and draw the held-out loss
# against the wall time of the whole call, its start-up included (holding the data is paid there):

# %%
from nbtrain.notebook.claims import checks_done, claim
from nbtrain.runs.held_out_time import held_out_against_time

held_out_digits = DigitsDataset(train=False)


def for_time(name, rate, **changes):
    """The walk's start with `changes`, trained 8 s from the seed-0 weights, validated about every 0.1 s at `rate`."""
    torch.manual_seed(0)
    config = {"batch_size": 32, "accelerator": "cpu", **changes}
    return nbtrain.fit(DigitsMLP(), SlowStorageDigits(), val_data=held_out_digits, loss_fn=nn.CrossEntropyLoss(),
                       max_time=8, max_epochs=10_000, val_every_n_steps=max(1, round(0.1 * rate / config["batch_size"])),
                       name=name, **config)


def against_wall_time(run):
    """(seconds since the call began, held-out losses): the training clock moved by the call's start-up."""
    start_up = (run.summary.time_split or {}).get("start-up", 0.0)
    seconds, losses = held_out_against_time(run)
    return [start_up + t for t in seconds], losses


start_run = for_time("the start", walk.baseline)
choice_run = for_time("the walk's choice", walk.final if walk.moved else walk.baseline, **walk.changes())
plt.figure(figsize=(5, 2.4))
for run in (start_run, choice_run):
    seconds, losses = against_wall_time(run)
    start_up = (run.summary.time_split or {}).get("start-up", 0.0)
    plt.plot(seconds, losses, ".-", ms=2, lw=1, label=f"{run.name} ({start_up:.1f} s start-up, "
                                                         f"{run.summary.steps:,} steps)")
plt.yscale("log")
plt.xlabel("seconds since the call began")
plt.ylabel("held-out loss (digits)")
plt.title("held-out loss against wall time, from the same weights")
plt.legend(fontsize=8, loc="upper right")
plt.show()
print("the walk's choice:", walk.changes())
start_final = held_out_against_time(start_run)[1][-1]
wall_to = {run.name: next((t for t, v in zip(*against_wall_time(run)) if v <= start_final), None)
           for run in (start_run, choice_run)}
print(f"to the start's final held-out loss {start_final:.3g}: " +
      ", ".join(f"{name} {t:.1f} s" for name, t in wall_to.items()) + " since the call began")
print("nbtrain.compare, on training time alone:", nbtrain.compare(start_run, choice_run).rows[1]["held-out in time"])

# %% [markdown]
# The start waits on storage for every batch: a millisecond a sample, so in its eight seconds it sees four or five
# epochs of the digits and its held-out loss is still falling when the time is up. The walk's choice pays that wait
# once, up front: its start-up reads every digit into memory (the long start-up in the legend; the start's is near
# zero), so its curve begins late. From then on it trains on the copy at the larger batch the walk kept, tens of
# times more samples a second: its first validations are already at or below where the start ends, and it goes
# on an order of magnitude lower. Counted from the moment each call began, the read included, it reaches the start's final
# held-out loss seconds before the start does (the line under the plot); on a longer run the read is paid once. The
# last line is `nbtrain.compare`'s *held-out in time* reading, which counts training time only (the read not
# included) and, for one run each, says what the validations around each crossing allow instead of an interval.
# Holding the data changes nothing of what a step learns; the larger batch at the linear rule's rate does, which is
# why the walk raced what it learns before keeping it (its row's "learns ... in the same time").
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
# Each case reads its own ceiling, or "too noisy to tell" where the machine's load moved the readings (never
# another ceiling); the remedies follow the nearest ceiling either way.
expected = ["host", "compute", "data"]
assert all(c.kind in (f"{e}-bound", "too noisy to tell") for c, e in zip(cases.values(), expected)), \
    [c.verdict for c in cases.values()]
assert [c.bottleneck().remedies[0].ceiling for c in cases.values()] == expected
assert cases["48 tiny layers, batch 8"].bottleneck().remedies[0].item == "batch_size"
assert all(c.ceiling(k).low <= c.ceiling(k).value <= c.ceiling(k).high for c in cases.values()
           for k in ("data", "host", "compute", "memory"))
assert after.fractions["data"] < before.fractions["data"]           # workers shrink the wait...
assert workers_verdict.verdict.faster, workers_verdict.text()        # ... and speed the step up, head to head
assert walk.path[0][1].binding == "data" and walk.items[0].name == "preload_data"  # the path starts at the loader
assert walk.changes().get("preload_data") is True and items["preload_data"].kept  # the walk holds the data...
assert items["preload_data"].verdict.above(1.0), items["preload_data"].verdict   # ... more than twice as fast
assert not (items["workers"].kept if "workers" in items else False)  # ... and then workers only lose (if reached)
assert not (items["precision"].kept if "precision" in items else False)  # bf16 does not help on this CPU
assert walk.overall().above(0.3), walk.overall()                     # a real speed-up on a data-bound recipe
assert walk.elapsed_s < 30 * 1.5                                     # within its budget (slack for a busy machine)
assert all(torch.equal(a, b) for a, b in zip(weights_before, walked_model.parameters()))  # trials left the model
assert not items["compile"].kept if "compile" in items else any(n == "compile" for n, _ in walk.skipped)
assert len(held_out_against_time(start_run)[0]) >= 3 and len(held_out_against_time(choice_run)[0]) >= 3  # both drawn
# counted from each call's start, its reading of the data included, the choice reaches the start's final loss first
claim(wall_to["the walk's choice"] is not None and wall_to["the walk's choice"] < wall_to["the start"],
      choice_run.summary.load, "the walk's choice reaches the start's final held-out loss sooner in wall time")
if compile_mode != "none":
    assert compiled.summary.compile_s > 0 and any("compile cost" in n for n in compiled.summary.notes)
    assert {61, 90} <= {step for step, _ in slow_steps["compiled"]} and not slow_steps["eager"]  # compile, recompile
    assert not compile_verdict.verdict.above(0.05), compile_verdict.text()  # no real gain from compile here
print(checks_done())
