"""Which recipe parts a %%nbtrain cell took from earlier cells, said where the user will look.

The cell body runs in the notebook's namespace and the recipe is read from it by name, so a part
the body does not set (a `loss_fn`, an `optimizer`) silently comes from whatever cell set it last:
a regression cell after a classification cell trains with the CrossEntropyLoss of the first. The
cell says so in its first line (a run's, a tool's, a SLURM job's, the panel's), and an error raised in such
a part repeats it beside the error.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from ..adapters import namespace_parts
from ..recipe import NAMES


def names_before(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values the recipe's conventional names hold before a cell body runs."""
    return {name: namespace.get(name) for names in NAMES.values() for name in names}


def taken_from_earlier(namespace: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, str]:
    """{part: 'loss_fn: CrossEntropyLoss()'} for each recipe part whose value the cell body left as it was."""
    return {part: f"{part}: {short(value)}" for part, (name, value) in namespace_parts(namespace).items()
            if before.get(name) is value}


def header(earlier: Mapping[str, str]) -> str:
    """One line: 'loss_fn: CrossEntropyLoss() from an earlier cell' (or '...; ... from earlier cells'), or ''."""
    if not earlier:
        return ""
    return "; ".join(earlier.values()) + (" from an earlier cell" if len(earlier) == 1 else " from earlier cells")


def short(value) -> str:
    """A recipe part as a reader recognises it, on one short line."""
    if isinstance(value, nn.Module):
        text = repr(value)
        return text if "\n" not in text and len(text) <= 60 else f"{type(value).__name__}(...)"
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, Mapping):
        return "dict of " + ", ".join(map(str, list(value)[:6]))
    if isinstance(value, (str, int, float)):
        return repr(value)
    try:
        return f"{type(value).__name__} of {len(value):,} samples"
    except TypeError:
        return type(value).__name__
