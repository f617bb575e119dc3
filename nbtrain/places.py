"""A place in the user's code as people read it: 'train.py:12', or 'cell In[3], line 4' for code a
notebook cell defined (whose file is a kernel's temporary file, meaningless to its reader).

The engine and tools know nothing of notebooks and import no IPython: where IPython runs this
process, its running shell says which execution defined a file, and the place is named as
IPython's own tracebacks name it. Every report names places through here.
"""
from __future__ import annotations

import re
import sys

# ipykernel compiles each cell from a file of its own: <temp folder>/ipykernel_<pid>/<hash>.py
_KERNEL_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")


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
    return ipython_cell(file, line) or f"{file}:{line}"
