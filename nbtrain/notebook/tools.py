"""The checklist tools as `%%nbtrain` options: one tool per cell, on the cell's own recipe, shown inline.

    %%nbtrain --profile --trace step.json        bottleneck breakdown: stacked bar and verdict
    %%nbtrain --find-batch-size --memory-budget 0.3
    %%nbtrain --find-workers --seconds 1         %%nbtrain --find-lr         %%nbtrain --find-leaks
    %%nbtrain --find-sync                        (CUDA only: says so elsewhere)
    %nbtrain_checklist --budget 60 --keep-best   the automated walk: table and waterfall
    %%nbtrain --panel                            the control panel for this recipe instead of a run

The magic reads the flags and the recipe exactly as for a training run. Every tool flag and its
help are generated from the tool registry (nbtrain/tools/registry.py): a tool's name is its flag,
and each option it declares with a flag becomes one, shared by the tools that declare it. Values
are read by the tool's own declaration before the cell body runs; a refused value, and a tool's
refusal, are shown as one line with the options spelled as flags (`--steps 2: allowed: ...`).
"""
from __future__ import annotations

import base64
import html
import io

from IPython.core.error import UsageError
from IPython.display import display

from ..config import TrainConfig
from ..options import ConfigError, flag_name
from ..tools.registry import TOOLS
from ..tools.tool_options import Tool, ToolOptionError, ToolRefusal
from . import errors

PANEL_HELP = "show the control panel for this cell's recipe instead of training"


def magic_tools() -> dict[str, Tool]:
    return {name: tool for name, tool in TOOLS.items() if tool.magic}


def tool_flags() -> dict:
    """Each tool option's flag -> [(tool, its option)] for the tools that declare it, in declaration order."""
    flags: dict = {}
    for tool in magic_tools().values():
        for option in tool.options:
            if option.flag:
                flags.setdefault(option.flag, []).append((tool, option))
    return flags


def switches() -> tuple:
    """The flags that make a cell do something instead of training: a tool, or the panel."""
    return tuple(magic_tools()) + ("panel",)


DESTS = switches() + tuple(tool_flags())


def flag_spelling(tool: Tool):
    """How the magic names `tool`'s options in its messages: as flags, with the value as typed."""
    return tool.spelling(lambda option: option.flag and flag_name(option.flag))


def _flag_help(owners) -> str:
    """Each owning tool's help and default; tools that say the same (one shared option) are named together."""
    said: dict = {}
    for tool, option in owners:
        default = tool.defaults[option.keyword]
        shown = f" (default {default})" if isinstance(default, (int, float, str)) and option.kind != "switch" else ""
        said.setdefault(option.help + shown, []).append(flag_name(tool.name))
    return "; ".join(f"{', '.join(tools)}: {text}" for text, tools in said.items()).replace("%", "%%")


def add_tool_flags(parser) -> None:
    group = parser.add_argument_group("checklist tools (one per cell; they measure the live model, then restore "
                                      "it; as a line magic, on the recipe already in the namespace)")
    for name, tool in magic_tools().items():
        group.add_argument(flag_name(name), dest=name, action="store_true", help=tool.help.replace("%", "%%"))
    group.add_argument(flag_name("panel"), dest="panel", action="store_true", help=PANEL_HELP)
    group = parser.add_argument_group("tool options")
    for dest, owners in tool_flags().items():
        first = owners[0][1]
        if first.kind == "switch":
            group.add_argument(flag_name(dest), dest=dest, action="store_true", help=_flag_help(owners))
        else:
            group.add_argument(flag_name(dest), dest=dest, metavar=first.metavar, default=None, help=_flag_help(owners))


def chosen_tool(args) -> str | None:
    """The one tool the flags ask for (None: train); its options are read by keywords().

    Raises UsageError for two tools at once, or a tool option without its tool.
    """
    tools = [t for t in switches() if getattr(args, t, False)]
    if len(tools) > 1:
        raise UsageError(f"%%nbtrain: {' and '.join(flag_name(t) for t in tools)}: one tool per cell; allowed: one of "
                         f"{', '.join(flag_name(t) for t in switches())}")
    tool = tools[0] if tools else None
    for dest, owners in tool_flags().items():
        value = getattr(args, dest, None)
        if value not in (None, False) and tool not in [t.name for t, _ in owners]:
            shown = "" if value is True else f" {value}"
            raise UsageError(f"%%nbtrain: {flag_name(dest)}{shown} applies to "
                             f"{' or '.join(flag_name(t.name) for t, _ in owners)}; allowed: add one of those flags")
    return tool


def keywords(tool: str, args) -> dict:
    """The tool's keyword arguments from the flags given, read by the tool's declaration (before the cell runs)."""
    entry = TOOLS[tool]
    given = {option.keyword: getattr(args, option.flag) for option in entry.options
             if option.flag and getattr(args, option.flag, None) not in (None, False)}
    try:
        return entry.read(given)
    except ToolOptionError as error:
        raise UsageError(f"%%nbtrain: {error.text(flag_spelling(entry))}") from None


def run_tool(shell, tool: str, recipe, config: TrainConfig, kwargs: dict, taken: dict | None = None, cell=None):
    """Run `tool` on the recipe's live model and return its result; failures as the magic reports them
    (`taken`: the recipe parts from earlier cells, said beside an error raised in one, as for a run; `cell`:
    the cell's lines that set the parts, shown first where an error has no frame of the cell, as for a run)."""
    if config.world_size > 1:
        raise UsageError(f"%%nbtrain: {flag_name(tool)} with --devices {config.devices} --num-nodes {config.num_nodes}: "
                         "the tools measure in this kernel, one process; allowed: --devices 1 --num-nodes 1 "
                         "(the checklist walk tries 2 processes itself)")
    entry = TOOLS[tool]
    try:
        return entry.function(recipe=recipe, config=config, **kwargs)
    except KeyboardInterrupt:
        print(f"nbtrain: {flag_name(tool)} interrupted; the model and its optimizer are restored as they were.")
        return None
    except ToolOptionError as error:  # a value only the recipe could judge (before ConfigError: it is one)
        raise UsageError(f"%%nbtrain: {error.text(flag_spelling(entry))}") from None
    except ToolRefusal as error:  # the tool's own verdict (e.g. no batch fits the budget)
        raise UsageError(f"%%nbtrain: {flag_name(tool)}: {error.text(flag_spelling(entry))}") from None
    except ConfigError as error:
        raise errors.config_usage_error(error) from None
    except Exception as error:
        raise errors.training_failure(shell, error, taken, cell) from None


def figure_png(result, tool: str, dpi: int = 120) -> bytes | None:
    """The tool's plot on its own Agg figure (never pyplot, so the inline backend does not show it twice)."""
    if getattr(result, "available", True) is False:  # e.g. the sync check off CUDA: nothing was measured
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=TOOLS[tool].figsize, layout="constrained")
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
                     (", ".join(f"{flag_name(k)} {v}" for k, v in changes.items()) or "no change") +
                     " (%nbtrain --reset forgets)")
    namespace["_nbtrain"] = result
    if args.name:
        namespace[args.name] = result
    notes.append(f"result in {args.name + ' and ' if args.name else ''}_nbtrain")
    display(ToolView(result, tool, notes))
