"""A worker's traceback as the user needs it: their own frames, with their own source lines.

Worker side, `user_traceback` drops torch's and nbtrain's frames. Kernel side,
`with_user_source` puts back what the worker could not know: code shipped by value
(cloudpickle renames its file to "<dynamic-code>") is found again among the objects the
kernel shipped and its notebook's namespace, so a frame names the cell file and line and
shows the line itself.
"""
from __future__ import annotations

import linecache
import re
import sys
import traceback
import types
from pathlib import Path

import torch

_HIDDEN_ROOTS = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parent.parent))
_FRAME = re.compile(r'(\s*File ")(.+)(", line )(\d+)(, in )(.+)')


def user_traceback(exc: BaseException) -> str:
    """The formatted traceback without torch's and nbtrain's frames (all frames if only those).

    A torch error nbtrain can say in the user's terms (DDP's unused parameters) is that message
    and the user's frames only: torch's and nbtrain's frames would only hide the way out.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    users = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_HIDDEN_ROOTS)
             and "runpy" not in f.filename]
    explained = _explained(exc)
    if explained is not None:
        lines = ["Traceback (most recent call last):\n"] if users else []
        lines += traceback.format_list(traceback.StackSummary.from_list(users))
        lines += [f"{type(exc).__name__}: {explained}\n"] + [f"{note}\n" for note in getattr(exc, "__notes__", ())]
        return "".join(lines)
    # The call that raised stays in view when it is torch's (a shape error's functional.py line); the
    # frames between the user's and it (nbtrain's loop, torch's module calls) are folded into one line.
    shown = users + [f for f in frames[-1:]
                     if f not in users and str(Path(f.filename).resolve()).startswith(_HIDDEN_ROOTS[0])]
    lines = ["Traceback (most recent call last):\n"]
    if shown and len(frames) > len(shown):
        lines.append(f"  [... {len(frames) - len(shown)} frames of nbtrain and torch folded]\n")
    lines += traceback.format_list(traceback.StackSummary.from_list(shown or frames))
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


_UNUSED_PARAMETERS = re.compile(r"parameters that were not used in producing loss")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def _explained(exc: BaseException) -> str | None:
    """nbtrain's own message for a torch error whose text names torch's API, not nbtrain's option."""
    text = str(exc)
    if not (isinstance(exc, RuntimeError) and _UNUSED_PARAMETERS.search(text)):
        return None
    found = _UNUSED_INDICES.search(text)
    which = (f" (on rank {found.group(1)}, parameters {', '.join(found.group(2).split())} of "
             "model.parameters() got no gradient)") if found else ""
    return ("DDP expected a gradient for every parameter, but some of the model's parameters took no part in "
            f"the loss{which}; set find_unused_parameters=True (flag --find-unused-parameters true) to let DDP "
            "skip them, or make every parameter take part in the loss")


def _codes_of(obj, found: list, seen: set, depth: int = 0) -> None:
    """Code objects reachable from a function, class, module instance or container."""
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, types.CodeType):
        found.append(obj)
        for const in obj.co_consts:
            _codes_of(const, found, seen, depth + 1)
    elif isinstance(obj, (types.FunctionType, types.MethodType)):
        _codes_of(getattr(obj, "__func__", obj).__code__, found, seen, depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                _codes_of(cell.cell_contents, found, seen, depth + 1)
            except ValueError:
                pass
    elif isinstance(obj, (staticmethod, classmethod)):
        _codes_of(obj.__func__, found, seen, depth + 1)
    elif isinstance(obj, property):
        for part in (obj.fget, obj.fset):
            if part is not None:
                _codes_of(part, found, seen, depth + 1)
    elif isinstance(obj, type):
        if obj.__module__.split(".")[0] in ("torch", "builtins", "nbtrain"):
            return
        for value in vars(obj).values():
            _codes_of(value, found, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            _codes_of(item, found, seen, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            _codes_of(item, found, seen, depth + 1)
    elif isinstance(obj, torch.nn.Module):
        for module in obj.modules():
            _codes_of(type(module), found, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, types.ModuleType):
        _codes_of(type(obj), found, seen, depth + 1)
        if dataclass_fields := getattr(obj, "__dataclass_fields__", None):
            for name in dataclass_fields:
                _codes_of(getattr(obj, name, None), found, seen, depth + 1)


def with_user_source(text: str, shipped=()) -> str:
    """`text` with "<dynamic-code>" frames resolved to the kernel's files and every source line shown."""
    codes: list = []
    seen: set = set()
    _codes_of(list(shipped), codes, seen)
    main = sys.modules.get("__main__")
    if main is not None:
        _codes_of([v for v in vars(main).values() if isinstance(v, (types.FunctionType, type))], codes, seen)
    out, lines = [], text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        frame = _FRAME.match(line.rstrip("\n"))
        if frame and frame.group(2) == "<dynamic-code>":
            number, name = int(frame.group(4)), frame.group(6)
            matches = {c.co_filename for c in codes if c.co_name == name
                       and number in {n for _, _, n in c.co_lines() if n}}
            if len(matches) == 1:
                line = "".join(frame.group(1, 2, 3, 4, 5, 6)).replace("<dynamic-code>", matches.pop()) + "\n"
                frame = _FRAME.match(line.rstrip("\n"))
        out.append(line)
        next_is_source = i + 1 < len(lines) and lines[i + 1].startswith("    ")
        if frame and not next_is_source:
            source = linecache.getline(frame.group(2), int(frame.group(4))).strip()
            if source:
                out.append(f"    {source}\n")
    return "".join(out)


def error_line(text: str) -> str:
    """The headline of a formatted traceback: the last exception's type and the first line of its message.

    A message's further lines and the notes nbtrain adds stay in the text below the headline. The
    exception line is the first unindented line after the last "Traceback" header (frame and source
    lines are indented; a chained exception's own traceback comes before that header).
    """
    lines = text.strip().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    after = lines[headers[-1] + 1:] if headers else lines
    return next((line for line in after if line and not line[0].isspace()), lines[-1] if lines else "an error")
