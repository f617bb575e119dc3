"""The random streams and plain counters a tool's trial may move that are not torch's, numpy's or Python's global
ones (which engine/state.rng_state saves): a generator a data set or a module keeps of its own (a stream's
torch.Generator, an augmentation's np.random.default_rng), and a module's plain Python numbers (`self.calls += 1`,
a curriculum ramp). A trial saves them when it borrows the model and puts them back when it gives it back
(borrow.py), so the next call trains as if no tool had run."""
from __future__ import annotations

import random
import types

import numpy as np
import torch

_PLAIN = (int, float, bool, str, bytes, type(None), complex)
_DEPTH = 4  # attribute hops from a data set to its generator (a Subset's dataset's transform's rng)
_WIDE = 256  # items of one list or dict looked into: a data set's rows are not walked


def _state(stream):
    if isinstance(stream, torch.Generator):
        return stream.get_state()
    if isinstance(stream, np.random.Generator):
        return stream.bit_generator.state
    if isinstance(stream, np.random.RandomState):
        return stream.get_state()
    return stream.getstate()  # random.Random


def _set_state(stream, state) -> None:
    if isinstance(stream, torch.Generator):
        stream.set_state(state)
    elif isinstance(stream, np.random.Generator):
        stream.bit_generator.state = state
    elif isinstance(stream, np.random.RandomState):
        stream.set_state(state)
    else:
        stream.setstate(state)


_STREAMS = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
_OPAQUE = (torch.Tensor, np.ndarray, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType) + _PLAIN


def streams_of(*roots) -> list:
    """The generators reachable from `roots` (data sets, loaders, modules) through attributes, lists and dicts."""
    found, seen = [], set()

    def visit(obj, depth: int) -> None:
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            return
        seen.add(id(obj))
        if isinstance(obj, _STREAMS):
            found.append(obj)
            return
        if depth == 0:
            return
        if isinstance(obj, dict):
            items = list(obj.values())[:_WIDE]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)[:_WIDE]
        else:
            items = list(getattr(obj, "__dict__", {}).values())
        for item in items:
            visit(item, depth - 1)

    for root in roots:
        if isinstance(root, torch.nn.Module):  # each module's own attributes (submodules are walked as modules)
            for module in root.modules():
                for value in list(vars(module).values()):
                    visit(value, 1)
        elif root is not None:
            visit(root, _DEPTH)
    return found


class Saved:
    """The generators reachable from `roots` and the plain numbers of `model`'s modules, as they are now;
    `put_back()` restores them (a plain number the trial added to a module is removed)."""

    def __init__(self, model, *roots):
        self.streams = [(s, _state(s)) for s in streams_of(model, *roots)]
        self.plain = [(m, {k: v for k, v in vars(m).items() if type(v) in _PLAIN}) for m in model.modules()]

    def put_back(self) -> None:
        for stream, state in self.streams:
            _set_state(stream, state)
        for module, values in self.plain:
            space = vars(module)
            for key in [k for k, v in space.items() if type(v) in _PLAIN and k not in values
                        and not k.startswith("_")]:
                del space[key]
            space.update(values)
