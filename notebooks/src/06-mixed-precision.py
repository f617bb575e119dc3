# %% [markdown]
# # 6 · Mixed precision: 16-bit where it is safe, 32-bit where it matters
#
# **Checklist item:** compute the forward and backward passes in a 16-bit format and keep the weights
# and the optimizer update in 32-bit. On GPUs with tensor cores this is often the biggest single
# speed-up, and activations take half the memory. For convolutional networks, a second item goes with
# it: the **channels_last** memory format, which the fast convolution kernels prefer.
#
# In nbtrain: `--precision 16-mixed` (float16 with a gradient scaler, CUDA only), `--precision bf16-mixed`
# (bfloat16, no scaler, CPU or GPU), `--precision 32-true` (the default); `--channels-last true`.
# Cells that need a GPU are marked **[GPU]** and say *skipped* when there is none.

# %%
%load_ext nbtrain
import torch
from torch import nn
from torch.utils.data import TensorDataset
from torchvision.ops import Conv2dNormActivation
from torchvision.transforms import v2
import matplotlib.pyplot as plt

import nbtrain
from nbtrain import ConfigError
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.engine.precision import Precision

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
has_gpu = torch.cuda.is_available()
mkldnn_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
cpu_bf16 = bool(mkldnn_bf16 and mkldnn_bf16())
print("CUDA GPU:", torch.cuda.get_device_name(0) if has_gpu else "none (GPU cells will be skipped)")
print("bfloat16 instructions on this CPU:", "yes" if cpu_bf16 else "no")

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
# `16-mixed` on the CPU is refused before anything trains, with a message that says what to use instead:

# %%
try:
    nbtrain.fit(DigitsMLP(), DigitsDataset(train=True), loss_fn=nn.CrossEntropyLoss(), precision="16-mixed",
                accelerator="cpu", max_steps=1)
except ConfigError as error:
    fp16_on_cpu_message = str(error)
    print(fp16_on_cpu_message)

# %% [markdown]
# ## A convolutional network on images, trained both ways
#
# The digits as 16×16 images (resized once with torchvision, held in a `TensorDataset`), and a small
# convolutional network built from torchvision's `Conv2dNormActivation` blocks (convolution, batch norm,
# ReLU). The same seed, data and settings, trained in `32-true` and then in `bf16-mixed`:

# %%
def digit_images(train):
    digits = DigitsDataset(train=train, image=True)
    return TensorDataset(v2.Resize(16, antialias=True)(digits.x), digits.y)


def make_cnn():
    return nn.Sequential(Conv2dNormActivation(1, 32), Conv2dNormActivation(32, 64, stride=2),
                         Conv2dNormActivation(64, 64, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


train_data, val_data = digit_images(True), digit_images(False)
loss_fn = nn.CrossEntropyLoss()
optimizer = lambda params: torch.optim.AdamW(params, lr=1e-2)

# %%
%%nbtrain --precision 32-true --batch-size 64 --max-epochs 6 --name fp32
torch.manual_seed(0)
model = make_cnn()

# %%
%%nbtrain --precision bf16-mixed --batch-size 64 --max-epochs 6 --name bf16
torch.manual_seed(0)
model = make_cnn()

# %%
with torch.autocast("cpu", dtype=torch.bfloat16):
    activations_dtype = model(val_data.tensors[0][:4]).dtype
print(f"held-out accuracy: 32-true {100 * fp32.summary['val_acc']:.1f}%, bf16-mixed {100 * bf16.summary['val_acc']:.1f}%")
print(f"inside bf16 autocast the model computes in {activations_dtype}; its weights are stored as "
      f"{next(model.parameters()).dtype}")

# %% [markdown]
# Accuracy is the same to within a point or two: autocast runs the convolutions and matrix
# multiplications in bfloat16, but the weights and the update stay float32.
#
# ## The speed, head to head
#
# Two runs one after the other are no speed comparison on a shared machine. `nbtrain.ab` alternates short
# blocks of each setting on the live model — for this CNN, and for the small MLP of notebook 0 — and, for
# the CNN, `channels_last` alone and with bf16:

# %%
# A side and B side start from the live model's config (here the bf16 run above): fp32 is asked for by name.
fp32_64 = {"batch_size": 64, "precision": "32-true"}
cnn_bf16 = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                      b={"batch_size": 64, "precision": "bf16-mixed"}, budget_s=8, min_pairs=6)
cnn_cl = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                    b={**fp32_64, "channels_last": True}, budget_s=8, min_pairs=6)
cnn_both = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                      b={"batch_size": 64, "precision": "bf16-mixed", "channels_last": True}, budget_s=8, min_pairs=6)
cl_on_bf16 = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer,
                        a={"batch_size": 64, "precision": "bf16-mixed"},
                        b={"batch_size": 64, "precision": "bf16-mixed", "channels_last": True}, budget_s=8, min_pairs=6)
mlp_bf16 = nbtrain.ab(DigitsMLP(), DigitsDataset(train=True), loss_fn=loss_fn, a={"batch_size": 128},
                      b={"batch_size": 128, "precision": "bf16-mixed"}, budget_s=8, min_pairs=8)
verdicts = {"CNN: bf16-mixed": cnn_bf16, "CNN: channels_last": cnn_cl, "CNN: both": cnn_both,
            "MLP: bf16-mixed": mlp_bf16}
for name, v in verdicts.items():
    print(f"{name:>19}  {v.text()}")
print(f"CNN, channels_last on top of bf16-mixed: {cl_on_bf16.text()}")

fig, ax = plt.subplots(figsize=(6, 2.4), layout="constrained")
names = list(verdicts)
ratios = [verdicts[n].verdict for n in names]
ax.errorbar([r.ratio for r in ratios], range(len(names)), fmt="o", capsize=4,
            xerr=[[r.ratio - r.low for r in ratios], [r.high - r.ratio for r in ratios]])
ax.axvline(1, color="grey", ls="--", lw=1)
ax.set_yticks(range(len(names)), names)
ax.invert_yaxis()
ax.set_xlabel("speed against 32-true, contiguous (x, 95% interval)")
plt.show()

# %% [markdown]
# The figure shows each speed-up against plain 32-true with its 95% interval; the dashed line is "no
# change". On this CPU, which has bfloat16 instructions (printed at the top), `bf16-mixed` trains the CNN
# measurably faster: across our runs of this notebook its gain read from about 1.6x to 2.3x.
# `channels_last` has no steady direction here: across our runs it read from about 1.5x faster to 1.12x slower (that one beside
# our test suite), alone or on top of bf16 (the last line above). So the checks below hold bf16 to
# "faster" and make no claim for channels_last on a CPU: keep it there only when your own measurement
# says faster. The small MLP gains nothing from bf16: its matrix multiplications are too small for the
# casts to and from bfloat16 to pay off — the same verdict as notebook 0's panel comparison. Whether a
# 16-bit format helps depends on the processor and the model: measure on yours.
#
# ## [GPU] 32-true vs 16-mixed vs bf16-mixed on CUDA
#
# A wider network, so the convolutions are big enough for tensor cores. `16-mixed` runs with the
# gradient scaler.

# %%
gpu_runs, gpu_verdicts = {}, {}
if not has_gpu:
    print("skipped: no CUDA GPU here")
else:
    def wide_cnn():
        return nn.Sequential(Conv2dNormActivation(1, 128), Conv2dNormActivation(128, 256, stride=2),
                             Conv2dNormActivation(256, 256, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(256, 10))
    for precision in ("32-true", "16-mixed", "bf16-mixed"):
        torch.manual_seed(0)
        gpu_runs[precision] = nbtrain.fit(wide_cnn(), train_data, val_data=val_data, loss_fn=loss_fn,
                                          optimizer=optimizer, accelerator="cuda", precision=precision,
                                          batch_size=64, max_epochs=6, name=precision)
        print(f"{precision:>10}: held-out accuracy {100 * gpu_runs[precision].summary['val_acc']:.1f}%, "
              f"gradient scaler {'on' if gpu_runs[precision].summary['scaler'] else 'off'}")
    for precision in ("16-mixed", "bf16-mixed"):
        gpu_verdicts[precision] = nbtrain.ab(wide_cnn(), train_data, loss_fn=loss_fn, optimizer=optimizer,
                                             a={"batch_size": 256, "accelerator": "cuda"},
                                             b={"batch_size": 256, "accelerator": "cuda", "precision": precision},
                                             budget_s=10, min_pairs=6)
        print(f"on the GPU, {gpu_verdicts[precision].text()}")

# %% [markdown]
# **Takeaway:** on a GPU use `bf16-mixed` where it is supported (Ampere and newer), else `16-mixed`
# with its scaler; for convolutional networks add `channels_last`. On a CPU try `bf16-mixed` and keep it
# only if the head-to-head measurement says it helps — the checklist walk (notebook 10) does exactly that.
#
# ## Checks

# %%
assert in_fp16 == 0.0 and in_bf16 > 0 and abs(scaled_fp16 - 1e-8) < 1e-10   # underflow, and the scaler's fix
assert "16-mixed needs a CUDA GPU" in fp16_on_cpu_message and "bf16-mixed" in fp16_on_cpu_message
assert not Precision("bf16-mixed", "cpu").scaler.is_enabled() and activations_dtype == torch.bfloat16
assert fp32.summary["val_acc"] > 0.85 and bf16.summary["val_acc"] > fp32.summary["val_acc"] - 0.05  # no real loss
assert all(p.dtype == torch.float32 for p in model.parameters())                # weights stay fp32
assert not mlp_bf16.verdict.above(0.2), mlp_bf16.text()                          # the MLP: no real bf16 gain
if cpu_bf16:  # measured with bfloat16 instructions; without them these claims do not apply
    assert cnn_bf16.verdict.faster and cnn_both.verdict.faster, (cnn_bf16.text(), cnn_both.text())
if has_gpu:
    assert gpu_runs["16-mixed"].summary["scaler"] and not gpu_runs["bf16-mixed"].summary["scaler"]
    for precision, result in gpu_runs.items():
        assert result.summary["val_acc"] > 0.85, (precision, result.summary["val_acc"])
print("all checks passed")
