"""The control notebook's small panels: setup (the lab home, the version, this computer's GPU,
the language switch) and Start. The others live in their own modules: `machines`, `data`,
`form` (with `calc`), `monitor`, `runs`, `recipes`."""
from __future__ import annotations

import ipywidgets as widgets

from lab import __version__
from lab.home import lab_home
from lab.api.machines import local_gpu
from lab.ui.parts import hear, table
from lab.ui.text import Panel, esc, language_switch, on_language, tr


class SetupPanel(Panel):
    """The lab home, the version, this computer's GPU, and the language switch."""

    def __init__(self):
        self.info = widgets.HTML()
        self.info.add_class("lab-setup")
        self.box = widgets.VBox([widgets.HBox([language_switch()]), self.info])
        on_language(self.render)
        self.render()

    def render(self) -> None:
        _, gpu = local_gpu()
        rows = [[esc(tr("Version", "Версия")), f"lab {esc(__version__)}"],
                [esc(tr("Lab home", "Дом лабы")), f"<code>{esc(lab_home())}</code>"],
                [esc(tr("This computer's GPU", "Видеокарта этого компьютера")), esc(gpu)]]
        self.info.value = table([esc(tr("The lab", "Лаба")), ""], rows, "lab-setup-table")


class StartPanel(Panel):
    """The form's Start button and the line that says where the run went (the same widgets as
    beside the calculator: two views of one button). The form's cell run again makes a new
    form: this panel then shows the new form's button."""

    def __init__(self, form):
        self.box = widgets.VBox([form.start_button, form.where])
        hear("form", "StartPanel", self.show_form)

    def show_form(self, form) -> None:
        self.box.children = [form.start_button, form.where]
