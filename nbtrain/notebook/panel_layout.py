"""The panel's layout: which widget sits where, so each stays readable at any notebook width.

The run strip (Run / Stop / Apply now, progress, status) stays on top; under it the
settings, tools and runs tabs sit beside the live plot, so the plot and the progress
stay in view while settings change. In a narrow notebook the plot wraps above the tabs.
Text wraps and controls take their column's width: nothing is cut off or runs out of
the panel (tests/test_panel_browser.py measures that at 1280x800 and 1920x1080).
"""
from __future__ import annotations

import html

import ipywidgets as widgets

from .panel_views import fit_width, show_once_drawn


def layout(p) -> widgets.VBox:
    """The run strip on top (buttons, progress, status), then the settings / tools / runs tabs beside
    the live plot; in a narrow notebook the plot comes first and the tabs under it, none cut off."""
    model = p.recipe.model
    params = sum(x.numel() for x in model.parameters())
    title = widgets.HTML(block(f"<b>nbtrain</b> · {html.escape(type(model).__name__)} ({params:,} parameters)"
                               " — training settings for this live model"))
    buttons = widgets.HBox([p.run_button, p.stop_button, p.apply_button, p.close_button, p.code.toggle],
                           layout=widgets.Layout(flex_flow="row wrap"))
    settings = widgets.VBox([p.readout, p.controls.widget])
    # The tools' tables are as wide as they are: they scroll inside their tab rather than spill out.
    tools = widgets.Box([p.tools.widget], layout=widgets.Layout(overflow="auto"))
    runs = widgets.VBox([p.table.widget, p.compare.widget])
    tabs = widgets.Tab([settings, tools, runs], titles=("settings", "tools", "runs"),
                       layout=widgets.Layout(flex="1 1 500px", min_width="0"))
    tabs.add_class("nbtrain-tabs")
    placeholder = widgets.HTML(block("<i>The live plot appears here when a run starts: training loss and "
                                     "samples/s against the optimizer step.</i>"))
    fit_width(p.plot.image)
    show_once_drawn(p.plot.image, placeholder)
    fit_width(p.tools.image)
    show_once_drawn(p.tools.image)  # a tool's plot appears once it has one
    plot = widgets.VBox([placeholder, p.plot.image],
                        layout=widgets.Layout(flex="1 1 440px", min_width="0", max_width="780px"))
    plot.add_class("nbtrain-plot-area")
    # Reversed: the plot, first in a narrow notebook, sits right of the tabs in a wide one; flex-end
    # then packs both to the left.
    body = widgets.Box([plot, tabs], layout=widgets.Layout(display="flex", flex_flow="row-reverse wrap",
                                                           justify_content="flex-end", align_items="flex-start"))
    panel = widgets.VBox([title, buttons, p.code.html, p.progress.widget, p.status, body])
    panel.add_class("nbtrain-panel")
    return panel


def block(inner_html: str) -> str:
    """HTML that wraps onto more lines instead of running out of its widget."""
    return f"<div style='line-height:1.4;white-space:normal;overflow-wrap:anywhere'>{inner_html}</div>"


def status_html(text: str, error: bool = False) -> str:
    """The status line: its text as written (line breaks kept), red when it reports an error."""
    color = "#b00020" if error else "inherit"
    return (f"<div style='white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.4;color:{color}'>"
            f"{html.escape(text)}</div>")


def html_line(css_class: str) -> widgets.HTML:
    widget = widgets.HTML()
    widget.add_class(css_class)
    return widget


def button(text: str, css_class: str, style: str, on_click, tooltip: str, disabled: bool = False) -> widgets.Button:
    made = widgets.Button(description=text, button_style=style, disabled=disabled, tooltip=tooltip)
    made.add_class(css_class)
    made.on_click(on_click)
    return made


def descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)
