"""The gradient noise scale read on the live model, in a trial (measure/noise_scale.py has the arithmetic).

Each repeat takes `k` consecutive batches of the config's batch size B from the trial's own loader (the user's
data, collate and order), computes each batch's gradient of the recipe's loss (a mean over the batch, as every
loss nbtrain trains is read), and reads |G_B|^2 as the mean of their squared norms and |G_kB|^2 as the squared
norm of their mean: the gradient of the k batches together. Nothing steps the optimizer; the trial gives the
model back bit for bit (weights, buffers, gradients, modes, RNG: engine/borrow.py). The forward runs in the
config's precision (autocast where it is mixed), as training computes the gradients the noise scale is about.
"""
from __future__ import annotations

import torch

from ..measure.noise_scale import NoiseScale, noise_scale
from . import trial

_K = 8  # batches per repeat: B_big = 8 B (the larger the ratio, the better |G|^2 is resolved)


def read_noise_scale(engine, *, repeats: int = 20, k: int = _K, seconds: float | None = None) -> NoiseScale:
    """B_simple of the trial engine's model at its config's batch size; the caller resets the trial. `seconds`:
    stop taking repeats after this long (at least 5 are taken: the fewest the interval comes from)."""
    import time
    model, recipe = engine.model, engine.recipe
    params = [p for p in model.parameters() if p.requires_grad]
    small = engine.config.batch_size
    small_sq, big_sq = [], []
    batches = iter(engine.loader)
    was_training = model.training
    model.train()
    t0 = time.perf_counter()
    try:
        for _ in range(repeats):
            if seconds is not None and len(small_sq) >= 5 and time.perf_counter() - t0 > seconds:
                break
            total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
            squares = 0.0
            for _ in range(k):
                trial.stop_at_block_edge()
                batch, batches = _next(batches, engine)
                for p in params:
                    p.grad = None
                with engine.precision.autocast():
                    loss = recipe.step_loss(model, engine.prepare(batch))
                loss.float().backward()
                grads = [p.grad.detach().double() if p.grad is not None else torch.zeros_like(t)
                         for p, t in zip(params, total)]
                squares += float(sum((g * g).sum() for g in grads))  # one read back per batch, not per tensor
                for t, g in zip(total, grads):
                    t += g
            small_sq.append(squares / k)
            big_sq.append(float(sum((t * t).sum() for t in total)) / k**2)
    finally:
        for p in params:
            p.grad = None
        model.train(was_training)
    return noise_scale(small_sq, big_sq, small, k * small)


def _next(batches, engine):
    """The next batch, and the iterator it came from (a new pass where the data ran out)."""
    try:
        return next(batches), batches
    except StopIteration:
        batches = iter(engine.loader)
        return next(batches), batches


def noise_scale_of(model=None, train_data=None, *, recipe=None, config=None, repeats: int = 20, k: int = _K,
                   **parts) -> NoiseScale:
    """B_simple of a model on its data (or the live engine's), read in a trial that gives the model back."""
    with trial.borrow(model, train_data, recipe=recipe, config=config, **parts) as lent:
        try:
            return read_noise_scale(lent.engine, repeats=repeats, k=k)
        finally:
            lent.reset()
