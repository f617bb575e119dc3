"""How the magic reports a failure: one line for bad input, the user's own traceback for user code.

IPython shows a UsageError as one line and no traceback. For an exception from the
user's code, the exception itself is re-raised (so the cell fails and `%debug` works)
carrying `_render_traceback_`, which IPython and ipykernel use instead of formatting
the traceback themselves: it shows the user's frames (a cell's as "Cell In[5], line 6") and
the call that raised (torch's, in a shape error), with nbtrain's, torch's and the libraries'
frames between them folded into one line each.
"""
from __future__ import annotations

import os
import sysconfig
import types

import torch
from IPython.core.error import UsageError


from ..options import ConfigError, flag_name

_NBTRAIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # nbtrain/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_LIBRARY_DIRS = (_NBTRAIN_DIR, _TORCH_DIR, os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep)


def config_usage_error(error: ConfigError, prefix: str = "%%nbtrain") -> UsageError:
    return UsageError(f"{prefix}: {error.render(flag_name, quote=False)}")


def _file(tb) -> str:
    return os.path.abspath(tb.tb_frame.f_code.co_filename)


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def is_nbtrain_frame(tb) -> bool:
    return _file(tb).startswith(_NBTRAIN_DIR)


def is_user_frame(tb) -> bool:
    """A frame of code the user wrote: not nbtrain's, torch's, Python's own or an installed package's."""
    file = _file(tb)
    return not (file.startswith(_LIBRARY_DIRS) or "<frozen " in file
                or f"{os.sep}site-packages{os.sep}" in file or f"{os.sep}dist-packages{os.sep}" in file)


def user_frames(tb) -> tuple[list, list]:
    """(frames shown, how many frames are folded before each): the user's frames and the frame that
    raised; the rest (nbtrain's loop, torch's module calls, library internals) folded."""
    frames = list(_frames(tb))
    kept = [t for t in frames[:-1] if is_user_frame(t)] + frames[-1:]
    positions = [frames.index(t) for t in kept]
    return kept, [b - a - 1 for a, b in zip([-1] + positions, positions)]


def _relinked(frames: list):
    """A traceback of just `frames` (in order), for IPython to format."""
    tb = None
    for t in reversed(frames):
        tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return tb


def cell_frames(filename: str, lines: list[int]) -> list:
    """Traceback entries at `lines` of the cell that ran as `filename`, each as IPython shows a frame of a
    cell ("Cell In[5], line 6" and the lines around it, read from the cell's source IPython keeps)."""
    frames = []
    for line in sorted(set(lines)):
        try:  # a real frame of code named as the cell, stopped at that line: IPython formats it as its own
            exec(compile("\n" * (line - 1) + "raise RuntimeError", filename, "exec"), {})
        except RuntimeError as here:
            frames.append(here.__traceback__.tb_next)
    return frames


def folded_render(shell, error: BaseException, tb, cell_lines: list | None = None):
    """A `_render_traceback_` for `error` showing user_frames(tb), a line where frames were folded; before
    them, where the cell's own code ran in none of them, `cell_lines` (cell_frames) set apart by a line."""
    kept, skipped = user_frames(tb)
    lead = cell_lines or []
    kept, skipped = lead + kept, [0] * len(lead) + skipped

    def render():
        parts = shell.InteractiveTB.structured_traceback(type(error), error, _relinked(kept))
        if len(parts) < 3 + len(kept):  # not IPython's layout (rule, header, one part per frame, exception)
            return parts
        for i in reversed(range(len(kept))):
            if skipped[i]:
                parts.insert(2 + i, f"    [... {skipped[i]} frame{'s' * (skipped[i] > 1)} of nbtrain, torch and "
                                    "libraries folded]\n")
        if lead:
            parts.insert(2, "    [the cell's lines that set the parts nbtrain called when it failed:]\n")
        return parts
    return render


def from_cell(tb, filename: str):
    """The traceback from the frame that runs the cell body (named `filename`)."""
    for t in _frames(tb):
        if t.tb_frame.f_code.co_filename == filename:
            return t
    return tb


def show_as_user_error(shell, error: BaseException, tb, fold: bool = False, cell_lines: list | None = None
                       ) -> BaseException:
    """`error`, made to display only the traceback `tb` (from the user's code) when it is raised;
    `fold`: only the user's frames of it and the frame that raised (folded_render), after `cell_lines`."""
    def render():
        return shell.InteractiveTB.structured_traceback(type(error), error, tb)
    try:
        error._render_traceback_ = folded_render(shell, error, tb, cell_lines) if fold else render
    except AttributeError:  # an exception type without instance attributes: show it whole
        pass
    return error


# The parts a failing part was handed: a loss_fn is called on the model's output.
_CALLED = {"loss_fn": ("model", "loss_fn")}


def training_failure(shell, error: Exception, taken: dict | None = None, cell: tuple | None = None) -> BaseException:
    """What to raise for an exception out of training: a one-line error when nbtrain refused the
    input, nbtrain's own error types as their message, the user's traceback when user code failed,
    everything when nbtrain itself failed unexpectedly. `taken`: the recipe parts that came from
    earlier cells (earlier.py); an error raised in one of them says so beside it. `cell`: (the name the
    cell ran as, {part: the cell's line that set it}); where no frame of the cell is in the traceback
    (a library's model or loss), the lines that set the parts that failed come first, as in a script."""
    frames = list(_frames(error.__traceback__))
    raised_by_nbtrain = bool(frames) and is_nbtrain_frame(frames[-1])
    if isinstance(error, ConfigError):
        return config_usage_error(error)
    origin = (taken or {}).get(getattr(error, "nbtrain_part", None), "")
    if raised_by_nbtrain and isinstance(error, ValueError):  # RecipeError and the engine's own refusals
        return UsageError(f"%%nbtrain: {error}" + (f" ({origin} from an earlier cell)" if origin else ""))
    if origin:
        error.add_note(f"nbtrain: {origin} from an earlier cell")
    if raised_by_nbtrain and type(error).__module__.startswith("nbtrain."):
        # nbtrain's own errors (a DDP worker's failure, carrying the worker's user traceback) are
        # messages: their type and text, without the kernel-side frames that raised them.
        error._render_traceback_ = lambda: shell.InteractiveTB.get_exception_only(type(error), error)
        return error
    if raised_by_nbtrain:
        return error  # a bug in nbtrain: its frames are what a report needs
    lead = []
    if cell is not None and not any(t.tb_frame.f_code.co_filename == cell[0] for t in frames):
        part = getattr(error, "nbtrain_part", None)
        lead = cell_frames(cell[0], [cell[1][p] for p in _CALLED.get(part, (part,)) if p in cell[1]])
    return show_as_user_error(shell, error, error.__traceback__, fold=True, cell_lines=lead)
