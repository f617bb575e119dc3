"""The checklist tools as `%%nbtrain` options: one tool per cell, on the cell's own recipe, shown inline.

    %%nbtrain --profile --trace step.json        bottleneck breakdown: stacked bar and verdict
    %%nbtrain --find-batch-size --memory-budget 0.3
    %%nbtrain --find-workers --seconds 1         %%nbtrain --find-lr         %%nbtrain --find-leaks
    %%nbtrain --find-sync                        (CUDA only: says so elsewhere)
    %nbtrain_checklist --budget 60 --keep-best   the automated walk: table and waterfall
    %%nbtrain --panel                            the control panel for this recipe instead of a run

The magic reads the flags and the recipe exactly as for a training run; this module turns the
tool flags into the tool's keyword arguments, calls the tool (which measures on the live model
and restores it), and shows its table and plot. Tool options arrive as text, like every flag,
and the tools check their own values: their messages (`steps=2: a whole number >= 4`) are shown
with the flag's name instead of the keyword's.
"""
from __future__ import annotations

import base64
import html
import io
import re

from IPython.core.error import UsageError
from IPython.display import display

from ..tools.checklist import ITEMS as CHECKLIST_ITEMS
from ..config import ConfigError, TrainConfig
from . import errors

# tool flag dest -> what it does (the help text); the function is found by tool_function()
TOOLS = {
    "profile": "bottleneck breakdown: per-phase step time as a stacked bar, the machine's ceilings (loader alone, "
               "model alone, FLOPs utilisation), and a verdict in words",
    "find_batch_size": "largest batch that fits the memory budget, with the learning rate scaled, and its speed "
                       "against the starting batch (head to head, 95% interval)",
    "find_workers": "DataLoader worker counts measured (steady rate, 95% interval); the fastest kept only when "
                    "measurably faster than the start head to head",
    "find_lr": "LR finder: exponential sweep, suggestion at the steepest descent",
    "find_leaks": "graph-retention detector: loss tensors kept across steps, and the line to change",
    "find_sync": "sync-point detector (CUDA): where the step forces host/device synchronisation",
    "checklist": "the automated checklist walk (as %nbtrain_checklist): each item kept only when its head-to-head "
                 "interval lies above the keep threshold; table and waterfall",
    "panel": "show the control panel for this cell's recipe instead of training",
}
# tool option dest -> (metavar, help, tools it applies to, the tool's keyword)
OPTIONS = {
    "steps": ("N", "optimizer steps the tool watches (profile 20, find-lr 100, find-leaks 10, find-sync 5)",
              ("profile", "find_lr", "find_leaks", "find_sync"), "steps"),
    "trace": ("PATH", "also write a torch.profiler trace (open in Perfetto)", ("profile",), "trace"),
    "memory_budget": ("FRACTION|SIZE", "peak memory a trial may reach: a fraction of free memory (0.3) or a size "
                      "(512MB, 2GB); CPU default 0.5", ("find_batch_size", "checklist"), "memory_budget"),
    "max_batch": ("N", "largest batch to try (default: the samples per process)", ("find_batch_size",), "max_batch"),
    "lr_rule": ("linear|sqrt|none", "how the learning rate follows the batch found (default linear)",
                ("find_batch_size",), "rule"),
    "workers": ("N,N,...", "worker counts to try (default 0,1,2,4,... up to the cores)", ("find_workers",),
                "candidates"),
    "seconds": ("S", "measuring time per worker setting (default 2)", ("find_workers",), "seconds"),
    "start_lr": ("LR", "first rate of the sweep (default 1e-7)", ("find_lr",), "start_lr"),
    "end_lr": ("LR", "last rate of the sweep (default 10)", ("find_lr",), "end_lr"),
    "budget": ("S", "seconds the walk may take (default 60)", ("checklist",), "budget_s"),
    "keep_best": (None, "leave the live model on the best config, and use it in later cells", ("checklist",),
                  "keep_best"),
    "target_global_batch": ("N", "global batch the walk accumulates up to", ("checklist",), "target_global_batch"),
    "items": ("A,B,...", "checklist items to try (default all): " + ", ".join(CHECKLIST_ITEMS), ("checklist",),
              "items"),
}
DESTS = tuple(TOOLS) + tuple(OPTIONS)
FIGSIZE = {"profile": (8, 2.6), "find_batch_size": (6, 3.2), "find_workers": (7, 3), "find_lr": (6, 3.2),
           "find_leaks": (5, 3), "find_sync": (7, 3), "checklist": (9, 3.8)}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def flag(dest: str) -> str:
    return errors.flag(dest)


def add_tool_flags(parser) -> None:
    group = parser.add_argument_group("checklist tools (one per cell; they measure the live model, then restore "
                                      "it; as a line magic, on the recipe already in the namespace)")
    for dest, text in TOOLS.items():
        group.add_argument(flag(dest), dest=dest, action="store_true", help=text.replace("%", "%%"))
    group = parser.add_argument_group("tool options")
    for dest, (metavar, text, tools, _) in OPTIONS.items():
        text = f"{text} [{', '.join(flag(t) for t in tools)}]"
        if metavar is None:
            group.add_argument(flag(dest), dest=dest, action="store_true", help=text)
        else:
            group.add_argument(flag(dest), dest=dest, metavar=metavar, default=None, help=text)


def chosen_tool(args) -> str | None:
    """The one tool the flags ask for (None: train); the tool's keyword arguments are checked later.

    Raises UsageError for two tools at once, or a tool option without its tool.
    """
    tools = [t for t in TOOLS if getattr(args, t, False)]
    if len(tools) > 1:
        raise UsageError(f"%%nbtrain: {' and '.join(flag(t) for t in tools)}: one tool per cell; allowed: one of "
                         f"{', '.join(flag(t) for t in TOOLS)}")
    tool = tools[0] if tools else None
    for dest, (_, _, owners, _) in OPTIONS.items():
        value = getattr(args, dest, None)
        if value not in (None, False) and tool not in owners:
            shown = "" if value is True else f" {value}"
            raise UsageError(f"%%nbtrain: {flag(dest)}{shown} applies to "
                             f"{' or '.join(flag(t) for t in owners)}; allowed: add one of those flags")
    return tool


def keywords(tool: str, args) -> dict:
    """The tool's keyword arguments from the flags' text (types only; the tool checks the values)."""
    out = {}
    for dest, (_, _, owners, keyword) in OPTIONS.items():
        value = getattr(args, dest, None)
        if tool not in owners or value in (None, False):
            continue
        if dest in ("steps", "max_batch", "target_global_batch"):
            value = _whole(dest, value)
        elif dest in ("seconds", "budget", "start_lr", "end_lr"):
            value = _number(dest, value)
        elif dest == "memory_budget":
            value = memory_budget(value)
        elif dest == "workers":
            value = [_whole(dest, part, "worker counts, e.g. 0,1,2") for part in value.split(",")]
        elif dest == "items":
            value = [part.strip().replace("-", "_") for part in value.split(",")]
        out[keyword] = value
    return out


def _whole(dest: str, text: str, what: str = "a whole number") -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise UsageError(f"%%nbtrain: {flag(dest)} {text}: allowed: {what}") from None


def _number(dest: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"%%nbtrain: {flag(dest)} {text}: allowed: a number") from None


def memory_budget(text: str):
    """'0.3' -> a fraction of the free memory; '512MB', '2GiB' -> bytes."""
    size = _SIZE.match(text)
    if size:
        return int(float(size.group(1)) * _UNITS[size.group(2).lower()])
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise UsageError(f"%%nbtrain: --memory-budget {text}: allowed: a fraction of the free memory in (0, 1] "
                         "(e.g. 0.3) or a size such as 512MB or 2GB")
    return fraction


def tool_function(tool: str):
    # Imported when used: the tools import nothing of the notebook, and the magic loads fast.
    if tool == "profile":
        from ..tools.diagnose import diagnose
        return diagnose
    if tool in ("find_batch_size", "find_workers", "find_lr"):
        from ..tools import tune
        return getattr(tune, tool)
    if tool in ("find_leaks", "find_sync"):
        from ..tools.leaks import find_graph_leaks, find_sync_points
        return find_graph_leaks if tool == "find_leaks" else find_sync_points
    from ..tools.checklist import checklist
    return checklist


def _flagged(message: str) -> str:
    """A tool's own message about its keywords, with the flags' names: 'steps=2: ...' -> '--steps 2: ...'."""
    message = re.sub(r"^nbtrain\.\w+: ", "", message)
    for dest, (_, _, _, keyword) in OPTIONS.items():
        message = re.sub(rf"\b{keyword}=", f"{flag(dest)} ", message)
    # "--steps 2: a whole number >= 4" names the flag and the value; say which part is what is allowed.
    return re.sub(r"^(--[\w-]+ [^:]+): (?!allowed)", r"\1: allowed: ", message, count=1)


def run_tool(shell, tool: str, recipe, config: TrainConfig, kwargs: dict):
    """Run `tool` on the recipe's live model and return its result; failures as the magic reports them."""
    if config.world_size > 1:
        raise UsageError(f"%%nbtrain: {flag(tool)} with --devices {config.devices} --num-nodes {config.num_nodes}: "
                         "the tools measure in this kernel, one process; allowed: --devices 1 --num-nodes 1 "
                         "(the checklist walk tries 2 processes itself)")
    function = tool_function(tool)
    try:
        return function(recipe=recipe, config=config, **kwargs)
    except KeyboardInterrupt:
        print(f"nbtrain: {flag(tool)} interrupted; the model and its optimizer are restored as they were.")
        return None
    except ConfigError as error:
        raise errors.config_usage_error(error) from None
    except ValueError as error:
        if errors.is_nbtrain_frame(last_frame(error)):  # the tool refused an option's value
            raise UsageError(f"%%nbtrain: {_flagged(str(error))}") from None
        raise errors.training_failure(shell, error) from None
    except RuntimeError as error:
        if str(error).startswith("nbtrain."):  # the tool's own verdict (e.g. no batch fits the budget)
            raise UsageError(f"%%nbtrain: {flag(tool)}: {_flagged(str(error))}") from None
        raise errors.training_failure(shell, error) from None
    except Exception as error:
        raise errors.training_failure(shell, error) from None


def last_frame(error):
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def figure_png(result, tool: str, dpi: int = 120) -> bytes | None:
    """The tool's plot on its own Agg figure (never pyplot, so the inline backend does not show it twice)."""
    if getattr(result, "available", True) is False:  # e.g. the sync check off CUDA: nothing was measured
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=FIGSIZE[tool], layout="constrained")
    FigureCanvasAgg(figure)
    result.plot(ax=figure.subplots())
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


class ToolView:
    """A tool's table and plot, shown together: text in a terminal, table and image in a notebook."""

    def __init__(self, result, tool: str, notes=()):
        self.result, self.tool = result, tool
        self.notes = list(notes)
        self.png = figure_png(result, tool)

    def text(self) -> str:
        return "\n".join([self.result.table()] + self.notes)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        image = (f"<img src='data:image/png;base64,{base64.b64encode(self.png).decode()}'/>"
                 if self.png else "")
        return f"<div class='nbtrain-tool'><pre>{html.escape(self.text())}</pre>{image}</div>"


def show_result(magics, tool: str, result, args) -> None:
    """Keep the tool's result in `_nbtrain` (and --name) and show it; keep-best also sets the defaults."""
    namespace = magics.shell.user_ns
    notes = []
    if tool == "checklist" and result.kept_on_engine:
        changes = result.changes()
        magics.defaults.update(changes)
        notes.append("later %%nbtrain cells start from it: " +
                     (", ".join(f"{flag(k)} {v}" for k, v in changes.items()) or "no change") +
                     " (%nbtrain --reset forgets)")
    namespace["_nbtrain"] = result
    if args.name:
        namespace[args.name] = result
    notes.append(f"result in {args.name + ' and ' if args.name else ''}_nbtrain")
    display(ToolView(result, tool, notes))
