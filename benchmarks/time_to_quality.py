"""Time to quality (issue 48): is the walk's choice the same model sooner?

    PYTHONPATH=. python -m benchmarks.time_to_quality [--budget-s 40] [--equal-s 6] [--repeats 3] [--only gpt cnn]

Two workloads written here, each with data that can be learned and a held-out set of its own:
- gpt: a small GPT shaped like nanoGPT (benchmarks/peers.py's TinyGPT: pre-norm causal blocks, tied head; AdamW over
  decay and no-decay groups; a warm-up + cosine rate as a per-step LambdaLR; clipping at 1.0; 2 micro-batches a
  step) on sequences of a fixed random bigram chain (a next token that can be learned; 128 tokens);
- cnn: an MNIST-shaped conv net, Adam, on 1x28x28 images of 10 noisy class templates (template_images).
For each, `nbtrain.checklist` walks from the start (batch 16 on the CPU) within `--budget-s`; then the start and the
walk's choice each train from the same weights on the same data for the same wall time (`--equal-s`), `--repeats`
times, interleaved (start, choice, choice, start, ...), each in a trial that gives the weights back, and each is
scored on the held-out set. Printed: the walk's table (with the critical batch size in its batch row) and the held-out
losses; returned: the choice's median held-out loss over the start's.
Target: <= 1 beyond noise (the kept config never learns worse in the same time).
"""
from __future__ import annotations

import argparse
import math
import statistics

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import nbtrain
from nbtrain import TrainConfig
from nbtrain.tools import trial

from .common import machine
from .peers import TinyGPT, gpt_optimizer, warmup_cosine

TARGET = "<= 1 beyond noise"


def bigram_data(n: int, seed: int, vocab: int = 128, context: int = 32) -> TensorDataset:
    """Sequences of a fixed random bigram chain (the chain seeded 0; the samples seeded `seed`)."""
    chain = torch.softmax(3 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)), dim=1)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n, context + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(context):
        tokens[:, t + 1] = torch.multinomial(chain[tokens[:, t]], 1, generator=g).squeeze(1)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def gpt():
    def model():
        torch.manual_seed(1)
        return TinyGPT()

    m = model()
    parts = dict(training_step=lambda mm, batch: mm(*batch), optimizer=lambda p: gpt_optimizer(p, m),
                 scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_cosine), scheduler_interval="step",
                 val_data=bigram_data(512, seed=2))
    config = TrainConfig(accelerator="cpu", batch_size=16, accumulate_grad_batches=2, gradient_clip_val=1.0)
    return m, bigram_data(4096, seed=1), parts, config


def template_images(n: int, seed: int, noise: float = 3.0) -> TensorDataset:
    """1x28x28 images of 10 classes: a fixed smooth template per class (seeded 0) under pixel noise (seeded `seed`).
    A task a CNN generalises in seconds on a CPU. (The argmax of a random projection, used before, is one it could only
    memorise: its held-out loss rose above chance, ln 10, and a config that learned nothing read as well as it.)"""
    coarse = torch.randn(10, 1, 7, 7, generator=torch.Generator().manual_seed(0))
    templates = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    x = templates[labels] + noise * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(x, labels)


def cnn():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(32 * 12 * 12, 64), nn.ReLU(), nn.Linear(64, 10))
    parts = dict(loss_fn=F.cross_entropy, optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                 val_data=template_images(512, seed=2))
    return m, template_images(4096, seed=1), parts, TrainConfig(accelerator="cpu", batch_size=16)


WORKLOADS = {"gpt": gpt, "cnn": cnn}


def equal_time_loss(model, data, parts, config, seconds: float) -> float:
    """`config` trained `seconds` from the model's weights (given back after), scored on parts' val_data."""
    with trial.borrow(model, data, config=config, **parts) as lent:
        try:
            trial.measure(lent.engine, config, seconds=seconds, warmup_steps=0)
            return float(lent.engine.evaluate(parts["val_data"])["val_loss"])
        finally:
            lent.reset()


def run(name: str, budget_s: float, equal_s: float, repeats: int) -> dict:
    model, data, parts, start = WORKLOADS[name]()
    walk = nbtrain.checklist(model, data, config=start, budget_s=budget_s, **parts)
    print(walk.table())
    chosen = walk.best_config
    losses = {"start": [], "choice": []}
    for r in range(repeats):
        order = [("start", start), ("choice", chosen)]
        for side, config in order if r % 2 == 0 else order[::-1]:
            losses[side].append(equal_time_loss(model, data, parts, config, equal_s))
    critical = next((i.about for i in walk.rows() if i.name == "batch_size" and i.about), "batch row not raced")
    print(f"{name}: held-out loss after {equal_s:.0f} s from the same weights, {repeats}x interleaved: start "
          + ", ".join(f"{x:.3f}" for x in losses["start"]) + "; walk's choice " + ", ".join(f"{x:.3f}" for x in
                                                                                         losses["choice"]))
    changed = chosen.changed_from(walk.start_config)
    print(f"{name}: walk kept {', '.join(f'{k}={v!r}' for k, (_, v) in changed.items()) or 'nothing'}; {critical}")
    ratio = statistics.median(losses["choice"]) / statistics.median(losses["start"])
    worse = min(losses["choice"]) > max(losses["start"])  # every choice run worse than every start run
    return {f"{name}: choice/start held-out loss at {equal_s:.0f} s (median of {repeats})": (ratio, TARGET),
            f"{name}: choice worse in every run": ("yes" if worse else "no", "no"),
            f"{name}: batch kept ({critical.split(' (')[0]})": (str(chosen.batch_size) if "batch_size" in changed
                                                                else "unchanged", "")}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-s", type=float, default=40.0)
    parser.add_argument("--equal-s", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"time to quality on {machine()}")
    out = {}
    for name in args.only or WORKLOADS:
        out.update(run(name, args.budget_s, args.equal_s, args.repeats))
    return {k: (v if not (isinstance(v, float) and math.isnan(v)) else "nan", t) for k, (v, t) in out.items()}


if __name__ == "__main__":
    for measure, (value, target) in main().items():
        print(f"{measure}: {value} (target {target})")
