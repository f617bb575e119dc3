"""A model too big for one device, split across several: `split(model, {"encoder": "cuda:0", ...})`.

Each named submodule is moved to its device, and a forward pre-hook moves whatever
reaches it (the activations of the previous part) onto that device. The model's output
comes back on the first part's device, where the engine puts each batch, so the loss
and targets meet on one device. The engine sees the mark `split` leaves and neither
moves the model whole nor asks DDP to pin it to one device; under DDP each process
would use a map of its own devices.
"""
from __future__ import annotations

import difflib

import torch
from torch import nn

_MARK = "_nbtrain_device_map"


def _move(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (list, tuple)):
        moved = [_move(v, device) for v in value]
        return type(value)(moved) if isinstance(value, list) else tuple(moved)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def _check(model: nn.Module, device_map: dict) -> dict[str, torch.device]:
    problems = []
    if not isinstance(model, nn.Module):
        raise TypeError(f"split: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(device_map, dict) or not device_map:
        raise ValueError(f"split: device_map={device_map!r}: allowed: a dict of submodule name -> device, "
                         "e.g. {'encoder': 'cuda:0', 'decoder': 'cuda:1'}")
    names = [n for n, _ in model.named_modules() if n]
    devices: dict[str, torch.device] = {}
    for name, where in device_map.items():
        if name not in names:
            near = difflib.get_close_matches(str(name), names, n=3)
            problems.append(f"{name!r}: no such submodule" + (f"; did you mean {', '.join(map(repr, near))}?" if near
                                                             else f"; top-level submodules: "
                                                             f"{', '.join(n for n, _ in model.named_children())}"))
            continue
        try:
            device = torch.device(where)
        except (RuntimeError, TypeError):
            problems.append(f"{name!r}: device {where!r} is not a device; allowed: 'cpu', 'cuda:N', 'mps'")
            continue
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if device.index is None:
                device = torch.device("cuda", 0)
            if device.index >= count:
                problems.append(f"{name!r}: device {where!r} is not available; this machine has {count} CUDA "
                                f"device(s){' (cuda:0..cuda:' + str(count - 1) + ')' if count else ''}")
                continue
        devices[name] = device
    for a in devices:
        for b in devices:
            if a != b and b.startswith(a + "."):
                problems.append(f"{b!r} lies inside {a!r}; map each part once")
    covered = tuple(n + "." for n in devices)
    loose = [n for n, _ in model.named_parameters() if not n.startswith(covered)]
    if loose and not problems:
        problems.append(f"parameters outside every mapped part: {', '.join(loose[:5])}"
                        f"{' ...' if len(loose) > 5 else ''}; add their submodules to the map")
    if problems:
        raise ValueError("split: invalid device_map: " + "; ".join(problems))
    return devices


def split(model: nn.Module, device_map: dict) -> nn.Module:
    """Place each mapped submodule on its device; activations follow. Returns `model`."""
    devices = _check(model, device_map)
    unsplit(model)
    handles = []
    for name, device in devices.items():
        part = model.get_submodule(name)
        part.to(device)
        handles.append(part.register_forward_pre_hook(
            lambda _m, args, kwargs, d=device: (_move(args, d), _move(kwargs, d)), with_kwargs=True))
    first = next(iter(devices.values()))
    handles.append(model.register_forward_pre_hook(
        lambda _m, args, kwargs: (_move(args, first), _move(kwargs, first)), with_kwargs=True))
    handles.append(model.register_forward_hook(lambda _m, _args, output: _move(output, first)))
    setattr(model, _MARK, {"devices": {n: str(d) for n, d in devices.items()}, "handles": handles})
    return model


def unsplit(model: nn.Module) -> nn.Module:
    """Remove the hooks `split` added (the parts stay where they are)."""
    mark = getattr(model, _MARK, None)
    if mark:
        for handle in mark["handles"]:
            handle.remove()
        delattr(model, _MARK)
    return model


def device_map(model: nn.Module) -> dict[str, str] | None:
    """The map a split model was placed with, or None for a model on one device."""
    mark = getattr(model, _MARK, None)
    return dict(mark["devices"]) if mark else None


def input_device(model: nn.Module) -> torch.device | None:
    """Where a split model takes its inputs (its first part's device); None if not split."""
    mapping = device_map(model)
    return torch.device(next(iter(mapping.values()))) if mapping else None
