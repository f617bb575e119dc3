"""Walks of a model's modules, each read once: what nn.Module's own walks give, without walking again.

Every call reads the model several times (its digest, the optimizer's record of which parameters it holds,
whether a move or a memory format would change anything), and nn.Module's walks are nested generators, one
frame per module per level: on a GPT-2 each costs ~0.05 ms. Where the model's class walks as nn.Module does,
one walk serves; a class that walks its own way (it overrides a walk) is asked through its own methods.
"""
from __future__ import annotations

from torch import nn

_NAMED_WALKS = ("named_modules", "named_parameters", "named_buffers", "_named_members")


def walks_as_a_module(model: nn.Module, *also: str) -> bool:
    """Whether `model`'s class keeps nn.Module's walks (and the methods named in `also`)."""
    kind = type(model)
    return all(getattr(kind, name) is getattr(nn.Module, name) for name in (*_NAMED_WALKS, *also))


def walked(model: nn.Module) -> tuple[list, list, list]:
    """model.named_modules(), named_parameters() and named_buffers(), as lists, from one walk of the modules."""
    modules = list(model.named_modules())
    if not walks_as_a_module(model):
        return modules, list(model.named_parameters()), list(model.named_buffers())
    return modules, members(modules, "_parameters"), members(modules, "_buffers")


def parameters(model: nn.Module) -> list:
    """list(model.parameters())."""
    if not walks_as_a_module(model, "parameters"):
        return list(model.parameters())
    return [tensor for _, tensor in members(list(model.named_modules()), "_parameters")]


def members(modules: list, kind: str) -> list:
    """nn.Module._named_members over `modules` (named_modules' pairs): each tensor once, at its first place,
    None left out."""
    seen, out = set(), []
    for prefix, module in modules:
        for name, tensor in getattr(module, kind).items():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            out.append((f"{prefix}.{name}" if prefix else name, tensor))
    return out


def every_module(model: nn.Module) -> list[nn.Module]:
    """The model and every module under it through their _modules, each once, in no promised order (what
    model.to and a mark's undo reach)."""
    found, seen, stack = [], set(), [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append(module)
        stack += [child for child in module._modules.values() if child is not None]
    return found
