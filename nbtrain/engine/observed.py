"""Values observed now, to compare with values observed later: what a thing IS, never what its code looks like.

`Value(x)` keeps a copy of what `x` is (numbers, strings, containers of them, small tensors and numpy
arrays, a checksum of bigger ones, classes and modules by identity; a function as its code, the values it
captured and the current values of the globals it reads; a bound method as its function and its object; a
plain object of the user's own class as its class, its attributes and its class's attributes), so
`Value(a) == Value(b)` says whether two things are the same, and `Value.text` reads as the value. What cannot
be copied or compared (a module, an object whose attributes are computed when read, a huge tensor) is
`unknown`: equal to anything in the comparison, and named in `Value.unknown` so a caller can say it cannot tell.

`differences(before, now)` compares two records (dicts and lists of Values): each difference in words
("lr 0.1 -> 0.01"; for a function, what it reads that changed: "reads `FACTOR` 0.8 -> 0.5"), and what could
not be told.
"""
from __future__ import annotations

import dis
import functools
import numbers
import types
import weakref
import zlib

import numpy as np
import torch
from torch import nn

from ..options import ATOMS

_SMALL_TENSOR = 4096   # elements: a bigger tensor or array in a closure or a global is not copied but checksummed
_CHECKSUMMED = 1 << 24  # elements: past this, its checksum (~5 GB/s) costs too much for each call: unknown
_DEPTH = 5             # functions and objects reached through functions and objects
_PARTS = 500           # functions and objects read for one Value: past this, too much to compare at each call
_HEAP_TYPE = 1 << 9    # Py_TPFLAGS_HEAPTYPE: a class written in Python (a C class, random.Random's base, keeps
#                        state its attributes do not show)


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


class _Array:
    """A numpy array's copy (small) or checksum (big), with its dtype and shape."""

    def __init__(self, a: np.ndarray):
        self.dtype, self.shape = a.dtype, a.shape
        self.copy = a.copy() if a.size <= _SMALL_TENSOR else None
        self.crc = None if self.copy is not None else zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Array) and (self.dtype, self.shape, self.crc) == (other.dtype, other.shape, other.crc) \
            and (self.copy is None or bool(np.array_equal(self.copy, other.copy, equal_nan=self.dtype.kind in "fc")))

    __hash__ = None


class _Named:
    """A part of what a function or an object reads, with what to call it and how it reads, compared by value."""

    def __init__(self, label: str, key, text: str):
        self.label, self.key, self.text = label, key, text

    def __eq__(self, other) -> bool:
        return isinstance(other, _Named) and self.key == other.key

    __hash__ = None


class Value:
    """One observed value: compared by what it is (a copy taken when observed), shown as it reads."""

    def __init__(self, value, name: str = "value"):
        if type(value) in ATOMS:  # its own key; its text, made from it alone, written when first read
            self.key, self.unknown, self._text, self._atom = value, None, None, value
            return
        unknown = _Read()
        self.key = _key(value, name, unknown, 0)
        self.unknown = unknown[0] if unknown else None
        self._text = _text(value)  # now: what an object shows may change after it is observed

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _text(self._atom)
        return self._text

    @text.setter
    def text(self, text: str) -> None:
        self._text = text

    def __eq__(self, other) -> bool:
        return isinstance(other, Value) and self.key == other.key

    __hash__ = None

    def __repr__(self) -> str:
        return self.text


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 16:  # not a repr at every call
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return "(" + ", ".join(_text(v) for v in value) + ")"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return _text(value.item())
    if isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim and value.dtype != object:
        flat = value.reshape(-1)
        shown = ", ".join(_text(v) for v in flat[:3].tolist()) + (f", ..., {_text(flat[-1].item())}"
                                                                   if len(flat) > 3 else "")
        return f"[{shown}] ({len(flat)} values)"
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, (types.FunctionType, functools.partial)):
        return "a function"
    if isinstance(value, types.MethodType):
        return f"a method ({value.__func__.__name__})"
    try:
        shown = repr(value)
    except Exception:  # a user's __repr__ may fail: the value is still compared, only not shown
        shown = ""
    return shown if 0 < len(shown) <= 40 else type(value).__name__


class _Read(list):
    """What one Value could not compare (a list of words), and how many values it read."""
    parts = 0


def _key(value, name: str, unknown: _Read, depth: int):
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
        if value.numel() <= _CHECKSUMMED and value.layout == torch.strided:
            flat = value.detach().cpu().contiguous().reshape(-1)
            return _Array(flat.view(torch.uint8).numpy()), value.dtype, tuple(value.shape)
        return _note(unknown, f"{name} is a tensor of {value.numel():,} elements")
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufcmMSU":
        if value.size <= _CHECKSUMMED:
            return _Array(value)
        return _note(unknown, f"{name} is an array of {value.size:,} elements")
    if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        return value  # compared by identity: the same class, module or builtin
    if isinstance(value, functools.partial):
        return "partial", _key(value.func, name, unknown, depth), _key(value.args, name, unknown, depth), \
            _key(value.keywords, name, unknown, depth)
    if isinstance(value, (types.FunctionType, types.MethodType)) or _plain_object(value):
        unknown.parts += 1
        if depth >= _DEPTH or unknown.parts > _PARTS:
            return _note(unknown, f"{name} reaches functions and objects {_DEPTH} deep or more than {_PARTS}")
        if isinstance(value, types.MethodType):  # `rule.at`: what it computes is its function over its object
            return "method", _key(value.__func__, name, unknown, depth), _key(value.__self__, name, unknown, depth)
        if isinstance(value, types.FunctionType):
            return _function(value, name, unknown, depth + 1)
        return _object(value, name, unknown, depth + 1)
    return _note(unknown, f"{name} is a {type(value).__name__}, which nbtrain cannot compare")


def _plain_object(value) -> bool:
    """An object whose state is its attributes, read as they are: a settings object of the user's own class (not a
    module, whose parameters change as it trains, nor an object that computes its attributes when read)."""
    kind = type(value)
    return hasattr(value, "__dict__") and not isinstance(value, nn.Module) and kind.__module__ != "builtins" \
        and kind.__getattribute__ is object.__getattribute__ and not hasattr(kind, "__getattr__") \
        and all(c.__flags__ & _HEAP_TYPE and not vars(c).get("__slots__") for c in kind.__mro__[:-1])


def _object(obj, name: str, unknown: _Read, depth: int):
    """An object as what its methods read: its class, its attributes, and its class's own attributes (a rate kept
    on the class, the methods themselves)."""
    kind = type(obj)
    attributes = tuple((n, _Named(f"{kind.__name__}.{n}", _key(v, f"{name}'s `{n}`, which", unknown, depth), _text(v)))
                       for n, v in sorted(vars(obj).items()))
    shared = []
    for cls in kind.__mro__[:-1]:
        for n, v in vars(cls).items():
            if n.startswith("__") and n.endswith("__") or n == "_abc_impl":  # (an ABC's cache of its subclasses)
                continue
            v = v.fget if isinstance(v, property) else v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
            shared.append((n, _Named(f"{cls.__name__}.{n}", _key(v, f"{name}'s class's `{n}`, which", unknown, depth),
                                     _text(v))))
    return "object", kind, attributes, tuple(shared)


def _note(unknown: _Read, what: str) -> _Unknown:
    unknown.append(what)
    return _Unknown(what)


def _function(f: types.FunctionType, name: str, unknown: _Read, depth: int):
    """A function as what decides its results: its code, the values it captured, its defaults, and the values
    now of the globals it reads (a notebook's `LR = 0.01` changes the function's results, not its code)."""
    code = f.__code__
    cells = []
    for cell in f.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            cells.append(None)
    code_key, global_names = _code_reading(code)
    read = sorted(n for n in global_names if n in f.__globals__)
    captured = tuple(_Named(f"captured `{n}`", _key(v, f"{name} captures `{n}`, which", unknown, depth), _text(v))
                     for n, v in zip(code.co_freevars, cells))
    return ("function", code_key, captured,
            _key(f.__defaults__, name, unknown, depth), _key(f.__kwdefaults__, name, unknown, depth),
            tuple((n, _Named(f"reads `{n}`", _key(f.__globals__[n], f"{name} reads `{n}`, which", unknown, depth),
                             _text(f.__globals__[n]))) for n in read))


# A code object cannot change once made, so what it reads and computes is read once per code object (kept
# while the code lives): disassembling a training step's code at every call was most of an adoption's cost.
_READ_CODE: "weakref.WeakKeyDictionary[types.CodeType, tuple[tuple, frozenset]]" = weakref.WeakKeyDictionary()


def _code_reading(code: types.CodeType) -> tuple[tuple, frozenset]:
    """(_code_key, _global_names) of `code`, read at its first look."""
    try:
        return _READ_CODE[code]
    except KeyError:
        read = _READ_CODE[code] = (_code_key(code), frozenset(_global_names(code)))
        return read


def _code_key(code: types.CodeType) -> tuple:
    """What a code object computes (not where it was written: the same lambda in another cell is the same)."""
    return code.co_code, tuple(_code_key(c) if isinstance(c, types.CodeType) else c for c in code.co_consts), \
        code.co_names


def _global_names(code: types.CodeType) -> set:
    """The globals a code object (and those nested in it) reads: not every name it holds (`self.g` names `g`)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
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
    where = _what_changed(before.key, now.key) if isinstance(before, Value) and isinstance(now, Value) else None
    if where:  # a function or an object: what it reads that changed, not two reprs
        return [f"{path.rstrip()}: {where}"], []
    return [f"{path}{getattr(before, 'text', before)} -> {getattr(now, 'text', now)}"], []


def _what_changed(before, now) -> str | None:
    """The innermost named part (a global, a captured value, an attribute) where two keys differ, in words."""
    if isinstance(before, _Named) and isinstance(now, _Named):
        if before == now:
            return None
        inner = _what_changed(before.key, now.key)
        return inner or f"{before.label} {before.text} -> {now.text}"
    if isinstance(before, tuple) and isinstance(now, tuple) and len(before) == len(now):
        if before[:1] == now[:1] == ("function",) and before[1] != now[1]:
            return "a function of other code"
        first = next(((a, b) for a, b in zip(before, now) if not a == b), None)  # where they part first
        return _what_changed(*first) if first else None
    return None
