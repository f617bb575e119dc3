"""The panel's controls: widgets that turn into config changes, and nothing more.

The controls never judge a value. They hand raw widget values (a batch size typed as
text stays text) to `TrainConfig.replace`, which reads and validates them; which
device and precision choices are available is asked of config.py the same way, so the
reason shown on a disabled choice is config.py's own message. Each control is named by
its option's word (`devices`, as in Lightning), and its tooltip says what it does and
the checklist's rule behind it (panel_help.py).
"""
from __future__ import annotations

import os

import ipywidgets as widgets

from .. import hardware
from ..config import (ACCELERATORS, COMPILE_MODES, LR_RULES, MATMUL_PRECISIONS, OPTIMIZER_IMPLS, PRECISIONS,
                      TrainConfig, check_runnable)
from ..options import ConfigError
from .panel_help import choice_tooltip, option_tooltip

CSS_CLASSES = {"accumulate_grad_batches": "nbtrain-accumulate", "num_workers": "nbtrain-workers",
               "base_batch_size": "nbtrain-base-batch", "matmul_precision": "nbtrain-matmul"}
BATCH_CHOICES = [str(2**i) for i in range(13)]  # 1 .. 4096; any other whole number may be typed
DEVICE_CHOICES = tuple(a for a in ACCELERATORS if a != "auto")


def choice_problem(option: str, value: str, **context) -> str | None:
    """Why config.py refuses `option=value` (with `context`), or None when it accepts it."""
    try:
        check_runnable(TrainConfig(**{**context, option: value}))  # the panel's runs are on this machine
    except ConfigError as err:
        own = [p for p in err.problems if p.option == option]
        return "; ".join(p.allowed for p in own) or None
    return None


class ChoiceRow:
    """One-of-N toggle buttons where each choice can be disabled with a visible reason.

    (A Dropdown or ToggleButtons cannot disable single options.)
    """

    def __init__(self, name: str, option: str, choices, value: str, on_change):
        self.name, self.option = name, option
        self.value = value
        self._on_change = on_change
        self._updating = False
        self.buttons = {}
        for choice in choices:
            button = widgets.ToggleButton(description=choice, value=choice == value,
                                          tooltip=choice_tooltip(option, choice), layout=widgets.Layout(width="auto"))
            button.add_class(f"nbtrain-{name}-{choice}")
            button.observe(lambda change, c=choice: self._toggled(c, change["new"]), "value")
            self.buttons[choice] = button
        # The reasons wrap beside the buttons, or under them in a narrow column.
        self.reasons = widgets.HTML(layout=widgets.Layout(flex="1 1 180px", min_width="0"))
        self.reasons.add_class(f"nbtrain-{name}-reasons")
        self.widget = widgets.HBox(list(self.buttons.values()) + [self.reasons],
                                   layout=widgets.Layout(flex_flow="row wrap", flex="1 1 auto", min_width="0"))
        self.widget.add_class(f"nbtrain-{name}")

    def select(self, choice: str) -> None:
        self.buttons[choice].value = True

    def _toggled(self, choice: str, pressed: bool) -> None:
        if self._updating:
            return
        self._updating = True
        try:
            if pressed:
                self.value = choice
            for other, button in self.buttons.items():
                button.value = other == self.value  # one stays pressed; unpressing it is undone
        finally:
            self._updating = False
        if pressed:
            self._on_change()

    def set_unavailable(self, reasons: dict[str, str | None]) -> None:
        notes = []
        for choice, reason in reasons.items():
            button = self.buttons[choice]
            button.disabled = reason is not None and choice != self.value
            button.tooltip = choice_tooltip(self.option, choice, reason)
            if reason:
                notes.append(f"<b>{choice}</b>: {_escape(reason)}")
        self.reasons.value = (f"<div style='font-size:11px;line-height:1.35;white-space:normal'>"
                              f"{'<br>'.join(notes)}</div>" if notes else "")


class Controls:
    """Every control of the panel; `changes()` is what they ask of the config."""

    def __init__(self, config: TrainConfig, on_change):
        self._on_change = on_change
        inv = hardware.inventory()
        self.device = ChoiceRow("device", "accelerator", DEVICE_CHOICES, config.device_type, on_change)
        self.precision = ChoiceRow("precision", "precision", PRECISIONS, config.precision, on_change)
        self.batch_size = widgets.Combobox(value=str(config.batch_size), options=BATCH_CHOICES,
                                           ensure_option=False, continuous_update=False,
                                           description="batch size", placeholder="a power of two or any number")
        self.accumulate = widgets.IntSlider(value=config.accumulate_grad_batches, min=1,
                                            max=max(32, config.accumulate_grad_batches),
                                            description="accumulate", continuous_update=False)
        self.workers = widgets.IntSlider(value=config.num_workers, min=0,
                                         max=max(8, os.cpu_count() or 1, config.num_workers),
                                         description="workers", continuous_update=False)
        self.threads = widgets.Text(value="" if config.num_threads is None else str(config.num_threads),
                                    description="threads", placeholder="torch's", continuous_update=False)
        self.devices = widgets.IntSlider(value=config.devices, min=1,
                                         max=max(inv.cuda_devices, inv.cpu_cores, config.devices, 2),
                                         description="devices", continuous_update=False)
        self.scale_lr = widgets.Dropdown(options=LR_RULES, value=config.scale_lr, description="LR rule")
        # The rate was tuned for the global batch the user started with, unless they said otherwise.
        self.base_batch = widgets.Text(value=str(config.base_batch_size or config.global_batch_size),
                                       description="tuned for", continuous_update=False)
        self.lr = widgets.Text(value="" if config.lr is None else repr(config.lr), description="base LR",
                               placeholder="optimizer's own", continuous_update=False)
        self.max_epochs = widgets.Text(value="" if config.max_epochs is None else str(config.max_epochs),
                                       description="epochs", placeholder="none", continuous_update=False)
        self.max_steps = widgets.Text(value="" if config.max_steps is None else str(config.max_steps),
                                      description="steps", placeholder="none", continuous_update=False)
        # The further checklist toggles, folded away: each applies live like the rest.
        self.compile = widgets.Dropdown(options=COMPILE_MODES, value=config.compile, description="compile")
        # Toggle buttons, not checkboxes: ipywidgets 8 shows a described checkbox's tooltip nowhere.
        self.channels_last = widgets.ToggleButton(value=config.channels_last, description="channels_last")
        self.optimizer_impl = widgets.Dropdown(options=OPTIMIZER_IMPLS, value=config.optimizer_impl,
                                               description="optimizer")
        self.matmul = widgets.Dropdown(options=[("torch's", "none")] + [(m, m) for m in MATMUL_PRECISIONS],
                                       value=config.matmul_precision or "none", description="matmul")
        # DDP's way out when some parameters take no part in the loss (its error names this option).
        self.find_unused = widgets.ToggleButton(value=config.find_unused_parameters,
                                                description="find_unused_parameters")
        # config option -> its widget; the CSS class (nbtrain-...) is what the browser test selects.
        self.fields = {"batch_size": self.batch_size, "accumulate_grad_batches": self.accumulate,
                       "num_workers": self.workers, "num_threads": self.threads, "devices": self.devices, "scale_lr": self.scale_lr,
                       "base_batch_size": self.base_batch, "lr": self.lr, "max_epochs": self.max_epochs,
                       "max_steps": self.max_steps, "compile": self.compile, "channels_last": self.channels_last,
                       "optimizer_impl": self.optimizer_impl, "matmul_precision": self.matmul,
                       "find_unused_parameters": self.find_unused}
        cells = {}
        for option, widget in self.fields.items():
            widget.add_class(CSS_CLASSES.get(option, "nbtrain-" + option.replace("_", "-")))
            widget.tooltip = option_tooltip(option)
            widget.observe(lambda _change: self._on_change(), "value")
            if isinstance(widget, widgets.ToggleButton):  # its own text is its label
                widget.layout = widgets.Layout(width="auto", min_width="0")
                cells[option] = widget
            else:
                cells[option] = _described(widget)
        self.widget = widgets.VBox([
            _labelled("device", "accelerator", self.device.widget),
            _labelled("precision", "precision", self.precision.widget),
            _grid([cells[o] for o in ("batch_size", "accumulate_grad_batches", "devices", "num_workers", "num_threads",
                                      "max_epochs", "max_steps", "scale_lr", "base_batch_size", "lr")]),
            _folded("more speed toggles", widgets.VBox([
                widgets.HTML("<small>Each applies live, like the settings above; the tooltips say when it pays "
                             "off.</small>"),
                _grid([cells[o] for o in ("compile", "optimizer_impl", "matmul_precision", "channels_last",
                                          "find_unused_parameters")])])),
        ])
        self.refresh_choices()

    def changes(self) -> dict:
        """The config options as the widgets state them, unread and unchecked."""
        return {"accelerator": self.device.value, "precision": self.precision.value,
                **{option: widget.value for option, widget in self.fields.items()}}

    def config_over(self, base: TrainConfig) -> TrainConfig:
        """`base` with the widgets' settings, read and checked by the config. Only those that differ from
        base's count as given (TrainConfig.given): every option has a control, but the settings as code state
        what was changed here, and what base was given, not every control's value."""
        values = base.replace(**self.changes())
        return base.replace(**{name: getattr(values, name) for name in self.changes()
                               if getattr(values, name) != getattr(base, name)})

    def refresh_choices(self) -> None:
        """Disable the device and precision choices config.py refuses here, with its reason."""
        self.device.set_unavailable({d: choice_problem("accelerator", d) for d in DEVICE_CHOICES})
        self.precision.set_unavailable({p: choice_problem("precision", p, accelerator=self.device.value)
                                        for p in PRECISIONS})

    def lock(self, options, reason: str) -> None:
        """Turn off the controls of `options` for good, the reason in their tooltips (e.g. a DataLoader
        whose own batch_sampler decides the batches)."""
        self._locked = set(options)
        for option in options:
            widget = self.fields.get(option)
            if widget is not None:
                widget.disabled = True
                widget.tooltip = f"off: {reason}"

    _locked: set = frozenset()

    def set_running(self, running: bool) -> None:
        # Devices cannot change inside a running process: that control waits for the next run.
        self.devices.disabled = running or "devices" in self._locked


def _labelled(text: str, option: str, widget) -> widgets.HBox:
    label = widgets.Label(text, tooltip=option_tooltip(option), layout=widgets.Layout(width="80px", flex="0 0 80px"))
    return widgets.HBox([label, widget])


def _described(widget) -> widgets.HBox:
    """The widget behind a label of its own that carries the tooltip too: ipywidgets 8 shows a text
    field's or dropdown's tooltip only when it has no description of its own."""
    label = widgets.Label(widget.description, tooltip=widget.tooltip,
                          layout=widgets.Layout(width="76px", flex="0 0 76px"))
    widget.description = ""
    widget.layout = widgets.Layout(width="auto", flex="1 1 auto", min_width="0")  # the cell's width, never wider
    return widgets.HBox([label, widget], layout=widgets.Layout(min_width="0"))


def _grid(children) -> widgets.GridBox:
    """Controls in as many columns as fit: three in a wide panel, one in a narrow one, none cut off."""
    return widgets.GridBox(children, layout=widgets.Layout(
        grid_template_columns="repeat(auto-fill, minmax(230px, 1fr))", grid_gap="0 12px"))


def _folded(title: str, widget) -> widgets.Accordion:
    # (No tooltip on the Accordion itself: ipywidgets 8.1's AccordionView fails to render with one.)
    folded = widgets.Accordion(children=[widget], titles=(title,), selected_index=None)
    folded.add_class("nbtrain-more")
    return folded


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
