"""How the magic reports a failure: one line for bad input, the user's own traceback for user code.

IPython shows a UsageError as one line and no traceback. For an exception from the
user's code, the exception itself is re-raised (so the cell fails and `%debug` works)
carrying `_render_traceback_`, which IPython and ipykernel use instead of formatting
the traceback themselves: it starts at the user's first frame, not at nbtrain's.
"""
from __future__ import annotations

import os

import torch
from IPython.core.error import UsageError


from ..config import ConfigError

_NBTRAIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # nbtrain/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def config_usage_error(error: ConfigError, prefix: str = "%%nbtrain") -> UsageError:
    return UsageError(f"{prefix}: {error.render(flag, quote=False)}")


def _file(tb) -> str:
    return os.path.abspath(tb.tb_frame.f_code.co_filename)


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def is_nbtrain_frame(tb) -> bool:
    return _file(tb).startswith(_NBTRAIN_DIR)


def user_traceback(tb):
    """The traceback from the user's first frame: nbtrain's frames (and torch's, when a user frame
    follows them) left out."""
    frames = list(_frames(tb))
    outside_nbtrain = [t for t in frames if not is_nbtrain_frame(t)]
    if not outside_nbtrain:
        return tb
    start = frames.index(outside_nbtrain[0])
    for t in frames[start:]:
        if is_nbtrain_frame(t):
            continue
        if not _file(t).startswith(_TORCH_DIR):
            return t  # the first frame of the user's own code
    return outside_nbtrain[0]


def from_cell(tb, filename: str):
    """The traceback from the frame that runs the cell body (named `filename`)."""
    for t in _frames(tb):
        if t.tb_frame.f_code.co_filename == filename:
            return t
    return tb


def show_as_user_error(shell, error: BaseException, tb) -> BaseException:
    """`error`, made to display only the traceback `tb` (from the user's code) when it is raised."""
    def render():
        return shell.InteractiveTB.structured_traceback(type(error), error, tb)
    try:
        error._render_traceback_ = render
    except AttributeError:  # an exception type without instance attributes: show it whole
        pass
    return error


def training_failure(shell, error: Exception) -> BaseException:
    """What to raise for an exception out of training: a one-line error when nbtrain refused the
    input, nbtrain's own error types as their message, the user's traceback when user code failed,
    everything when nbtrain itself failed unexpectedly."""
    frames = list(_frames(error.__traceback__))
    raised_by_nbtrain = bool(frames) and is_nbtrain_frame(frames[-1])
    if isinstance(error, ConfigError):
        return config_usage_error(error)
    if raised_by_nbtrain and isinstance(error, ValueError):  # RecipeError and the engine's own refusals
        return UsageError(f"%%nbtrain: {error}")
    if raised_by_nbtrain and type(error).__module__.startswith("nbtrain."):
        # nbtrain's own errors (a DDP worker's failure, carrying the worker's user traceback) are
        # messages: their type and text, without the kernel-side frames that raised them.
        error._render_traceback_ = lambda: shell.InteractiveTB.get_exception_only(type(error), error)
        return error
    if raised_by_nbtrain:
        return error  # a bug in nbtrain: its frames are what a report needs
    return show_as_user_error(shell, error, user_traceback(error.__traceback__))
