"""Values observed now, to compare with values observed later: what a thing IS, never what its code looks like.

`Value(x)` keeps a copy of what `x` is (numbers, strings, containers of them, small tensors, classes and
modules by identity; a function as its code, the values it captured and the current values of the globals
it reads), so `Value(a) == Value(b)` says whether two things are the same, and `Value.text` reads as the
value. What cannot be copied or compared (an object of the user's own class, a big tensor) is `unknown`:
equal to anything in the comparison, and named in `Value.unknown` so a caller can say it cannot tell.

`differences(before, now)` compares two records (dicts and lists of Values): each difference in words
("lr 0.1 -> 0.01"), and what could not be told.
"""
from __future__ import annotations

import functools
import numbers
import types

import torch

_SMALL_TENSOR = 4096  # elements: a bigger tensor in a closure or a global is not copied to be compared
_DEPTH = 4            # functions reached through functions


class _Unknown:
    """A value nbtrain cannot copy or compare: equal to anything; where one is found, a caller cannot tell."""

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other) -> bool:
        return True

    __hash__ = None


class _Tensor:
    def __init__(self, t: torch.Tensor):
        self.t = t.detach().to("cpu", copy=True)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Tensor) and self.t.dtype == other.t.dtype and self.t.shape == other.t.shape \
            and bool(torch.equal(self.t, other.t))

    __hash__ = None


class Value:
    """One observed value: compared by what it is (a copy taken when observed), shown as it reads."""

    def __init__(self, value, name: str = "value"):
        unknown: list[str] = []
        self.key = _key(value, name, unknown, 0)
        self.unknown = unknown[0] if unknown else None
        self.text = _text(value)

    def __eq__(self, other) -> bool:
        return isinstance(other, Value) and self.key == other.key

    __hash__ = None

    def __repr__(self) -> str:
        return self.text


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return "(" + ", ".join(_text(v) for v in value) + ")"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return _text(value.item())
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, (types.FunctionType, functools.partial)):
        return "a function"
    return repr(value) if len(repr(value)) <= 40 else type(value).__name__


def _key(value, name: str, unknown: list, depth: int):
    if value is None or isinstance(value, (bool, str, bytes, numbers.Number)):
        return value
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_key(v, name, unknown, depth) for v in value)
    if isinstance(value, dict):
        return "dict", tuple((_key(k, name, unknown, depth), _key(v, f"{name}[{k!r}]", unknown, depth))
                             for k, v in value.items())
    if isinstance(value, (set, frozenset)) and all(v is None or isinstance(v, (bool, str, numbers.Number))
                                                   for v in value):
        return "set", frozenset(value)
    if isinstance(value, torch.Tensor):
        if value.numel() <= _SMALL_TENSOR:
            return _Tensor(value)
        return _note(unknown, f"{name} is a tensor of {value.numel():,} elements")
    if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        return value  # compared by identity: the same class, module or builtin
    if isinstance(value, functools.partial):
        return "partial", _key(value.func, name, unknown, depth), _key(value.args, name, unknown, depth), \
            _key(value.keywords, name, unknown, depth)
    if isinstance(value, types.FunctionType):
        if depth >= _DEPTH:
            return _note(unknown, f"{name} calls functions {_DEPTH} deep")
        return _function(value, name, unknown, depth + 1)
    return _note(unknown, f"{name} is a {type(value).__name__}, which nbtrain cannot compare")


def _note(unknown: list, what: str) -> _Unknown:
    unknown.append(what)
    return _Unknown(what)


def _function(f: types.FunctionType, name: str, unknown: list, depth: int):
    """A function as what decides its results: its code, the values it captured, its defaults, and the values
    now of the globals it reads (a notebook's `LR = 0.01` changes the function's results, not its code)."""
    code = f.__code__
    cells = []
    for cell in f.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            cells.append(None)
    read = sorted(n for n in _global_names(code) if n in f.__globals__)
    return ("function", _code_key(code), _key(tuple(cells), name, unknown, depth),
            _key(f.__defaults__, name, unknown, depth), _key(f.__kwdefaults__, name, unknown, depth),
            tuple((n, _key(f.__globals__[n], f"{name} reads `{n}`, which", unknown, depth)) for n in read))


def _code_key(code: types.CodeType) -> tuple:
    """What a code object computes (not where it was written: the same lambda in another cell is the same)."""
    return code.co_code, tuple(_code_key(c) if isinstance(c, types.CodeType) else c for c in code.co_consts), \
        code.co_names


def _global_names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def differences(before, now, path: str = "") -> tuple[list[str], list[str]]:
    """How record `now` differs from `before` (dicts of dicts and Values, keys naming what they hold), in
    words ("lr 0.1 -> 0.01"); and what cannot be told (an unknown value where the rest is equal)."""
    if isinstance(before, dict) and isinstance(now, dict):
        found, unsure = [], []
        for key in dict.fromkeys([*before, *now]):
            if key not in before or key not in now:
                found.append(f"{path}{key} {'added' if key in now else 'removed'}")
                continue
            more, less = differences(before[key], now[key], f"{path}{key} ")
            found += more
            unsure += less
        return found, unsure
    if before == now:
        unknown = getattr(before, "unknown", None) or getattr(now, "unknown", None)
        return [], [unknown] if unknown else []
    return [f"{path}{getattr(before, 'text', before)} -> {getattr(now, 'text', now)}"], []
