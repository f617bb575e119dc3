"""How one configuration value is read and what is allowed.

Values may arrive as strings (a magic flag, a text box) or as Python values; each option's
`Option` reads them into one canonical value or rejects them, and every problem found is
collected into one ConfigError naming the option, the value and what is allowed.
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


# --- how to read one value ----------------------------------------------------------

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null", "auto", ""}


class _Reject(Exception):
    pass


def _read_int(value):
    if isinstance(value, bool):
        raise _Reject
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise _Reject


def _read_float(value):
    if isinstance(value, bool):
        raise _Reject
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _Reject


def _read_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _Reject


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
        raise _Reject
    text = str(value).strip().lower().replace(" ", "")
    for suffixes, seconds in ((("h", "hour", "hours"), 3600), (("m", "min", "minutes"), 60), (("s", "sec", "seconds"), 1)):
        for suffix in suffixes:
            if text.endswith(suffix) and text[:-len(suffix)].replace(".", "", 1).isdigit():
                amount = float(text[:-len(suffix)]) * seconds
                if amount <= 0:
                    raise _Reject
                return Interval(f"{amount:g}s")
    if text.isdigit() and int(text) >= 1:
        return Interval(int(text))
    raise _Reject


def _read_text(value):
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise _Reject
    text = str(value.__fspath__() if hasattr(value, "__fspath__") else value)
    if "\0" in text:
        raise _Reject
    return text


def _read_names(value):
    """None, 'auto', or submodule names (dotted paths) as a comma-separated text or a list."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in {"", "none", "false", "off"}):
        return None
    if value is True:
        return "auto"
    names = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None:
        raise _Reject
    names = [str(n).strip() for n in names]
    if not names or not all(part.isidentifier() or part.isdigit() for n in names for part in n.split(".")):
        raise _Reject
    return ",".join(names)


@dataclass(frozen=True)
class Option:
    """How one field is read and checked. `allowed` is the text users see on a bad value."""
    kind: str  # "int", "float", "bool", "choice"
    allowed: str
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    aliases: dict | None = None
    nullable: bool = False

    def read(self, value):
        if self.kind in _SPECIAL_READERS:
            return _SPECIAL_READERS[self.kind](value)
        if value is None or (self.nullable and isinstance(value, str) and value.strip().lower() in _NONE):
            if self.nullable:
                return None
            raise _Reject
        if self.kind == "choice":
            key = str(value).strip().lower()
            key = (self.aliases or {}).get(key, key)
            if key not in self.choices:
                raise _Reject
            return key
        reader = {"int": _read_int, "float": _read_float, "bool": _read_bool}[self.kind]
        out = reader(value)
        if self.kind == "float" and not math.isfinite(out):
            raise _Reject
        if self.low is not None and out < self.low:
            raise _Reject
        if self.high is not None and out > self.high:
            raise _Reject
        return out


# A host name, an IPv4 address, or an IPv6 address (in brackets inside an endpoint).
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,251}[A-Za-z0-9_])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*")


def _read_host(value):
    """None (the default) or a host name / IP address; an IPv6 address may be bracketed."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    if not isinstance(value, str):
        raise _Reject
    text = value.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if _HOSTNAME.fullmatch(bare) or _IPV6.fullmatch(bare):
        return bare
    raise _Reject


def _read_endpoint(value):
    """None or 'host:port' ('[v6]:port' for IPv6) with a port from 1 to 65535."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    if not isinstance(value, str) or ":" not in value:
        raise _Reject
    host, _, port = value.strip().rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _Reject
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise _Reject  # an IPv6 host needs brackets, or its last group reads as the port
    bare = _read_host(host)
    if bare is None:
        raise _Reject
    return f"[{bare}]:{int(port)}" if ":" in bare else f"{bare}:{int(port)}"


_SPECIAL_READERS = {"names": _read_names, "every": _read_every, "text": _read_text, "host": _read_host,
                    "endpoint": _read_endpoint}


def _opt(default, kind, allowed, help, **kw):
    return field(default=default, metadata={"option": Option(kind, allowed, help, **kw)})
