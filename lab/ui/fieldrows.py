"""The New run form's rows: one run field's label, input, message and help, and the input a
field's kind asks for."""
from __future__ import annotations

import ipywidgets as widgets

from lab.config import Problem, field_choices, field_kind
from lab.ui.parts import GREY, ORANGE, RED
from lab.ui.text import esc, help_text, label, problem_text


class FieldRow:
    """One field: its label, input, the message about it and the guide's help."""

    def __init__(self, name: str, widget: widgets.Widget):
        self.name, self.input = name, widget
        self.label = widgets.HTML(layout=widgets.Layout(width="12em", min_width="12em"))
        self.message = widgets.HTML()
        self.help = widgets.HTML(layout=widgets.Layout(margin="0 0 6px 12.5em"))
        widget.add_class(f"lab-field-{name}")
        self.message.add_class(f"lab-message-{name}")
        self.message.layout.margin = "0 0 0 12.5em"
        self.box = widgets.VBox([widgets.HBox([self.label, widget]), self.message, self.help])

    def relabel(self, show_help: bool, **values) -> None:
        """Its words in the view's language; `values` (width, heads) fill the help's example."""
        text = help_text(self.name, **values)
        self.label.value = f"<b>{esc(label(self.name))}</b>"
        self.label.tooltip = text
        self.help.value = f'<div style="color:#666;font-size:85%;line-height:1.3">{esc(text)}</div>'
        self.help.layout.display = None if show_help else "none"

    def show(self, problems: list[Problem]) -> None:
        errors = [p for p in problems if p.severity == "error"]
        warned = [p for p in problems if p.severity == "warning"]
        color = RED if errors else ORANGE if warned else None
        self.input.layout.border = f"2px solid {color}" if color else None
        look = {"error": (RED, "✖"), "warning": (ORANGE, "⚠")}  # a note (what the lab does) reads grey
        self.message.value = "".join(
            f'<div style="color:{look.get(p.severity, (GREY, "ℹ"))[0]};font-size:90%;line-height:1.35">'
            f'{look.get(p.severity, (GREY, "ℹ"))[1]} {esc(problem_text(p))}</div>' for p in problems)
        self.message.layout.display = None if problems else "none"


def field_widget(name: str, value) -> widgets.Widget:
    """The input for a run field, from its declared kind and choices: a number box for int
    and float fields, a drop-down for a field with choices (labels set by the form's `_relabel`), a
    multiple choice for a list field (options filled from the lab home), text otherwise."""
    kind, choices = field_kind(name), field_choices(name)
    if kind == "int":
        return widgets.IntText(value=value, continuous_update=True, layout=widgets.Layout(width="9em"))
    if kind == "float":
        return widgets.FloatText(value=value, continuous_update=True, layout=widgets.Layout(width="9em"))
    if kind == "list":
        return widgets.SelectMultiple(options=[], rows=3, layout=widgets.Layout(width="28em"))
    if choices:
        return widgets.Dropdown(options=[(c, c) for c in choices], value=value, layout=widgets.Layout(width="14em"))
    return widgets.Text(value=value, layout=widgets.Layout(width="28em"))


def relabel(widget: widgets.Widget, options: list) -> None:
    """New option labels for a selection widget, keeping what is selected."""
    value = widget.value
    widget.options = options
    values = [v for _, v in options]
    if isinstance(value, tuple):
        widget.value = tuple(v for v in value if v in values)
    elif value in values:
        widget.value = value
