"""Adapters: the user's own training code as it already is, turned into a Recipe.

`recipe_for(model, ...)` is what `nbtrain.fit`, the checklist tools, `%%nbtrain` and the panel
call on what the user gives: a LightningModule becomes a recipe of its own training_step,
optimizers, schedulers and data; anything else is a plain Recipe.
"""
from __future__ import annotations

from ..recipe import Recipe
from .lightning import is_lightning_module, lightning_recipe

__all__ = ["is_lightning_module", "lightning_recipe", "recipe_for"]


def recipe_for(model, train_data=None, **parts) -> Recipe:
    """The recipe for `model` and its data and parts (None parts are left to their defaults)."""
    parts = {name: value for name, value in parts.items() if value is not None}
    if is_lightning_module(model):
        given = {name: parts.pop(name) for name in ("val_data",) if name in parts}
        return lightning_recipe(model, train_data, **given, **parts)
    return Recipe(model=model, train_data=train_data, **parts)
