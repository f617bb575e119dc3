"""Which recipe parts a %%nbtrain cell took from earlier cells, said where the user will look.

The cell body runs in the notebook's namespace and the recipe is read from it by name, so a part
the body does not set (a `loss_fn`, an `optimizer`) silently comes from whatever cell set it last:
a regression cell after a classification cell trains with the CrossEntropyLoss of the first. The
cell says so in its first line (a run's, a tool's, a SLURM job's, the panel's), and an error raised in such
a part repeats it beside the error.

What the cell set is read from its syntax tree (its assignments, imports, defs), not from whether a value
changed: `train_data = data` sets train_data, though to the same object an earlier cell made.
"""
from __future__ import annotations

import ast
from typing import Any, Mapping

from torch import nn

from ..adapters import namespace_parts
from ..recipe import NAMES


def names_before(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values the recipe's conventional names hold before a cell body runs."""
    return {name: namespace.get(name) for names in NAMES.values() for name in names}


_OWN_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)  # their names are theirs


def assigned_names(source: str) -> dict[str, int]:
    """{name: line} for each name the cell's own statements bind (=, +=, :=, for, with, import, def, class,
    except ... as, at any depth outside functions and classes), the line of the last; {} where the source does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, int] = {}
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]  # their bodies bind their own names, not the cell's
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names = [node.id]
        else:
            names = [node.name] if isinstance(node, ast.ExceptHandler) and node.name else []
            pending.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, _OWN_SCOPES))
        for name in names:
            found[name] = max(found.get(name, 0), getattr(node, "lineno", 0))
    return found


def taken_from_earlier(namespace: Mapping[str, Any], before: Mapping[str, Any],
                       assigned: Mapping[str, int]) -> dict[str, str]:
    """{part: 'loss_fn: CrossEntropyLoss()'} for each recipe part the cell body did not set: not among the
    names it `assigned` (assigned_names), and its value as before (a call that set a global changed it)."""
    return {part: f"{part}: {short(value)}" for part, (name, value) in namespace_parts(namespace).items()
            if name not in assigned and before.get(name) is value}


def lines_setting(namespace: Mapping[str, Any], assigned: Mapping[str, int]) -> dict[str, int]:
    """{part: the cell's line that set it} for the recipe parts the cell set itself."""
    return {part: assigned[name] for part, (name, _) in namespace_parts(namespace).items() if name in assigned}


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
