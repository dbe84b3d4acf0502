"""The control notebook's small panel: setup (the lab home, the version, this computer's GPU, the
language switch). The others live in their own modules: `machines`, `data`, `form` (with `calc`
and Start), `monitor`, `runs`, `recipes`."""
from __future__ import annotations

import ipywidgets as widgets

from lab.api import VERSION
from lab.api.machines import local_gpu
from lab.home import from_env, lab_home
from lab.ui.parts import note, table
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
        why = tr("from $LAB_HOME", "из $LAB_HOME") if from_env() else \
            tr("the kit's own, as `lab` commands use it; $LAB_HOME chooses another",
               "свой у кита, его же берут команды `lab`; другой задаёт $LAB_HOME")
        rows = [[esc(tr("Version", "Версия")), f"lab {esc(VERSION)}"],
                [esc(tr("Lab home", "Дом лабы")), f"<code class='lab-home'>{esc(lab_home())}</code> {note(why)}"],
                [esc(tr("This computer's GPU", "Видеокарта этого компьютера")), esc(gpu)]]
        self.info.value = table([esc(tr("The lab", "Лаба")), ""], rows, "lab-setup-table")
