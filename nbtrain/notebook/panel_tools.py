"""The checklist tools as panel buttons: bottleneck breakdown, batch size, workers, the walk.

A tool runs in the panel's background thread (the same one Run uses, so Run, Stop and Close
treat it like a run) on the panel's live model, with the settings the controls show. The
tool measures and restores the model; its table and plot then appear under the buttons.
Like the rest of the panel, it only assigns widget values from that thread.

The buttons and the fields are generated from the tool registry: a button for each tool with a
panel label, a field for each option a tool declares with one (shared by the tools that declare
the same keyword). Field values are read by the tool's declaration before the thread starts, and
refusals name the field (`memory fraction 3.0: allowed: ...`).
"""
from __future__ import annotations

import html
import threading
import traceback

import ipywidgets as widgets

from .. import api
from ..config import TrainConfig
from ..tools import trial
from ..tools.registry import TOOLS
from ..tools.tool_options import NO_VALUE, Tool, ToolOptionError, ToolRefusal
from .tools import figure_png

PANEL_TOOLS = {name: tool for name, tool in TOOLS.items() if tool.label}
LABELS = {name: tool.label for name, tool in PANEL_TOOLS.items()}
# An option's kind picks its field; a kind without one here is a text field.
_FIELDS = {"number": widgets.FloatText, "memory": widgets.FloatText, "whole": widgets.IntText,
           "switch": widgets.Checkbox}


def panel_spelling(tool: Tool):
    """How the panel names `tool`'s options in its messages: by the field's label."""
    return tool.spelling(lambda option: option.panel)


def _field(tool: Tool, option):
    start = tool.defaults[option.keyword] if option.panel_value is NO_VALUE else option.panel_value
    return _FIELDS.get(option.kind, widgets.Text)(
        value=start, description=option.panel, tooltip=f"{option.help} ({option.keyword}): {option.allowed}",
        style={"description_width": "initial"}, layout=widgets.Layout(width="200px"))


class ToolButtons:
    stop_grace_s = 5.0  # how long Stop waits for the tool to stop before saying that it is still going

    def __init__(self, panel):
        self.panel = panel
        self.results: dict = {}           # tool -> its last result (Diagnosis, BatchSearch, ...)
        self.running_tool: str | None = None
        self.stop_requested = threading.Event()  # the running tool's (trial.stoppable)
        self._said = threading.Lock()  # Stop's "still going" never lands after the tool's own last word
        self.buttons = {}
        self.fields: dict = {}            # option keyword -> its field
        for name, tool in PANEL_TOOLS.items():
            # Each button as wide as its label: a row of more tools wraps instead of cutting labels off.
            button = widgets.Button(description=tool.label, layout=widgets.Layout(width="auto", flex="0 0 auto"))
            button.add_class(f"nbtrain-tool-{name.replace('_', '-')}")
            button.on_click(lambda _b, t=name: self.panel.run_tool(t))
            self.buttons[name] = button
            for option in tool.options:
                if option.panel and option.keyword not in self.fields:
                    self.fields[option.keyword] = _field(tool, option)
        self.text = widgets.HTML()
        self.text.add_class("nbtrain-tool-text")
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="760px"))
        self.image.add_class("nbtrain-tool-plot")
        self.widget = widgets.VBox([
            widgets.HBox([widgets.HTML("<b>checklist tools</b>&nbsp;")] + list(self.buttons.values()),
                         layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox(list(self.fields.values())), self.text, self.image])
        self.widget.add_class("nbtrain-tools")

    def set_running(self, running: bool) -> None:
        for button in self.buttons.values():
            button.disabled = running

    def keywords(self, tool: str) -> dict:
        """The values of the fields `tool` declares, as the fields hold them (the tool's declaration reads them)."""
        return {o.keyword: self.fields[o.keyword].value for o in TOOLS[tool].options if o.panel}

    def run(self, tool: str) -> None:
        """Start `tool` in the panel's background thread, on its live engine, with the controls' settings."""
        panel = self.panel
        config = panel.controls.config_over(panel.base)  # a ConfigError lands in the status line
        try:
            kwargs = TOOLS[tool].read(self.keywords(tool))
        except ToolOptionError as error:  # refused before anything runs, in the fields' words
            panel.say(f"{LABELS[tool]}: {error.text(panel_spelling(TOOLS[tool]))}", error=True)
            return
        note = ""
        if config.world_size > 1:  # the tools measure in this kernel; the walk tries 2 processes itself
            config, note = config.replace(devices=1, num_nodes=1), " (in this kernel: 1 process)"
        panel.engine = api.engine_for(panel.recipe, config)  # the engine the tool's trials run on
        self.running_tool = tool
        self.stop_requested = threading.Event()
        panel.thread = threading.Thread(target=self._work, args=(tool, config, kwargs),
                                         name=f"nbtrain-panel-{tool}", daemon=True)
        panel.set_running(True)
        panel.say(f"{LABELS[tool]}: measuring on the live model{note}…")
        panel.thread.start()

    def stop(self) -> None:
        """Ask the tool to stop, and say so if it has not after `stop_grace_s`.

        The tool's trial ends at its next step boundary and the tool at its next block edge (trial.stoppable);
        it then restores the model. Nothing is raised into its thread from outside: a tool that takes longer
        (a long step, DDP workers starting) is reported in the status line and stops when it reaches the edge.
        """
        thread, tool = self.panel.thread, self.running_tool
        self.stop_requested.set()
        thread.join(self.stop_grace_s)
        with self._said:
            if thread.is_alive() and self.running_tool == tool:
                self.panel.say(f"{LABELS[tool]} has not stopped after {self.stop_grace_s:g} s: it is inside a step or "
                               "starting workers, and stops at the end of it (the model is then restored)", error=True)

    def _work(self, tool: str, config: TrainConfig, kwargs: dict) -> None:
        panel, label = self.panel, LABELS[tool]
        message, error = "", False
        try:
            with trial.stoppable(self.stop_requested):
                result = TOOLS[tool].function(recipe=panel.recipe, config=config, **kwargs)
            self.results[tool] = result
            self.text.value = f"<pre style='font-size:11px'>{html.escape(result.table())}</pre>"
            self.image.value = figure_png(result, tool) or b""
            message = f"{label} done: {_headline(tool, result)}"
        except KeyboardInterrupt:
            message = f"{label} stopped; the model and its optimizer are restored as they were"
        except (ToolOptionError, ToolRefusal) as exc:  # a value only the recipe could judge, or the tool's verdict
            message, error = f"{label}: {exc.text(panel_spelling(TOOLS[tool]))}", True
        except BaseException as exc:  # shown in the status line, never lost in the thread
            panel.errors.append(traceback.format_exc())
            message, error = f"{label} failed: {type(exc).__name__}: {exc}", True
        finally:
            with self._said:
                self.running_tool = None
                try:
                    panel.set_running(False)
                except Exception as exc:
                    panel.errors.append(traceback.format_exc())
                    message, error = f"{message}; updating the panel failed: {exc!r}", True
                panel.say(message, error=error)


def _headline(tool: str, result) -> str:
    if tool in ("profile", "ceilings", "forecast"):
        return result.verdict
    if tool == "find_batch_size":
        return f"{result.summary()}; {result.speed_text()}"
    if tool == "find_workers":
        return f"fastest: {result.label(result.best)}; {result.verdict()}"
    return f"{result.headline()}; best config: {result.changes() or 'the starting one'}"
