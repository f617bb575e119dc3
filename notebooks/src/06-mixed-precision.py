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
import math

import matplotlib
import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils.data import TensorDataset
from torchvision.ops import Conv2dNormActivation
from torchvision.transforms import v2

import nbtrain
from nbtrain import ConfigError
from nbtrain.demo import DigitsDataset, DigitsMLP
from nbtrain.engine.precision import Precision

plt.rcParams.update({"figure.dpi": 120, "figure.figsize": (7, 2.6)})
has_gpu = torch.cuda.is_available()
# Which bfloat16 path a CPU convolution takes: oneDNN's (needs AVX-512 or newer), on bfloat16 instructions
# (AVX-512 BF16, AMX) or not; or, without oneDNN's, PyTorch's own emulation (an AVX2-only CPU).
mkldnn_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
onednn_bf16 = bool(mkldnn_bf16 and mkldnn_bf16())
bf16_instructions = any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported",
                                                                               "_is_amx_tile_supported"))
cpu_bf16 = onednn_bf16 and bf16_instructions
print("CUDA GPU:", torch.cuda.get_device_name(0) if has_gpu else "none (GPU cells will be skipped)")
cpu_kind = ("bfloat16 instructions" if cpu_bf16 else "no bfloat16 instructions; oneDNN emulates them with AVX-512"
            if onednn_bf16 else "no bfloat16 instructions; PyTorch emulates bfloat16 itself")
print("this CPU:", cpu_kind)

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
# ReLU). The same seed, data and settings, trained in `32-true` and then in `bf16-mixed`; each run reads its
# held-out accuracy after every epoch, so the two are compared on their whole curves, not on one last number:

# %%
def digit_images(train):
    digits = DigitsDataset(train=train, image=True)
    return TensorDataset(v2.Resize(16, antialias=True)(digits.x), digits.y)


def make_cnn():
    return nn.Sequential(Conv2dNormActivation(1, 32), Conv2dNormActivation(32, 64, stride=2),
                         Conv2dNormActivation(64, 64, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


train_data, val_data = digit_images(True), digit_images(False)
loss_fn = nn.CrossEntropyLoss()
# lr 3e-3: at 1e-2 the held-out accuracy swung by up to 29 points from one epoch to the next, in either precision
optimizer = lambda params: torch.optim.AdamW(params, lr=3e-3)

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
print(f"inside bf16 autocast the model computes in {activations_dtype}; its weights are stored as "
      f"{next(model.parameters()).dtype}")

curves = {run.name: [100 * e["val_acc"] for e in run.log.of_type("epoch")] for run in (fp32, bf16)}
LAST = 3  # the plateau: the last epochs' readings, averaged
plateau = {name: sum(acc[-LAST:]) / LAST for name, acc in curves.items()}
# How far one reading moves from the next within a plateau: the wobble a difference must exceed to mean something.
wobble = max(max(acc[-LAST:]) - min(acc[-LAST:]) for acc in curves.values())
gap = plateau["bf16"] - plateau["fp32"]
for name, precision in (("fp32", "32-true"), ("bf16", "bf16-mixed")):
    print(f"{precision:>10}: held-out accuracy by epoch {' '.join(f'{a:.1f}' for a in curves[name])} %; "
          f"last {LAST} epochs {plateau[name]:.1f}%")
within_wobble = abs(gap) <= max(wobble, 1.0)
print(f"bf16-mixed against 32-true over the last {LAST} epochs: {gap:+.1f} points; one epoch's reading moved by up to "
      f"{wobble:.1f} points within either plateau, so "
      + ("no measurable cost in accuracy" if within_wobble else "a difference larger than the curves' own wobble"))

# The whole curves on the left; on the right their last epochs, magnified, with each plateau's average dashed.
fig, (whole, last) = plt.subplots(1, 2, layout="constrained", width_ratios=(3, 2))
epochs = range(1, len(curves["fp32"]) + 1)
for (name, precision), color in zip((("fp32", "32-true"), ("bf16", "bf16-mixed")), ("C0", "C1")):
    whole.plot(epochs, curves[name], "o-", color=color, label=precision)
    last.plot(epochs[-LAST:], curves[name][-LAST:], "o-", color=color)
    last.axhline(plateau[name], color=color, ls="--", lw=1)
whole.set(xlabel="epoch", ylabel="held-out accuracy (%)", ylim=(0, 101))
whole.legend(loc="lower right")
low, high = min(min(acc[-LAST:]) for acc in curves.values()), max(max(acc[-LAST:]) for acc in curves.values())
last.set(xlabel="epoch", title=f"last {LAST} epochs", ylim=(min(low, high - 2) - 0.5, max(high, low + 2) + 0.5),
         xticks=list(epochs[-LAST:]))
plt.show()

# %% [markdown]
# Both curves climb and flatten together: autocast runs the convolutions and matrix multiplications in
# bfloat16, but the weights and the update stay float32. Compare the plateaus, not the last points: a
# single reading moves from epoch to epoch, and from seed to seed. At a learning rate of 1e-2 this network's
# readings swung by up to 29 points from one epoch to the next in either precision, and over eight seeds a
# single last reading put bf16-mixed anywhere from 7 points above 32-true to 7 below (on CPUs with and
# without bfloat16 instructions), while the averages of the eight agreed within a point. At 3e-3 (here)
# the curves flatten: over their last three epochs the two precisions differed by at most 1.0 point in
# every one of our seeds (eight with bfloat16 instructions, four without), where their last readings alone
# differed by up to 1.9 points.
#
# ## The speed, head to head
#
# Two runs one after the other are no speed comparison on a shared machine. `nbtrain.ab` alternates short
# blocks of each setting on the live model — for this CNN, and for the small MLP of notebook 0 — and, for
# the CNN, `channels_last` alone and with bf16. Since bf16 changes the arithmetic, each bf16 line first says
# what it learns: both sides trained for the same seconds from the same weights, scored on held-out data,
# and which reached the worse side's final loss sooner; its samples/s comes after:

# %%
# A side and B side start from the live model's config (here the bf16 run above): fp32 is asked for by name.
# bf16's blocks last seconds where PyTorch emulates it (and where other work slows the CNN's steps): the two
# comparisons a claim rests on get 24 and 16 s, enough pairs for an interval there (at 12 and 8 s a busy
# 2-core machine gave them 2-3 pairs: 17 and 19 of 20 held); they stop sooner where the interval narrows to
# +-5%. channels_last alone, on which no claim rests on a CPU, gets 4 s. What bf16 does to what is learned is
# raced once for each model (cnn_bf16, mlp_bf16); the combinations are about speed alone (learn_s=0).
fp32_64 = {"batch_size": 64, "precision": "32-true"}
cnn_bf16 = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                      b={"batch_size": 64, "precision": "bf16-mixed"}, budget_s=24, min_pairs=6)
cnn_cl = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                    b={**fp32_64, "channels_last": True}, budget_s=4, min_pairs=6)
cnn_both = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer, a=fp32_64,
                      b={"batch_size": 64, "precision": "bf16-mixed", "channels_last": True}, budget_s=16, min_pairs=6,
                      learn_s=0)
cl_on_bf16 = nbtrain.ab(model, train_data, loss_fn=loss_fn, optimizer=optimizer,
                        a={"batch_size": 64, "precision": "bf16-mixed"},
                        b={"batch_size": 64, "precision": "bf16-mixed", "channels_last": True}, budget_s=4, min_pairs=6,
                        learn_s=0)
mlp_bf16 = nbtrain.ab(DigitsMLP(), DigitsDataset(train=True), loss_fn=loss_fn, a={"batch_size": 128},
                      b={"batch_size": 128, "precision": "bf16-mixed"}, budget_s=8, min_pairs=8)
verdicts = {"CNN: bf16-mixed": cnn_bf16, "CNN: channels_last": cnn_cl, "CNN: both": cnn_both,
            "MLP: bf16-mixed": mlp_bf16}
for name, v in verdicts.items():
    print(f"{name:>19}  {v.text()}")
print(f"CNN, channels_last on top of bf16-mixed: {cl_on_bf16.text()}")
gain = cnn_bf16.verdict
print(f"\nOn this CPU ({cpu_kind}), bf16-mixed trains the CNN " +
      (f"{gain.ratio:.2f}x faster than 32-true." if gain.faster else
       f"{1 / gain.ratio:.1f}x slower than 32-true." if gain.measurable else
       f"at a speed this run could not tell from 32-true's ({'95% interval ' * (not gain.too_few_pairs)}"
       f"{gain.interval_text()}): measure again on a quieter machine."
       if gain.too_noisy or not math.isfinite(gain.low) else "at no measurably different speed."))

fig, ax = plt.subplots(figsize=(6, 2.4), layout="constrained")
names = list(verdicts)
ratios = [verdicts[n].verdict for n in names]
# A verdict from too few pairs has no interval worth drawing (2 pairs' can span 0.01x-100x): its point alone, marked.
bars = [(0.0, 0.0) if r.too_few_pairs else (r.ratio - r.low, r.high - r.ratio) for r in ratios]
ax.errorbar([r.ratio for r in ratios], range(len(names)), fmt="o", capsize=4, xerr=list(zip(*bars)))
for row, r in enumerate(ratios):
    if r.too_few_pairs:
        ax.annotate(f"  {r.pairs} pairs: too few for an interval", (r.ratio, row), va="center", fontsize=8)
ax.axvline(1, color="grey", ls="--", lw=1)
ax.set_xscale("log")  # 2x faster and 2x slower lie as far from 1
low, high = ax.get_xlim()
round_ratios = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 1, 1.25, 1.5, 2, 3, 5, 7, 10)
shown = []  # round ratios outward from 1, about six across whatever range the intervals span
for r in sorted(round_ratios, key=lambda r: abs(math.log(r))):
    if low <= r <= high and all(abs(math.log(r / s)) >= math.log(high / low) / 7 for s in shown):
        shown.append(r)
ax.set_xticks(shown, [f"{r:g}x" for r in shown], minor=False)
ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
ax.set_yticks(range(len(names)), names)
ax.invert_yaxis()
ax.set_xlabel("speed against 32-true, contiguous (x, 95% interval)")
plt.show()

# %% [markdown]
# The figure shows each speed-up against plain 32-true with its 95% interval; the dashed line is "no change";
# the line above it says what that means on this CPU. Which way bf16-mixed goes on a CPU depends on its
# instructions. With bfloat16 instructions (AVX-512 BF16 or AMX: Intel Xeons since Cooper Lake, AMD Zen 4 and
# newer) it trained this CNN faster across our runs, from about 1.3x (beside other work) to 2.3x. Without them
# (AVX2 only: most laptops, desktops and many cloud machines) PyTorch emulates bfloat16 convolutions with
# float32 instructions and conversions, and the same CNN trained several times slower: 5x to 9x in our runs as
# such a CPU. The accuracy above is unharmed there too, though the emulation sums each convolution's weight
# gradient over the batch in bfloat16 (on a batch of 64, an error of about 1% of the gradient where bfloat16
# instructions give 0.2%): so on a CPU without bfloat16 instructions keep `32-true`. `channels_last` has no
# steady direction on a CPU: across our runs it read from about 1.5x faster to 1.12x slower (that one beside
# our test suite), alone or on top of bf16 (the last line above). So the checks below hold bf16 to "faster"
# only where the CPU has bfloat16 instructions, to "not faster" where PyTorch emulates it, and make no claim
# for channels_last on a CPU: keep it there only when your own measurement says faster. The small MLP gains
# nothing from bf16: its matrix multiplications are too small for the casts to and from bfloat16 to pay off —
# the same verdict as notebook 0's panel comparison. Whether a 16-bit format helps depends on the processor
# and the model: measure on yours.
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
        print(f"{precision:>10}: held-out accuracy {100 * gpu_runs[precision].summary.val_acc:.1f}%, "
              f"gradient scaler {'on' if gpu_runs[precision].summary.scaler else 'off'}")
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
from nbtrain.notebook.claims import checks_done, claim

assert in_fp16 == 0.0 and in_bf16 > 0 and abs(scaled_fp16 - 1e-8) < 1e-10   # underflow, and the scaler's fix
assert "16-mixed needs a CUDA GPU" in fp16_on_cpu_message and "bf16-mixed" in fp16_on_cpu_message
assert not Precision("bf16-mixed", "cpu").scaler.is_enabled() and activations_dtype == torch.bfloat16
# no real cost: over the plateau, bf16-mixed within 2 points of 32-true (our seeds, with and without bfloat16
# instructions: at most 1.0 point apart)
assert plateau["fp32"] > 95 and plateau["bf16"] > 95 and gap > -2.0, (plateau, curves)
assert all(p.dtype == torch.float32 for p in model.parameters())                # weights stay fp32
claim(not mlp_bf16.verdict.above(0.2), mlp_bf16, "the MLP: no real bf16 gain")
if cpu_bf16:  # with bfloat16 instructions, bf16 pays on the CNN
    claim(cnn_bf16.verdict.faster, cnn_bf16, "the CNN: bf16-mixed faster")
    claim(cnn_both.verdict.faster, cnn_both, "the CNN: bf16-mixed with channels_last faster")
if not onednn_bf16:  # PyTorch's own emulation (an AVX2-only CPU): no gain
    claim(not cnn_bf16.verdict.faster, cnn_bf16, "emulated bf16: the CNN no faster")
    claim(not cnn_both.verdict.faster, cnn_both, "emulated bf16: the CNN with channels_last no faster")
if has_gpu:
    assert gpu_runs["16-mixed"].summary.scaler and not gpu_runs["bf16-mixed"].summary.scaler
    for precision, result in gpu_runs.items():
        assert result.summary.val_acc > 0.85, (precision, result.summary.val_acc)
print(checks_done())
