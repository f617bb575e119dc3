"""What a run trains beyond its config, as one digest: two runs with the same digest and the same config ran
the same code on the same shapes, so a difference in their speed is the machine's (runs/compare.py says
"same settings" instead of a speed verdict).

The digest is of what decides a step's work: the model's modules, their parameter shapes and the bytecode
of the user's own classes and functions (forward, training_step, loss, the optimizer's factory, a dataset's
__getitem__), the data's length and tensor shapes. Bytecode, not source: a class defined in a notebook cell
has no file to read, and an edit that changes what runs changes its bytecode. Where a part cannot be read
(a C extension's callable, an object of unknown kind holding no tensors), the digest is None: nbtrain says
nothing rather than guess that two runs trained alike.
"""
from __future__ import annotations

import functools
import hashlib
import types

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

_OURS = ("torch", "builtins", "nbtrain", "functools", "lightning", "pytorch_lightning", "torchvision")


_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # every module's own bookkeeping (its parameters, hooks, ...)


class Unreadable(Exception):
    """A part of the workload nbtrain cannot put in the digest."""


def digest(recipe, model: nn.Module | None = None) -> str | None:
    """A digest of what `recipe` trains (its model: `model` where the engine wrapped or moved it), or None
    where a part cannot be read."""
    parts: list = [torch.__version__]
    try:
        _add_module(parts, model if model is not None else recipe.model)
        for name in ("loss_fn", "training_step", "optimizer", "collate_fn", "scheduler", "validation_step"):
            parts.append(name)
            _add_callable(parts, getattr(recipe, name, None))
        for name in ("train_data", "val_data", "fixed_loader"):
            parts.append(name)
            _add_data(parts, getattr(recipe, name, None))
        parts.append(_plain(getattr(recipe, "loader_settings", None)))  # a given DataLoader's batch, workers
    except Exception:  # Unreadable, or a user's object that fails to say its length or repr: no digest, no run lost
        return None
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _ours(obj) -> bool:
    """Whether `obj`'s class or function comes from torch, Python or nbtrain itself (their version is in the
    digest): only the user's own code needs its bytecode read."""
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _OURS


def _add_module(parts: list, model: nn.Module) -> None:
    parts.append(repr(model))
    parts.extend((name, tuple(p.shape), str(p.dtype), p.requires_grad) for name, p in model.named_parameters())
    parts.extend((name, tuple(b.shape), str(b.dtype)) for name, b in model.named_buffers())
    seen = set()
    for name, module in model.named_modules():
        kind = type(module)
        if _ours(kind):
            continue  # torch's own module: its repr says its settings
        if kind not in seen:
            seen.add(kind)
            _add_class(parts, kind)
        parts.append(name)  # a user's module: its own settings (a wait, a scale) are in no repr
        _add_attributes(parts, module, leave_out=_MODULE_INTERNALS)


def _add_class(parts: list, kind: type) -> None:
    parts.append(f"{kind.__module__}.{kind.__qualname__}")
    for klass in kind.__mro__:
        if _ours(klass):
            continue
        for name, member in sorted(vars(klass).items()):
            function = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(function, types.FunctionType):
                parts.append(name)
                _add_code(parts, function)


def _add_callable(parts: list, fn) -> None:
    if fn is None:
        parts.append(None)
    elif isinstance(fn, nn.Module):
        _add_module(parts, fn)
    elif isinstance(fn, types.FunctionType):
        _add_code(parts, fn)
    elif isinstance(fn, functools.partial):  # functools' own, but what it calls with is the user's
        _add_callable(parts, fn.func)
        for value in (*fn.args, *sorted(fn.keywords.items())):
            _add_value(parts, value)
    elif isinstance(fn, types.MethodType):
        _add_callable(parts, fn.__self__)
        _add_code(parts, fn.__func__)
    elif _ours(fn) or _ours(type(fn)):
        parts.append(_plain(fn))  # torch's own (a builtin loss, an optimizer's class): its repr says it
    elif callable(fn):
        _add_class(parts, type(fn))
        _add_attributes(parts, fn)
    else:
        raise Unreadable(type(fn).__name__)


def _add_code(parts: list, function: types.FunctionType) -> None:
    if _ours(function):
        parts.append(f"{function.__module__}.{function.__qualname__}")
        return
    parts.append(_code(function.__code__))
    parts.append(_plain(function.__defaults__))
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        _add_value(parts, value)


def _code(code: types.CodeType):
    """A code object's instructions, names and constants, nested functions' too (no line numbers: a
    comment added above does not change what runs)."""
    return (code.co_code, code.co_names, code.co_varnames,
            tuple(_code(c) if isinstance(c, types.CodeType) else _plain(c) for c in code.co_consts))


def _add_value(parts: list, value) -> None:
    if isinstance(value, torch.Tensor):
        parts.append((tuple(value.shape), str(value.dtype)))
    elif isinstance(value, nn.Module):
        _add_module(parts, value)
    elif isinstance(value, (types.FunctionType, types.MethodType)) or (callable(value) and not isinstance(value, type)):
        _add_callable(parts, value)
    else:
        parts.append(_plain(value))


def _add_attributes(parts: list, obj, leave_out=frozenset()) -> None:
    """An object's tensors (their shapes) and plain settings, one level down (but `leave_out`)."""
    for name, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        if name in leave_out:
            continue
        parts.append(name)
        if isinstance(value, torch.Tensor):
            parts.append((tuple(value.shape), str(value.dtype)))
        elif isinstance(value, (list, tuple)) and len(value) > 16:
            parts.append((type(value).__name__, len(value)))  # a data set's list of items: its length
        else:
            parts.append(_plain(value))


def _plain(value):
    """A value's repr where it is a plain one (numbers, strings, their tuples); else its kind."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (tuple, list)) and len(value) <= 16:
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict) and len(value) <= 16:
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype))
    return type(value).__qualname__ if _ours(type(value)) else f"{type(value).__module__}.{type(value).__qualname__}"


def _add_data(parts: list, data) -> None:
    if data is None:
        parts.append(None)
        return
    if isinstance(data, DataLoader):
        parts.append(("DataLoader", data.batch_size, data.num_workers, data.drop_last, type(data.sampler).__name__))
        _add_callable(parts, data.collate_fn)
        data = data.dataset
    if isinstance(data, TensorDataset):
        parts.append(("TensorDataset", tuple((tuple(t.shape), str(t.dtype)) for t in data.tensors)))
        return
    if isinstance(data, (Dataset, torch.utils.data.Dataset)) or hasattr(data, "__getitem__"):
        parts.append(len(data) if hasattr(data, "__len__") else None)
        _add_class(parts, type(data))
        _add_attributes(parts, data)
        return
    raise Unreadable(type(data).__name__)
