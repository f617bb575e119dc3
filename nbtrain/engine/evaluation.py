"""Held-out numbers of the live model: loss, accuracy for class targets, the user's metrics.

Evaluated in eval mode without gradients, in the run's precision, in the data's own order.
Per-batch numbers are averaged weighted by batch size (exact for a loss or an accuracy that
is a mean over samples). Values are summed on the device and read back once at the end.
"""
from __future__ import annotations

import numbers

import torch

from . import data, dist
from .epoch_order import draw_as_a_loader_pass
from ..recipe import RecipeError, split_batch, with_part


def evaluate(engine, dataset) -> dict:
    """{"val_loss", "val_acc" (class targets, or None), "val_<metric>" for each recipe metric,
    and what a LightningModule's validation_step logged}."""
    model, recipe = engine.model, engine.recipe
    loader = data.build_loader(dataset, engine.config.replace(drop_last=False, persistent_workers=False,
                                                              preload_data=False),
                               dist.World(), engine.seed, recipe.collate_fn, shuffle=False)
    totals: dict[str, torch.Tensor] = {}
    counted = {"val_acc": 0}
    seen = 0
    logged = recipe.logged
    if logged is not None:
        logged.drain()  # what the training steps logged last is not a held-out number

    def add(name: str, value, size: int, source: str) -> None:
        value = number(value, source)
        totals[name] = totals.get(name, torch.zeros((), device=value.device)) + value.to(engine.device) * size

    was_training = model.training
    model.eval()
    draw_as_a_loader_pass(loader)  # as the user's `for batch in val_loader` draws its base seed
    try:
        with torch.no_grad(), engine.precision.autocast():
            for batch in loader:
                batch = engine.prepare(batch)
                size = batch_size(batch)
                if recipe.validation_step is not None:
                    add("val_loss", recipe.validation_step(engine.train_model, batch), size, "validation_step")
                elif recipe.training_step is not None or recipe.loss_fn is None:
                    add("val_loss", recipe.step_loss(model, batch), size, "the held-out loss")
                else:
                    inputs, target = split_batch(batch)
                    output = model(inputs)
                    add("val_loss", recipe.loss_fn(output, target), size, "loss_fn")
                    if output.ndim == 2 and target.ndim == 1 and not target.is_floating_point():
                        add("val_acc", (output.argmax(1) == target).float().mean(), size, "val_acc")
                        counted["val_acc"] += size
                    for name, metric in (recipe.metrics or {}).items():
                        add(f"val_{name}", metric(output, target), size, f"the metric {name!r}")
                if logged is not None:  # validation_step's self.log(...) values
                    for name, value in logged.drain().items():
                        add(name if name.startswith("val") else f"val_{name}", value, size, f"self.log({name!r}, ...)")
                seen += size
    finally:
        model.train(was_training)
    out = {name: (total / seen).item() for name, total in totals.items()}
    if counted["val_acc"]:
        out["val_acc"] = totals["val_acc"].item() / counted["val_acc"]
    out.setdefault("val_acc", None)
    return out


def number(value, source: str) -> torch.Tensor:
    """A held-out value as a 0-d float tensor; anything but one number is the user's to fix, named."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.detach().float().reshape(())
    if isinstance(value, numbers.Real) and not isinstance(value, torch.Tensor):
        return torch.tensor(float(value))
    got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else "None" if value is None \
        else f"a str ({value[:40]!r})" if isinstance(value, str) else f"a {type(value).__name__}"
    error = RecipeError(f"{source} returned {got} on a held-out batch; it must return a number (a float or a "
                        "one-element tensor, e.g. a mean over the batch)")
    part = "metrics" if source.startswith("the metric ") else source if source in ("validation_step", "loss_fn") else ""
    raise with_part(error, part) if part else error


def batch_size(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    return 1
