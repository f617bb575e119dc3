"""`nbtrain.panel(...)`: an ipywidgets control panel over one live model.

The panel is a thin view. Its controls state config options; config.py reads and
validates them (an invalid combination shows the ConfigError text in the status
line); Run trains in a background thread (the engine in this kernel for one process,
`nbtrain.fit` and its DDP launcher for more); "Apply now" hands the changes to
`Engine.request`, which applies them at the next optimizer step on the same model
and optimizer. Every callback reports its failure in the status line instead of
losing it.

Its parts: panel_controls (the settings, with their tooltips from panel_help),
panel_layout (where each part sits), panel_progress (the bar, elapsed and remaining
time), panel_training (the run's background thread), panel_views (runs table, compare
view, "copy as code") and panel_tools (the checklist tools).

    p = nbtrain.panel(recipe)                  # or a namespace: nbtrain.panel(globals())
    p = nbtrain.panel(recipe, display=False)   # build without showing (tests, layouts)
"""
from __future__ import annotations

import functools
import threading
import traceback
import weakref
from typing import Any, Mapping

try:
    import ipywidgets  # noqa: F401 - the first import of it: fails here, with the install command
except ImportError as exc:  # pragma: no cover - ipywidgets is a dependency, but say how to get it
    raise ImportError("nbtrain.panel needs ipywidgets: pip install ipywidgets") from exc

from .. import api
from ..config import TrainConfig, check_runnable
from ..options import ConfigError
from ..adapters import recipe_from_namespace
from ..recipe import Recipe
from ..user_loader import FIXED_OPTIONS, fixed_reason
from ..session import Session, namespace_lr
from .panel_controls import Controls
from .panel_help import BUTTONS
from .panel_layout import button, descendants, html_line, layout, status_html
from .panel_progress import RunProgress
from . import panel_training as training
from .panel_training import describe
from .panel_runs import RunRecord
from .panel_tools import LABELS as TOOL_LABELS, ToolButtons
from .panel_views import CodeView, CompareView, RunsView, readout_html
from .views import LivePlot

# One panel per live model: a new panel for the same model closes the old one (and stops its run).
_panels: "weakref.WeakKeyDictionary[Any, weakref.ref]" = weakref.WeakKeyDictionary()


def _reported(method):
    """Run a callback; show any failure in the status line (ConfigError as its own text)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ConfigError as err:
            self.say(err.render(), error=True)
        except Exception as exc:
            self.errors.append(traceback.format_exc())
            self.say(f"{type(exc).__name__}: {exc}", error=True)
    return wrapper


class Panel:
    def __init__(self, recipe: Recipe, config: TrainConfig | None = None, store=None):
        self.recipe = recipe
        self.session = Session(store)  # runs train, are recorded and named as the magic's are
        self.base = recipe.adopt_settings(config or TrainConfig())  # a given DataLoader's settings start it
        # The kernel's engine is always one process; more processes are separate runs.
        self.engine = api.engine_for(recipe, self.base.replace(devices=1, num_nodes=1))
        self.runs: list[RunRecord] = []
        self.errors: list[str] = []      # tracebacks behind every failure the status line showed
        self.status_text = ""
        self.config: TrainConfig | None = self.base
        self.thread: threading.Thread | None = None
        self._current: RunRecord | None = None
        self._closed = False
        self._displayed = False

        self.controls = Controls(self.base, self._controls_changed)
        if recipe.fixed_loader is not None:  # the user's DataLoader decides its batches: say so, once
            self.controls.lock(FIXED_OPTIONS + ("devices",), fixed_reason(recipe.fixed_loader))
        self.readout = html_line("nbtrain-readout")
        self.progress = RunProgress()
        self.status = html_line("nbtrain-status")
        self.run_button = button("Run", "nbtrain-run", "success", self._on_run, BUTTONS["run"])
        self.stop_button = button("Stop", "nbtrain-stop", "danger", self._on_stop, BUTTONS["stop"], disabled=True)
        self.apply_button = button("Apply now", "nbtrain-apply", "warning", self._on_apply, BUTTONS["apply"])
        self.close_button = button("Close", "nbtrain-close", "", self._on_close, BUTTONS["close"])
        # Drawn at twice the pixels it is shown at, so it stays sharp on HiDPI screens.
        self.plot = LivePlot(interval_s=0.7, widget=True, figsize=(7.6, 2.6), dpi=144)
        self.table = RunsView()
        self.compare = CompareView()
        self.code = CodeView()
        self.tools = ToolButtons(self)
        self.compare.select.observe(lambda _change: self._draw_compare(), "value")
        self.widget = layout(self)
        self.table.show(self.runs)
        self._controls_changed()

    # --- state --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def say(self, text: str, error: bool = False) -> None:
        """Set the status line (safe from any thread)."""
        self.status_text = text
        self.status.value = status_html(text, error)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the current run ends; True when it has."""
        thread = self.thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    # --- controls -----------------------------------------------------------------------

    @_reported
    def _controls_changed(self) -> None:
        self.controls.refresh_choices()
        self.config = None
        self.readout.value = ""
        self.code.show(None)
        self.config = check_runnable_here(self.controls.config_over(self.base))
        c = self.config
        self.code.show(c)
        self.readout.value = readout_html(c, self.engine.lr_note(c))
        if self.running:
            self.say("changed: press Apply now to use this from the next optimizer step")
        else:
            self.say("ready: press Run to train with these settings")

    # --- buttons ------------------------------------------------------------------------

    @_reported
    def _on_run(self, _button=None) -> None:
        if self.running:
            self.say(f"{self._busy()} is still going: Stop it" + ("" if self.tools.running_tool else
                                                               ", or Apply now to change it"))
            return
        # As nbtrain.fit does, once per call: the recipe's DataLoader settings given to the config and this machine
        # checked here (errors: the status line), so engine_for does neither again (settled).
        config = check_runnable_here(self.recipe.adopt_settings(self.controls.config_over(self.base)))
        record = RunRecord(len(self.runs) + 1, config)
        if config.world_size == 1:
            self.engine = api.engine_for(self.recipe, config, settled=True)
        record.log.subscribe(functools.partial(training.on_event, self, record))
        self.runs.append(record)
        self._current = record
        self.table.show(self.runs)
        self.plot.follow(record.log, record.label())
        self.progress.start(record.number, None)  # the run's start event then says how many steps it plans
        self.set_running(True)
        self.say(f"run #{record.number} starting: {record.settings_text()}")
        self.thread = threading.Thread(target=training.train, args=(self, record), name="nbtrain-panel-run",
                                        daemon=True)
        self.thread.start()

    @_reported
    def _on_stop(self, _button=None) -> None:
        if not self.running:
            self.say("no run in progress")
            return
        if self.tools.running_tool:
            self.say(f"stopping {TOOL_LABELS[self.tools.running_tool]}; the model is restored…")
            self._request_stop()
            return
        record = self._current
        how = "on every device at its next log window…" if record.config.world_size > 1 else \
            "at the next optimizer step…"
        self.say(f"stopping run #{record.number} {how}")  # before stopping: the run's last word comes after
        self._request_stop()

    @_reported
    def _on_apply(self, _button=None) -> None:
        config = self.controls.config_over(self.base)
        if self.tools.running_tool:
            self.say(f"{self._busy()} is measuring: changes apply after it (press Run)")
            return
        if not self.running:
            if config.world_size > 1:
                self.say(f"{config.world_size} devices: their worker processes start with the next Run")
                return
            self.engine.reconfigure(config)
            self.say("applied to the live model; the next Run continues with it")
            return
        if self._current.config.world_size > 1:
            self.say("a multi-process run cannot change while it runs: Stop it and Run again with the new settings")
            return
        changes = {name: new for name, (_, new) in config.changed_from(self.engine.config).items()}
        if not changes:
            self.say("nothing to apply: the run already uses these settings")
            return
        # Said first: the training thread may apply the change and report it before request() returns.
        self.say(f"requested {describe({k: (getattr(self.engine.config, k), v) for k, v in changes.items()})}; "
                 "it applies at the next optimizer step")
        self.engine.request(**changes)  # validated now, applied at the next optimizer step

    @_reported
    def _on_close(self, _button=None) -> None:
        self.close()

    def close(self, timeout: float = 60.0) -> None:
        """Stop this panel's run (at a step boundary), then remove the panel's widgets."""
        if self._closed:
            return
        self._closed = True
        if self.running:
            self._request_stop()
            self.wait(timeout)
        self.plot.finish()
        if _panels.get(self.recipe.model, lambda: None)() is self:
            del _panels[self.recipe.model]
        for widget in descendants(self.widget):
            widget.close()

    def _request_stop(self) -> None:
        if self.tools.running_tool:
            threading.Thread(target=self.tools.stop, name="nbtrain-panel-stop", daemon=True).start()
            return
        self._current.stop.set()  # at the next step boundary; with several devices every rank at the same one

    def set_running(self, running: bool) -> None:
        self.run_button.disabled = running
        self.stop_button.disabled = not running
        self.controls.set_running(running)
        self.tools.set_running(running)

    def _busy(self) -> str:
        tool = self.tools.running_tool
        return TOOL_LABELS[tool] if tool else f"run #{self._current.number}"

    @_reported
    def run_tool(self, tool: str) -> None:
        """A checklist tool on the live model, in the background thread, with the controls' settings."""
        if self.running:
            self.say(f"{self._busy()} is still going: Stop it first")
            return
        self.tools.run(tool)

    @_reported
    def _draw_compare(self) -> None:
        self.compare.draw()

    # --- showing ------------------------------------------------------------------------

    def show(self) -> "Panel":
        from IPython.display import display
        display(self.widget)
        self._displayed = True
        return self

    def _ipython_display_(self):
        # `nbtrain.panel(...)` as a cell's last line has shown itself already.
        if not self._displayed:
            self.show()

    def __repr__(self) -> str:
        return f"<nbtrain panel: {len(self.runs)} run(s), {'running' if self.running else 'idle'}>"


def panel(recipe_or_namespace: Recipe | Mapping | None = None, config: TrainConfig | None = None,
          display: bool = True, store=None) -> Panel:
    """A control panel over the live model of `recipe_or_namespace` (default: the notebook's names)."""
    recipe, namespace = _as_recipe(recipe_or_namespace)
    if namespace is not None:  # the notebook's `lr`, as %%nbtrain reads it, unless a config is given
        config = namespace_lr(namespace, config or TrainConfig(), given=config is not None)
    previous = _panels.get(recipe.model)
    if previous is not None and previous() is not None:
        previous().close()
    made = Panel(recipe, config, store)
    _panels[recipe.model] = weakref.ref(made)
    return made.show() if display else made


def _as_recipe(source) -> tuple[Recipe, Mapping | None]:
    """The recipe, and the namespace it was read from (None for a Recipe given as it is)."""
    if isinstance(source, Recipe):
        return source, None
    if source is None:
        from IPython import get_ipython
        shell = get_ipython()
        if shell is None:
            raise TypeError("nbtrain.panel(): outside a notebook, pass a Recipe or a namespace such as globals()")
        source = shell.user_ns
    if isinstance(source, Mapping):
        return recipe_from_namespace(source), source
    raise TypeError(f"nbtrain.panel(): got {type(source).__name__}; allowed: a nbtrain.Recipe, "
                    "a namespace dict (e.g. globals()) or nothing (the notebook's names)")


def check_runnable_here(config: TrainConfig) -> TrainConfig:
    """`config`, when this machine (where the panel's runs go) can run it; else its ConfigError."""
    check_runnable(config)
    return config
