"""Adapters: the user's own training code as it already is, turned into a Recipe.

`recipe_for(model, ...)` is what `nbtrain.fit`, the checklist tools, `%%nbtrain` and the panel
call on what the user gives: a LightningModule becomes a recipe of its own training_step,
optimizers, schedulers and data; anything else is a plain Recipe.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ..recipe import NAMES, Recipe, RecipeError, reads_as
from .lightning import OWN_PARTS, is_lightning_module, lightning_recipe

__all__ = ["is_lightning_module", "lightning_recipe", "namespace_parts", "recipe_for", "recipe_from_namespace"]


def recipe_for(model, train_data=None, **parts) -> Recipe:
    """The recipe for `model` and its data and parts (None parts are left to their defaults)."""
    parts = {name: value for name, value in parts.items() if value is not None}
    if is_lightning_module(model):
        given = {name: parts.pop(name) for name in ("val_data",) if name in parts}
        return lightning_recipe(model, train_data, **given, **parts)
    return Recipe(model=model, train_data=train_data, **parts)


def namespace_parts(namespace: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """{part: (the name it is read from, its value)}: the recipe parts a namespace defines (recipe.NAMES,
    first match wins); a LightningModule's own parts are left out (an earlier cell's `optimizer` or
    `loss_fn` is not this module's: it brings its own)."""
    found = {}
    for part, names in NAMES.items():
        name = next((name for name in names if reads_as(name, namespace.get(name))), None)
        if name is not None:
            found[part] = (name, namespace[name])
    if "model" in found and is_lightning_module(found["model"][1]):
        found = {part: named for part, named in found.items() if part not in OWN_PARTS}
    return found


def recipe_from_namespace(namespace: Mapping[str, Any]) -> Recipe:
    """The recipe of a notebook's namespace, read by conventional names (recipe.NAMES)."""
    found = {part: value for part, (_, value) in namespace_parts(namespace).items()}
    lightning = found.get("model") is not None and is_lightning_module(found["model"])
    needed = ("model",) if lightning else ("model", "train_data")
    missing = [NAMES[p][0] for p in needed if p not in found]
    if missing:
        raise RecipeError(
            f"the namespace defines no {' and no '.join(missing)}; define "
            + ", ".join(f"`{m}`" for m in missing)
            + " (a recipe needs model, train_data and loss_fn or training_step)")
    if isinstance(found.get("loss_fn"), torch.Tensor):
        del found["loss_fn"]  # a leftover `loss` tensor from an earlier cell is not a loss function
    return recipe_for(found.pop("model"), found.pop("train_data", None), **found)
