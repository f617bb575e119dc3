"""A place in the user's code as people read it: 'train.py:12', or 'cell In[3], line 4' for code a
notebook cell defined (whose file is a kernel's temporary file, meaningless to its reader).

The engine and tools know nothing of notebooks and import no IPython: where IPython runs this
process, its running shell says which execution defined a file, and the place is named as
IPython's own tracebacks name it. A front-end may register more namers; every report names
places through here.
"""
from __future__ import annotations

import re
import sys
from typing import Callable

_NAMERS: list[Callable[[str, int], str | None]] = []
# ipykernel compiles each cell from a file of its own: <temp folder>/ipykernel_<pid>/<hash>.py
_KERNEL_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")


def register(namer: Callable[[str, int], str | None]) -> None:
    """`namer(file, line)` names places it knows and returns None for the rest."""
    if namer not in _NAMERS:
        _NAMERS.append(namer)


def ipython_cell(file: str, line: int) -> str | None:
    """'cell In[5], line 6' for a file a cell of the running IPython defined (None elsewhere)."""
    ipython = sys.modules.get("IPython")  # loaded only where IPython runs: never imported here
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(file)
    if number is not None:
        return f"cell In[{number}], line {line}"
    if _KERNEL_CELL_FILE.search(file):  # a cell of a kernel whose shell is not this process's (a DDP rank's)
        return f"a notebook cell, line {line}"
    return None


def place(file: str, line: int) -> str:
    for namer in [*_NAMERS, ipython_cell]:
        named = namer(file, line)
        if named:
            return named
    return f"{file}:{line}"
