# %% [markdown]
# # 11 · CPU threads: threads, workers and ranks share the cores
#
# **Checklist item (CPU):** on a CPU three things want cores at once: torch's own threads inside each
# operation (`num_threads`; torch's default is one per core), the DataLoader's workers (a process each, a
# core each when loading needs the CPU, notebook 1) and, with `devices=2` or more, the DDP ranks (each rank
# gets cores / ranks threads, and its summary says so, notebook 7). Their sum beyond the *free* cores only
# queues: a thread that waits for a core holds up the other threads of its operation, so on a laptop with
# other work running torch's default can be many times slower than one thread. On a quiet many-core machine
# more threads split a large operation instead. Measure rather than guess.
#
# In nbtrain: `num_threads` (`--num-threads`, the panel's threads field) sets the count for a run and puts
# torch's back after; every reading records the count it ran at; the checklist walk races 1, half the cores
# and the default first on a CPU; `nbtrain.ceilings` says how long the step's threads waited for a CPU and
# races fewer; `nbtrain.forecast` reads its 1 x 1 point at the live run's count.

# %%
%load_ext nbtrain
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset
import matplotlib.pyplot as plt

import nbtrain
from nbtrain import TrainConfig

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
cores = len(os.sched_getaffinity(0))
threads_before = torch.get_num_threads()
held = TensorDataset(torch.randn(4096, 64, generator=torch.Generator().manual_seed(0)),
                     torch.randint(0, 10, (4096,), generator=torch.Generator().manual_seed(1)))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


model, loss_fn = mlp(), nn.CrossEntropyLoss()
print(f"{cores} cores; torch in this kernel runs {threads_before} intra-op thread(s)")

# %% [markdown]
# ## One thread against one per core, head to head
#
# A small MLP on data held in memory: short blocks at each count alternate on the live model, so a load
# that comes and goes falls on both sides.

# %%
verdict = nbtrain.ab(model, held, loss_fn=loss_fn, a={"num_threads": cores, "batch_size": 64},
                     b={"num_threads": 1, "batch_size": 64}, budget_s=20)
print(verdict.text())
fig, ax = plt.subplots(layout="constrained")
ax.plot(verdict.rates_a, "o-", label=f"{cores} threads (A)")
ax.plot(verdict.rates_b, "o-", label="1 thread (B)")
ax.set(xlabel="pair of blocks", ylabel="samples/s", yscale="log", title="each block's rate, in the order run")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The verdict is what one thread did against one per core on the machine that ran this page: where other
# work keeps a core busy, one per core waits for it (the blocks at that count then scatter widely, as the
# plot shows); on a quiet machine the two are closer, or more threads win on larger operations. The
# checklist walk races the counts for you (1, half the cores, torch's default) and keeps one only when its
# race shows a gain. This kernel's torch runs one thread (the notebooks run with `OMP_NUM_THREADS=1`), so the
# walk starts here from a thread per core, as torch's default is on a laptop:

# %%
walk = nbtrain.checklist(model, held, loss_fn=loss_fn, items=["threads"], budget_s=15,
                         config=TrainConfig(batch_size=64, accelerator="cpu", num_threads=cores))
print(walk.table())

# %% [markdown]
# ## The same math
#
# Threads split each operation's arithmetic; they change nothing but the order in which float sums add up,
# so the losses agree to rounding:

# %%
def losses_at(threads):
    return nbtrain.fit(mlp(), held, loss_fn=loss_fn, batch_size=64, max_steps=20, num_threads=threads,
                       name=f"{threads} thread(s)").history["loss"]


one, every = losses_at(1), losses_at(cores)
same_math = [abs(a - b) <= 1e-5 * abs(a) for a, b in zip(one, every)]
print(f"losses at 1 and {cores} threads agree to 1e-5 at every one of {len(one)} steps: {all(same_math)}")

# %% [markdown]
# **Takeaway:** give the cores out on purpose. The training process's threads, plus the workers that load on
# the CPU, times the ranks, at most the free cores; beside other work, fewer threads than torch's default.
# `--num-threads` (or the walk's threads item) measures the count on your own model.
#
# ## Checks

# %%
from nbtrain.notebook.claims import checks_done

assert torch.get_num_threads() == threads_before and all(same_math)  # threads put back; the same math
assert verdict.loads_a and all(load.threads == cores for load in verdict.loads_a)  # each block ran at its count
assert verdict.loads_b and all(load.threads == 1 for load in verdict.loads_b)
row = next(i for i in walk.items if i.name == "threads")  # the walk raced the counts
assert all(t.config.num_threads in (1, cores // 2 or 1, None) for t in row.tried), row
print(checks_done())
