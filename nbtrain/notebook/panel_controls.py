"""The panel's controls: widgets that turn into config changes, and nothing more.

The controls never judge a value. They hand raw widget values (a batch size typed as
text stays text) to `TrainConfig.replace`, which reads and validates them; which
device and precision choices are available is asked of config.py the same way, so the
reason shown on a disabled choice is config.py's own message.
"""
from __future__ import annotations

import os

import ipywidgets as widgets

from .. import hardware
from ..config import (ACCELERATORS, COMPILE_MODES, LR_RULES, MATMUL_PRECISIONS, OPTIMIZER_IMPLS, PRECISIONS,
                      ConfigError, TrainConfig)

BATCH_CHOICES = [str(2**i) for i in range(13)]  # 1 .. 4096; any other whole number may be typed
DEVICE_CHOICES = tuple(a for a in ACCELERATORS if a != "auto")


def choice_problem(option: str, value: str, **context) -> str | None:
    """Why config.py refuses `option=value` (with `context`), or None when it accepts it."""
    try:
        TrainConfig(**{**context, option: value})
    except ConfigError as err:
        own = [p for p in err.problems if p.option == option]
        return "; ".join(p.allowed for p in own) or None
    return None


class ChoiceRow:
    """One-of-N toggle buttons where each choice can be disabled with a visible reason.

    (A Dropdown or ToggleButtons cannot disable single options.)
    """

    def __init__(self, name: str, choices, value: str, on_change):
        self.name = name
        self.value = value
        self._on_change = on_change
        self._updating = False
        self.buttons = {}
        for choice in choices:
            button = widgets.ToggleButton(description=choice, value=choice == value,
                                          layout=widgets.Layout(width="auto"))
            button.add_class(f"nbtrain-{name}-{choice}")
            button.observe(lambda change, c=choice: self._toggled(c, change["new"]), "value")
            self.buttons[choice] = button
        self.reasons = widgets.HTML()
        self.reasons.add_class(f"nbtrain-{name}-reasons")
        self.widget = widgets.HBox(list(self.buttons.values()) + [self.reasons])
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
            button.tooltip = reason or ""
            if reason:
                notes.append(f"<b>{choice}</b>: {_escape(reason)}")
        self.reasons.value = f"<small>{'<br>'.join(notes)}</small>" if notes else ""


class Controls:
    """Every control of the panel; `changes()` is what they ask of the config."""

    def __init__(self, config: TrainConfig, on_change):
        self._on_change = on_change
        inv = hardware.inventory()
        self.device = ChoiceRow("device", DEVICE_CHOICES, config.device_type, on_change)
        self.precision = ChoiceRow("precision", PRECISIONS, config.precision, on_change)
        self.batch_size = widgets.Combobox(value=str(config.batch_size), options=BATCH_CHOICES,
                                           ensure_option=False, continuous_update=False,
                                           description="batch size", placeholder="a power of two or any number")
        self.accumulate = widgets.IntSlider(value=config.accumulate_grad_batches, min=1,
                                            max=max(32, config.accumulate_grad_batches),
                                            description="accumulate", continuous_update=False)
        self.workers = widgets.IntSlider(value=config.num_workers, min=0,
                                         max=max(8, os.cpu_count() or 1, config.num_workers),
                                         description="workers", continuous_update=False)
        self.processes = widgets.IntSlider(value=config.devices, min=1,
                                           max=max(inv.cuda_devices, inv.cpu_cores, config.devices, 2),
                                           description="processes", continuous_update=False)
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
        self.channels_last = widgets.Checkbox(value=config.channels_last, description="channels_last",
                                              indent=False)
        self.optimizer_impl = widgets.Dropdown(options=OPTIMIZER_IMPLS, value=config.optimizer_impl,
                                               description="optimizer")
        self.matmul = widgets.Dropdown(options=[("torch's", "none")] + [(m, m) for m in MATMUL_PRECISIONS],
                                       value=config.matmul_precision or "none", description="matmul")
        # DDP's way out when some parameters take no part in the loss (its error names this option).
        self.find_unused = widgets.Checkbox(value=config.find_unused_parameters, indent=False,
                                            description="find_unused_parameters (DDP)")
        self.fields = {"batch-size": self.batch_size, "accumulate": self.accumulate, "workers": self.workers,
                       "processes": self.processes, "scale-lr": self.scale_lr, "base-batch": self.base_batch,
                       "lr": self.lr, "max-epochs": self.max_epochs, "max-steps": self.max_steps,
                       "compile": self.compile, "channels-last": self.channels_last,
                       "optimizer-impl": self.optimizer_impl, "matmul": self.matmul,
                       "find-unused-parameters": self.find_unused}
        for name, widget in self.fields.items():
            widget.add_class(f"nbtrain-{name}")
            widget.style.description_width = "80px"
            widget.observe(lambda _change: self._on_change(), "value")
        self.widget = widgets.VBox([
            _labelled("device", self.device.widget), _labelled("precision", self.precision.widget),
            widgets.HBox([widgets.VBox([self.batch_size, self.accumulate, self.processes]),
                          widgets.VBox([self.workers, self.max_epochs, self.max_steps]),
                          widgets.VBox([self.scale_lr, self.base_batch, self.lr])]),
            _folded("more speed toggles", widgets.HBox([self.compile, self.optimizer_impl, self.matmul,
                                                        self.channels_last, self.find_unused])),
        ])
        self.refresh_choices()

    def changes(self) -> dict:
        """The config options as the widgets state them, unread and unchecked."""
        return {
            "accelerator": self.device.value, "precision": self.precision.value,
            "batch_size": self.batch_size.value, "accumulate_grad_batches": self.accumulate.value,
            "num_workers": self.workers.value, "devices": self.processes.value,
            "scale_lr": self.scale_lr.value, "base_batch_size": self.base_batch.value,
            "lr": self.lr.value, "max_epochs": self.max_epochs.value, "max_steps": self.max_steps.value,
            "compile": self.compile.value, "channels_last": self.channels_last.value,
            "optimizer_impl": self.optimizer_impl.value, "matmul_precision": self.matmul.value,
            "find_unused_parameters": self.find_unused.value,
        }

    def refresh_choices(self) -> None:
        """Disable the device and precision choices config.py refuses here, with its reason."""
        self.device.set_unavailable({d: choice_problem("accelerator", d) for d in DEVICE_CHOICES})
        self.precision.set_unavailable({p: choice_problem("precision", p, accelerator=self.device.value)
                                        for p in PRECISIONS})

    def set_running(self, running: bool) -> None:
        # Processes cannot change inside a running process: that control waits for the next run.
        self.processes.disabled = running


def _labelled(text: str, widget) -> widgets.HBox:
    label = widgets.Label(text, layout=widgets.Layout(width="84px"))
    return widgets.HBox([label, widget])


def _folded(title: str, widget) -> widgets.Accordion:
    folded = widgets.Accordion(children=[widget], titles=(title,), selected_index=None)
    folded.add_class("nbtrain-more")
    return folded


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
