# %% [markdown]
# # 6 · Mixed precision: 16-bit where it is safe, 32-bit where it matters
#
# **Checklist item:** compute the forward and backward passes in a 16-bit format and keep the weights
# and the optimizer update in 32-bit. On GPUs with tensor cores this is often the biggest single
# speed-up, and activations take half the memory.
#
# In nbtrain: `precision="16-mixed"` (float16 with a gradient scaler, CUDA only),
# `precision="bf16-mixed"` (bfloat16, no scaler, CPU or GPU), `precision="32-true"` (the default).
# Cells that need a GPU are marked **[GPU]** and say *skipped* when there is none.

# %%
import torch
from torch import nn
import matplotlib.pyplot as plt

import nbtrain
from nbtrain import ConfigError, TrainConfig
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.precision import Precision

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (9, 3)})
has_gpu = torch.cuda.is_available()
print("CUDA GPU:", torch.cuda.get_device_name(0) if has_gpu else "none (GPU cells will be skipped)")
train_data, val_data = DigitsDataset(train=True), DigitsDataset(train=False)

# %% [markdown]
# ## What 16 bits lose
#
# float16 keeps precision but has a small range; bfloat16 keeps float32's range with less precision.

# %%
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    info = torch.finfo(dtype)
    print(f"{str(dtype):15} largest {info.max:9.3g}   smallest normal {info.tiny:9.3g}   step at 1.0 {info.eps:.3g}")

small_gradient = torch.tensor(1e-8)
in_fp16 = small_gradient.half().item()
in_bf16 = small_gradient.bfloat16().item()
scale = 2.0 ** 16
scaled_fp16 = (small_gradient * scale).half().float().item() / scale
print(f"\na gradient of 1e-8: float16 -> {in_fp16:g} (underflow), bfloat16 -> {in_bf16:.3g}, "
      f"float16 after scaling by 2^16 -> {scaled_fp16:.3g}")

# %% [markdown]
# That is why `16-mixed` needs a **gradient scaler**: the loss is multiplied by a large factor before
# `backward()` so small gradients survive in float16, and the gradients are divided by it again
# before the update (the scale shrinks whenever an overflow shows up). bfloat16 has float32's range,
# so `bf16-mixed` needs none. nbtrain builds the right pair for each setting:

# %%
for name, device in [("32-true", "cpu"), ("bf16-mixed", "cpu")] + ([("16-mixed", "cuda")] if has_gpu else []):
    print(Precision(name, device))

# %% [markdown]
# `16-mixed` on a machine without a GPU is refused with a message that says what to use instead:

# %%
try:
    TrainConfig(precision="16-mixed", accelerator="cpu")
except ConfigError as error:
    fp16_on_cpu_message = str(error)
    print(fp16_on_cpu_message)

# %% [markdown]
# ## Measured on the CPU: 32-true vs bf16-mixed
#
# The same model, seed and data, trained twice. Autocast runs the matrix multiplications in
# bfloat16; the weights stay float32.

# %%
def train(precision, device="cpu", hidden=512, epochs=3):
    """A fresh model trained with this precision; the engine is kept to look inside it."""
    torch.manual_seed(0)
    recipe = nbtrain.Recipe(model=DigitsMLP(hidden), train_data=train_data, val_data=val_data,
                            loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    engine = nbtrain.Engine(recipe, TrainConfig(accelerator=device, precision=precision, batch_size=128,
                                                max_epochs=epochs))
    result = engine.run()
    result.name = precision
    return recipe.model, result, engine

cpu_runs = {p: train(p) for p in ("32-true", "bf16-mixed")}
for precision, (model, result, _) in cpu_runs.items():
    s = result.summary
    print(f"{precision:>10}: {s['samples_per_s']:8,.0f} samples/s   held-out accuracy {100 * s['val_acc']:.1f}%   "
          f"weights stored as {next(model.parameters()).dtype}")

# %%
def compare(runs, title):
    fig, (left, mid, right) = plt.subplots(1, 3, layout="constrained")
    names = list(runs)
    for name in names:
        left.plot(runs[name][1].history["step"], runs[name][1].history["loss"], label=name)
    left.set(xlabel="optimizer step", ylabel="training loss", title=title)
    left.legend()
    mid.bar(names, [runs[n][1].summary["samples_per_s"] for n in names], color="tab:orange")
    mid.set(ylabel="samples/s", title="speed (measured)")
    right.bar(names, [100 * runs[n][1].summary["val_acc"] for n in names], color="tab:green")
    right.set(ylabel="held-out accuracy %", ylim=(0, 100), title="accuracy")
    plt.show()

compare(cpu_runs, "CPU")
probe_model = cpu_runs["bf16-mixed"][0]
with Precision("bf16-mixed", "cpu").autocast():
    activations_dtype = probe_model(val_data.x[:4]).dtype
print("inside bf16-mixed autocast the model computes in", activations_dtype)

# %% [markdown]
# On a CPU the speed depends on the processor: recent server CPUs have bfloat16 instructions and
# large models gain; on small models like this one the casts can cost more than they save. The
# number above is what *this* machine does — measure, don't assume. Accuracy is the same to within
# a point or two: the update itself stays in float32.
#
# ## [GPU] 32-true vs 16-mixed vs bf16-mixed on CUDA
#
# A wider model, so the matrix multiplications are big enough for tensor cores. `16-mixed` runs
# with the gradient scaler; its current scale is read from the live engine.

# %%
gpu_runs = {}
if not has_gpu:
    print("skipped: no CUDA GPU here")
else:
    for precision in ("32-true", "16-mixed", "bf16-mixed"):
        gpu_runs[precision] = train(precision, device="cuda", hidden=4096, epochs=3)
    print("16-mixed gradient scale now:", gpu_runs["16-mixed"][2].precision.scaler.get_scale())
    compare(gpu_runs, "CUDA")

# %% [markdown]
# **Takeaway:** on a GPU use `bf16-mixed` where it is supported (Ampere and newer), else `16-mixed`
# with its scaler; on a CPU try `bf16-mixed` and keep it only if the measurement says it helps.
#
# ## Checks

# %%
assert in_fp16 == 0.0 and in_bf16 > 0 and abs(scaled_fp16 - 1e-8) < 1e-10   # underflow, and the scaler's fix
assert "16-mixed needs a CUDA GPU" in fp16_on_cpu_message and "bf16-mixed" in fp16_on_cpu_message
assert not Precision("bf16-mixed", "cpu").scaler.is_enabled() and activations_dtype == torch.bfloat16
fp32_acc = cpu_runs["32-true"][1].summary["val_acc"]
bf16_acc = cpu_runs["bf16-mixed"][1].summary["val_acc"]
assert fp32_acc > 0.85 and bf16_acc > fp32_acc - 0.05, (fp32_acc, bf16_acc)  # bf16 costs no real accuracy
assert all(p.dtype == torch.float32 for p in cpu_runs["bf16-mixed"][0].parameters())  # weights stay fp32
if has_gpu:
    assert gpu_runs["16-mixed"][1].summary["scaler"] and not gpu_runs["bf16-mixed"][1].summary["scaler"]
    for precision, (_, result, _) in gpu_runs.items():
        assert result.summary["val_acc"] > 0.85, (precision, result.summary["val_acc"])
print("all checks passed")
