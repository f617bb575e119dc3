"""How one option's value is read, and what is allowed: one vocabulary for TrainConfig's fields and
the checklist tools' options.

Values may arrive as strings (a magic flag, a text box) or as Python values; an option's kind
reads them into one canonical value or rejects them (`Reject`), and every problem found is
collected into one ConfigError naming the option, the value and what is allowed. The kinds:

    whole         a whole number within bounds       number      a finite number within bounds
    switch        true / false                       choice      one of a fixed set (with aliases)
    names         several of a fixed set (a,b)       whole_list  whole numbers (0,1,2 or a list)
    modules       None, auto, or submodule paths     every       N steps or a duration (90s, 10m, 1h)
    text, path    any text / a file or folder path   host        a host name or IP address
    endpoint      host:port                          function    a callable
    memory        a fraction of free memory, a number of bytes or a size (512MB)

What is allowed is written from the bounds here (`allowed_text`), not at each option.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Problem:
    option: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"{self.option}={self.value!r}: {self.allowed}"


class ConfigError(ValueError):
    """Every problem with a configuration, each naming the option, the value and what is allowed."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self, name: Callable[[str], str] = lambda option: option, quote: bool = True) -> str:
        """The message, with option names spelled by `name` (e.g. as magic flags).

        `quote=False` shows values as typed on a command line (`--batch-size=0`).
        """
        lines = [f"{name(p.option)}={repr(p.value) if quote else p.value}: {p.allowed}" for p in self.problems]
        head = "invalid training configuration" if len(lines) > 1 else "invalid training configuration:"
        return head + (" " + lines[0] if len(lines) == 1 else "\n  " + "\n  ".join(lines))

    def _render_traceback_(self) -> list[str]:
        """What IPython shows in a notebook: the message alone, as for bad input to a magic (rule 3); the
        frames a refusal passed through (a tool's trial, the engine's check) are nbtrain's, not the user's."""
        return [f"{type(self).__name__}: {self}"]


# --- how an option is spelled on a command line: the one place that says it -------------------

def flag_name(option: str) -> str:
    """The option as a flag: batch_size is --batch-size (%%nbtrain, python -m nbtrain, a config's as_flags)."""
    return "--" + option.replace("_", "-")


def option_name(flag: str) -> str:
    """The option a flag names: --batch-size, batch-size and batch_size all name batch_size."""
    return flag.strip().lstrip("-").replace("-", "_")


# --- how to read one value ----------------------------------------------------------

# Exactly these types (a subclass may be anything): immutable, their own JSON form and their own key; most of a
# config's values and of a run's summary (config.py, records.py, engine/observed.py read them from here).
ATOMS = frozenset((int, float, str, bool, type(None)))

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null", "auto", ""}


class Reject(Exception):
    """Raised by a reader: this value is not allowed (the caller names the option and what is)."""


def _read_int(value):
    if isinstance(value, bool):
        raise Reject
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise Reject


def _read_float(value):
    if isinstance(value, bool):
        raise Reject
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise Reject


def _read_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise Reject


class Interval(str):
    """A checkpoint interval as a config holds it: its canonical text ('500' optimizer steps, '90s'),
    typed once here so nothing parses the text again."""

    @property
    def steps(self) -> int:
        return 0 if self.endswith("s") else int(self)

    @property
    def seconds(self) -> float:
        return float(self[:-1]) if self.endswith("s") else 0.0


def _read_every(value):
    """A checkpoint interval: N (optimizer steps) or a duration like 90s / 10m / 1h; None for never."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none", "never", "off"}):
        return None
    if isinstance(value, bool):
        raise Reject
    text = str(value).strip().lower().replace(" ", "")
    for suffixes, seconds in ((("h", "hour", "hours"), 3600), (("m", "min", "minutes"), 60), (("s", "sec", "seconds"), 1)):
        for suffix in suffixes:
            if text.endswith(suffix) and text[:-len(suffix)].replace(".", "", 1).isdigit():
                amount = float(text[:-len(suffix)]) * seconds
                if amount <= 0:
                    raise Reject
                return Interval(f"{amount:g}s")
    if text.isdigit() and int(text) >= 1:
        return Interval(int(text))
    raise Reject


def _read_text(value):
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise Reject
    text = str(value.__fspath__() if hasattr(value, "__fspath__") else value)
    if "\0" in text:
        raise Reject
    return text


def _read_modules(value):
    """None, 'auto', or submodule names (dotted paths) as a comma-separated text or a list."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in {"", "none", "false", "off"}):
        return None
    if value is True:
        return "auto"
    names = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None:
        raise Reject
    names = [str(n).strip() for n in names]
    if not names or not all(part.isidentifier() or part.isdigit() for n in names for part in n.split(".")):
        raise Reject
    return ",".join(names)


# A host name, an IPv4 address, or an IPv6 address (in brackets inside an endpoint).
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,251}[A-Za-z0-9_])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*")


def _read_host(value):
    """None (the default) or a host name / IP address; an IPv6 address may be bracketed."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    if not isinstance(value, str):
        raise Reject
    text = value.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if _HOSTNAME.fullmatch(bare) or _IPV6.fullmatch(bare):
        return bare
    raise Reject


def _read_endpoint(value):
    """None or 'host:port' ('[v6]:port' for IPv6) with a port from 1 to 65535."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    if not isinstance(value, str) or ":" not in value:
        raise Reject
    host, _, port = value.strip().rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise Reject
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise Reject  # an IPv6 host needs brackets, or its last group reads as the port
    bare = _read_host(host)
    if bare is None:
        raise Reject
    return f"[{bare}]:{int(port)}" if ":" in bare else f"{bare}:{int(port)}"


def _bounded(low=None, high=None, above=None, below=None):
    def check(number):
        if (low is not None and number < low) or (above is not None and number <= above) \
                or (high is not None and number > high) or (below is not None and number >= below):
            raise Reject
        return number
    return check


def _read_number(value):
    """A finite number; a Python int stays an int, so a message can show a value as it was given (30)."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else _read_float(value)
    if not math.isfinite(number):
        raise Reject
    return number


def _parts(value) -> list:
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)):
        return list(value)
    raise Reject


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _read_memory(value):
    """None, a fraction in (0, 1] of the free memory, a whole number of bytes, or a size text (512MB)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, str):
        size = _SIZE.match(value)
        value = int(float(size.group(1)) * _UNITS[size.group(2).lower()]) if size else _read_float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Reject
    if not (0 < value <= 1 if isinstance(value, float) else value >= 1):
        raise Reject
    return value


def _read_function(value):
    if callable(value):
        return value
    raise Reject


def reader(kind: str, *, low=None, high=None, above=None, below=None, choices=(), aliases=None,
           nullable: bool = False) -> Callable:
    """How a value of this kind is read: the value as used, or Reject. Reading a value already read
    gives it back unchanged, so a front-end may read a value before the config or the tool does."""
    if kind in _SELF_READING:  # these say themselves what stands for None
        return _SELF_READING[kind]
    bounded = _bounded(low, high, above, below)
    if kind == "whole":
        read = lambda value: bounded(_read_int(value))  # noqa: E731
    elif kind == "number":
        read = lambda value: bounded(_read_number(value))  # noqa: E731
    elif kind == "switch":
        read = _read_bool
    elif kind == "choice":
        def read(value):
            key = str(value).strip().lower()
            key = (aliases or {}).get(key, key)
            if key not in choices:
                raise Reject
            return key
    elif kind == "names":
        def read(value):  # a-b reads as a_b
            names = tuple(option_name(str(part)) for part in _parts(value))
            if not names or any(name not in choices for name in names):
                raise Reject
            return names
    elif kind == "whole_list":
        def read(value):
            numbers = [bounded(_read_int(part)) for part in _parts(value)]
            if not numbers:
                raise Reject
            return numbers
    else:
        read = _read_function

    def read_or_none(value):
        if value is None or (nullable and isinstance(value, str) and value.strip().lower() in _NONE):
            if nullable:
                return None
            raise Reject
        return read(value)
    return read_or_none


_SELF_READING = {"memory": _read_memory, "modules": _read_modules, "every": _read_every, "text": _read_text,
                 "path": _read_text, "host": _read_host, "endpoint": _read_endpoint}
KINDS = ("whole", "number", "switch", "choice", "names", "whole_list", "memory", "function") + tuple(_SELF_READING)
METAVARS = {"whole": "N", "number": "X", "switch": "BOOL", "names": "A,B,...", "whole_list": "N,N,...",
            "memory": "FRACTION|SIZE", "function": "FUNCTION", "modules": "NAMES", "every": "EVERY", "text": "TEXT",
            "path": "PATH", "host": "HOST", "endpoint": "HOST:PORT"}
_NOUNS = {"whole": "a whole number", "number": "a number", "whole_list": "a list of whole numbers"}


def _figure(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def allowed_text(kind: str, *, low=None, high=None, above=None, below=None, choices=(), nullable: bool = False,
                 noun: str | None = None, note: str = "", none: str = "") -> str:
    """What a refusal says is allowed, written from the bounds: `a whole number from 1 to 64`, `a number
    in [0, 1) (note)`, `one of a, b, or None (what None means)`. `noun` names the number ("a fraction")."""
    if kind in _NOUNS:
        noun = noun or _NOUNS[kind]
        lowest = (low, "[") if low is not None else (above, "(")
        highest = (high, "]") if high is not None else (below, ")")
        if lowest[0] is not None and highest[0] is not None:
            text = (f"{noun} from {_figure(low)} to {_figure(high)}" if kind == "whole" else
                    f"{noun} in {lowest[1]}{_figure(lowest[0])}, {_figure(highest[0])}{highest[1]}")
        else:
            text = noun + "".join(f" {sign} {_figure(x)}" for sign, x in
                                  ((">=", low), (">", above), ("<=", high), ("<", below)) if x is not None)
    elif kind == "switch":
        text = "true or false"
    elif kind in ("choice", "names"):
        text = ("one of " if kind == "choice" else "each one of ") + ", ".join(choices)
    else:
        raise ValueError(f"an option of kind {kind!r} says what is allowed itself")
    return text + (f" ({note})" if note else "") + (", or None" + (f" ({none})" if none else "") if nullable else "")


@dataclass(frozen=True)
class Option:
    """How one TrainConfig field is read and checked. `allowed`, the text users see on a bad value, is
    written from the bounds unless given (allowed_text's `note`, `none` and `noun` add to it)."""
    kind: str  # one of KINDS
    help: str
    allowed: str = ""
    low: float | None = None      # bounds: low/high inclusive, above/below exclusive
    high: float | None = None
    above: float | None = None
    below: float | None = None
    cap: float | None = None      # a sanity limit refused but not stated (nobody means 2**20 micro-batches)
    choices: tuple[str, ...] = ()
    aliases: dict | None = None
    nullable: bool = False
    note: str = ""
    none: str = ""
    noun: str | None = None

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        bounds = dict(low=self.low, above=self.above, below=self.below, choices=self.choices, nullable=self.nullable)
        if not self.allowed:
            object.__setattr__(self, "allowed", allowed_text(self.kind, high=self.high, noun=self.noun, note=self.note,
                                                             none=self.none, **bounds))
        high = self.high if self.cap is None else self.cap
        object.__setattr__(self, "_read", reader(self.kind, high=high, aliases=self.aliases, **bounds))

    @property
    def metavar(self) -> str:
        return "|".join(self.choices) if self.kind == "choice" else METAVARS[self.kind]

    def read(self, value):
        out = self._read(value)
        return float(out) if self.kind == "number" and out is not None else out  # a config holds floats


def setting(default, kind: str, help: str, **reading):
    """A TrainConfig field: its default, and how its values are read (Option's fields)."""
    return field(default=default, metadata={"option": Option(kind, help, **reading)})
