"""Small parts the control notebook's panels share: tables, plots, the steps | tokens toggle,
messages beside a field, buttons, and the news one panel gives the others.

News: a panel that changes the lab tells the others (`tell("constellations")`), and those that
show it redraw (`hear("constellations", key, callback)`) — the form's constellation list after
the data cell prepared one, its machine list after an account was added; the monitor follows the
run the newest form started — so nothing needs its cell run again. A panel listens under one
key: its cell run again replaces the old listener.
"""
from __future__ import annotations

import threading

import ipywidgets as widgets

from lab.api import curves
from lab.ui.text import esc, plot_words, tr

RED, ORANGE, GREEN, GREY = "#d32f2f", "#ef6c00", "#2e7d32", "#666"
WAIT = "◷"  # "something is under way": a glyph Debian's Chromium has (its fonts have no ⏳, drawn as an empty box)
CELL = "padding:2px 8px;text-align:left;vertical-align:top"

_listeners: dict[str, dict[str, object]] = {}
_lock = threading.Lock()


def hear(topic: str, key: str, callback) -> None:
    """`callback(*args)` whenever `topic` is told, one listener per `key`."""
    with _lock:
        _listeners.setdefault(topic, {})[key] = callback


def tell(topic: str, *args) -> None:
    """Tells every listener of `topic`; one that fails does not stop the others."""
    with _lock:
        callbacks = list(_listeners.get(topic, {}).values())
    for callback in callbacks:
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - a panel's redraw is a courtesy to the one that told
            pass


def table(head: list[str], rows: list[list[str]], cls: str) -> str:
    """An HTML table; cells are HTML already escaped by the caller."""
    th = "".join(f"<th style='{CELL};border-bottom:1px solid #ccc'>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='{CELL}'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}' style='border-collapse:collapse;font-size:90%'><tr>{th}</tr>{body}</table>"


def png(runs: dict[str, list[dict]], x: str, title: str | None = None) -> bytes:
    """The loss plot of `runs` (several: their y axis where they are compared), its words in the
    view's language."""
    return curves.png(runs, x, title, plot_words())


def x_toggle() -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=[("", "step"), ("", "tokens")], value="step",
                                 style={"button_width": "80px"})


def x_labels(toggle: widgets.ToggleButtons) -> None:
    value = toggle.value
    toggle.options = [(tr("steps", "шаги"), "step"), (tr("tokens", "токены"), "tokens")]
    toggle.value = value


def row(children: list, **layout) -> widgets.HBox:
    """Widgets side by side, centred, wrapping onto a next line where the cell is too narrow."""
    return widgets.HBox(children, layout=widgets.Layout(align_items="center", flex_flow="row wrap", **layout))


def note(text: str, kind: str = "info") -> str:
    """A message beside a field: ✖ red (error), ⚠ orange (warning), ✔ green (done), grey (info)."""
    mark, color = {"error": ("✖ ", RED), "warning": ("⚠ ", ORANGE), "ok": ("✔ ", GREEN)}.get(kind, ("", GREY))
    return f"<span style='color:{color};font-size:90%'>{mark}{esc(text)}</span>"


def button(cls: str, icon: str = "", style: str = "", width: str = "auto") -> widgets.Button:
    """A button as wide as its words: in a row too narrow for all of it, the row wraps (`row`)
    rather than cut the words to "П…"."""
    b = widgets.Button(icon=icon, button_style=style, layout=widgets.Layout(width=width, flex="0 0 auto",
                                                                            min_width="fit-content"))
    b.add_class(cls)
    return b


def html(cls: str = "", value: str = "", **layout) -> widgets.HTML:
    w = widgets.HTML(value, layout=widgets.Layout(**layout))
    if cls:
        w.add_class(cls)
    return w


def walk(widget):
    """A widget and everything inside it."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)
