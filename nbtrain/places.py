"""A place in the user's code as people read it: 'train.py:12', or 'cell [3], line 4' for code a
notebook cell defined (whose file is a kernel's temporary file, meaningless to its reader).

The engine and tools know nothing of notebooks: a front-end that runs cells registers how to name
their files (the %%nbtrain extension does, on loading), and every report names places through here.
"""
from __future__ import annotations

from typing import Callable

_NAMERS: list[Callable[[str, int], str | None]] = []


def register(namer: Callable[[str, int], str | None]) -> None:
    """`namer(file, line)` names places it knows (a notebook's cells) and returns None for the rest."""
    if namer not in _NAMERS:
        _NAMERS.append(namer)


def place(file: str, line: int) -> str:
    for namer in _NAMERS:
        named = namer(file, line)
        if named:
            return named
    return f"{file}:{line}"
