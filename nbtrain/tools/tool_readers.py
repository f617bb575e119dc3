"""How one tool option's value is read: options.Option's readers, and a few a tool needs besides.

Each reader takes a value as it arrives (a Python value, a flag's text, a widget's value) and
returns the value the tool uses, or raises options._Reject; reading a value already read gives
it back unchanged, so a front-end may read values before the tool reads them again.
"""
from __future__ import annotations

import math
import re

from ..options import Option, _Reject

_FLOAT = Option("float", "", "")
_NONE = ("", "none")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _is_none(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE)


def _number(low=None, high=None, above=None, below=None, nullable=False):
    """A finite number within the bounds (low/high inclusive, above/below exclusive); a Python int stays
    an int, so a refusal can show the value as it was given (budget_s=30)."""
    def read(value):
        if nullable and _is_none(value):
            return None
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else _FLOAT.read(value)
        too_low = (low is not None and number < low) or (above is not None and number <= above)
        too_high = (high is not None and number > high) or (below is not None and number >= below)
        if not math.isfinite(number) or too_low or too_high:
            raise _Reject
        return number
    return read


def _whole(low=None, high=None, nullable=False):
    return Option("int", "", "", low=low, high=high, nullable=nullable).read


def _choice(choices):
    return Option("choice", "", "", choices=tuple(choices)).read


def _switch():
    return Option("bool", "", "").read


def _parts(value) -> list:
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)):
        return list(value)
    raise _Reject


def _whole_list(low=0, nullable=False):
    """Whole numbers as a list, or as text separated by commas (0,1,2)."""
    whole = _whole(low=low)

    def read(value):
        if nullable and _is_none(value):
            return None
        numbers = [whole(part) for part in _parts(value)]
        if not numbers:
            raise _Reject
        return numbers
    return read


def _names(choices):
    """Names among `choices`, as a list or as text separated by commas (a-b reads as a_b)."""
    def read(value):
        names = tuple(str(part).strip().replace("-", "_") for part in _parts(value))
        if not names or any(name not in choices for name in names):
            raise _Reject
        return names
    return read


def _memory():
    """None, a fraction in (0, 1] of the free memory, a whole number of bytes, or a size text (512MB)."""
    def read(value):
        if _is_none(value):
            return None
        if isinstance(value, str):
            size = _SIZE.match(value)
            value = int(float(size.group(1)) * _UNITS[size.group(2).lower()]) if size else _FLOAT.read(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Reject
        if not (0 < value <= 1 if isinstance(value, float) else value >= 1):
            raise _Reject
        return value
    return read


def _function(nullable=False):
    def read(value):
        if (value is None and nullable) or callable(value):
            return value
        raise _Reject
    return read


def _path():
    return Option("text", "", "").read


READERS = {"number": _number, "whole": _whole, "choice": _choice, "switch": _switch, "whole_list": _whole_list,
            "names": _names, "memory": _memory, "function": _function, "path": _path}
METAVARS = {"number": "X", "whole": "N", "whole_list": "N,N,...", "names": "A,B,...", "memory": "FRACTION|SIZE",
            "path": "PATH"}
