"""The modern speed toggles as pure functions the engine applies to its live parts.

Each toggle is a TrainConfig option. The functions here change one thing (a model's
memory format, an optimizer's kernels, which submodules recompute activations, global
matmul settings) and say why when the toggle does not apply, so the engine can report
"not applicable" instead of silently ignoring it. Every toggle, with the value to try and a small
recipe on which it must train, is listed where the tests that train them live (tests/toggle_recipes.py).
"""
from __future__ import annotations

import functools
import operator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..options import ConfigError, Problem
from . import walks
from .support import constructor_parameters

# --- channels_last -----------------------------------------------------------------------


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def to_channels_last(batch):
    """4-D tensors of a batch in channels-last layout; everything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.ndim == 4 else batch
    if isinstance(batch, (list, tuple)):
        moved = [to_channels_last(b) for b in batch]
        return moved if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: to_channels_last(v) for k, v in batch.items()}
    return batch


def set_memory_format(model: nn.Module, channels_last: bool) -> str | None:
    """Convert the model; returns why it does not apply, or None."""
    if channels_last and not has_conv2d(model):
        return "channels_last: not applicable, the model has no 2-D convolutions (no 4-D activations)"
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if not moves_nothing(model, memory_format=memory_format):
        model.to(memory_format=memory_format)
    return None


_MODULE_APPLY = nn.Module._apply


def moves_nothing(model: nn.Module, device: torch.device | None = None, memory_format=None) -> bool:
    """Whether `model.to(device)` or `model.to(memory_format=...)` would leave every tensor as it is, read off
    every parameter, gradient and buffer: each on `device`, and (a memory format asked) none 4-D or 5-D, the
    only tensors a memory format converts. A module that moves itself its own way (an overridden _apply) is
    not read: it is moved. Reading is ~5x cheaper than the walk model.to makes to change nothing."""
    tensors = []
    for module in walks.every_module(model):
        kind = type(module)
        # model.to walks what each module's _apply walks: its _modules, through children()
        if kind._apply is not _MODULE_APPLY or kind.children is not _CHILDREN or \
                kind.named_children is not _NAMED_CHILDREN:
            return False
        tensors += module._parameters.values()
        tensors += module._buffers.values()
    tensors = [t for t in tensors if t is not None]
    tensors += [g for g in map(_GRAD, tensors) if g is not None]
    if device is not None and any(t.device != device for t in tensors):
        return False
    return memory_format is None or not any(t.dim() in (4, 5) for t in tensors)


_GRAD = operator.attrgetter("grad")
_CHILDREN, _NAMED_CHILDREN = nn.Module.children, nn.Module.named_children


# --- optimizer kernels -------------------------------------------------------------------


def with_implementation(optimizer: torch.optim.Optimizer, impl: str) -> tuple[torch.optim.Optimizer, str | None]:
    """The same optimizer (class, groups, state) using `impl` kernels, or itself and the reason not."""
    cls = type(optimizer)
    accepted = constructor_parameters(cls)
    flags = {"auto": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True},
             "fused": {"fused": True, "foreach": False}}[impl]
    missing = [name for name in flags if name not in accepted]
    if missing:
        return optimizer, f"optimizer_impl={impl}: not applicable, {cls.__name__} offers no {missing[0]} kernels"
    current = {name: optimizer.defaults.get(name) for name in ("foreach", "fused") if name in accepted}
    wanted = {**{name: None if name == "foreach" else False for name in current}, **flags}
    # fused=None is torch's "not fused": the user's own instance is then stepped as it is.
    if all(current.get(name) == value or (name == "fused" and not value and not current.get(name))
           for name, value in wanted.items()):
        return optimizer, None
    groups = [{**{k: v for k, v in g.items() if k not in ("foreach", "fused")}, **wanted}
              for g in optimizer.param_groups]
    # Some defaults are derived, not constructor arguments (AdamW's decoupled_weight_decay).
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in wanted}
    try:
        rebuilt = cls(groups, **defaults, **wanted)
    except (RuntimeError, ValueError, TypeError) as exc:
        return optimizer, f"optimizer_impl={impl}: not applicable here ({exc})"
    rebuilt.load_state_dict(optimizer.state_dict())
    for group in rebuilt.param_groups:  # the saved groups carried the old kernel choice
        group.update(wanted)
    return rebuilt, None


# --- activation checkpointing -------------------------------------------------------------


def checkpoint_targets(model: nn.Module, names: str) -> list[str]:
    """The submodules `names` means: 'auto' is every top-level child that has parameters."""
    if names == "auto":
        blocks = [name for name, child in model.named_children() if any(True for _ in child.parameters())]
        if len(blocks) == 1 and isinstance(model.get_submodule(blocks[0]), nn.Sequential):
            inner = model.get_submodule(blocks[0])
            blocks = [f"{blocks[0]}.{n}" for n, c in inner.named_children() if any(True for _ in c.parameters())]
        return blocks
    known = dict(model.named_modules())
    wrong = [n for n in names.split(",") if n not in known]
    if wrong:
        children = ", ".join(n for n, _ in model.named_children())
        raise ConfigError([Problem("activation_checkpointing", names,
                                   f"the model has no submodule {wrong[0]!r}; its top-level submodules: {children}")])
    return names.split(",")


def set_activation_checkpointing(model: nn.Module, names: str | None) -> list[str]:
    """Recompute the named submodules' activations in backward (None undoes it); returns them."""
    for module in walks.every_module(model):
        # the mark is set below as an instance attribute; read there, a module without it costs no
        # AttributeError raised and caught inside nn.Module.__getattr__ (~2 us a module, at every engine built)
        if vars(module).get("_nbtrain_checkpointed", False):
            del module.forward  # back to the class's forward
            module._nbtrain_checkpointed = False
    if not names:
        return []
    targets = checkpoint_targets(model, names)
    for name in targets:
        module = model.get_submodule(name)
        # An instance attribute shadows the class's forward and leaves the state_dict untouched.
        module.forward = functools.partial(checkpoint, type(module).forward.__get__(module), use_reentrant=False)
        module._nbtrain_checkpointed = True
    return targets


# --- process-wide matmul settings ----------------------------------------------------------


def matmul_settings(matmul_precision: str | None, cudnn_benchmark: bool | None, device_type: str) -> list[str]:
    """Apply the CUDA matmul/cuDNN settings; returns notes for the ones that do not apply here."""
    notes = []
    if device_type != "cuda":
        if matmul_precision is not None:
            notes.append(f"matmul_precision={matmul_precision}: not applicable on {device_type} (TF32 is a CUDA feature)")
        if cudnn_benchmark is not None:
            notes.append(f"cudnn_benchmark={cudnn_benchmark}: not applicable on {device_type} (cuDNN is CUDA's)")
        return notes
    if matmul_precision is not None:
        torch.set_float32_matmul_precision(matmul_precision)
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    return notes
