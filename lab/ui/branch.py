"""A cooldown branch from a WSD run's checkpoint (`lab branch RUN --at STEP`), as one row of
widgets: the run, the step, the fraction that decays, the machine it runs on, the button. The
runs cell and the recipe lab cell show the same row."""
from __future__ import annotations

import ipywidgets as widgets

from lab.api import accounts
from lab.api import machines as lab_machines
from lab.api import runs as lab_runs
from lab.config import UserError
from lab.ui.parts import button, html, note, row
from lab.ui.text import error_text, esc, num, tr


class BranchRow:
    """The branch's run and step (drop-downs that always show what they hold), the decaying
    fraction, the machine (Auto, this computer, an account, a box: as "more steps" offers them),
    and the button; what happened under it."""

    def __init__(self, on_started=None):
        self.on_started = on_started
        self.title = html()
        self.run = widgets.Dropdown(layout=widgets.Layout(width="26em"), style={"description_width": "initial"})
        self.step = widgets.Dropdown(layout=widgets.Layout(width="12em"), style={"description_width": "initial"})
        self.frac = widgets.BoundedFloatText(value=0.2, min=0.05, max=0.5, step=0.05, style={"description_width": "initial"},
                                             continuous_update=True,
                                             layout=widgets.Layout(width="10em"))
        self.machine = widgets.Dropdown(layout=widgets.Layout(width="16em"), style={"description_width": "initial"})
        for w, cls in ((self.run, "lab-branch-run"), (self.step, "lab-branch-step"), (self.frac, "lab-branch-frac"),
                       (self.machine, "lab-branch-machine")):
            w.add_class(cls)
        self.go = button("lab-branch", "code-fork")
        self.go.on_click(lambda _: self.branch())
        self.out = html("lab-recipes-branch")
        self.steps_of: dict[str, list[int]] = {}
        self.run.observe(lambda _: self._steps(), names="value")
        self.box = widgets.VBox([self.title, row([self.run, self.step, self.frac, self.machine, self.go]), self.out])

    def relabel(self) -> None:
        self.title.value = (f"<h4 style='margin:8px 0 2px'>{esc(tr('A cooldown branch from a WSD run’s checkpoint', 'Ветка охлаждения из чекпоинта WSD-прогона'))}</h4>"
                            + note(tr("It starts from a checkpoint the run kept before its own decay began: from "
                                      "there on a branch would only repeat the run.",
                                      "Она начинается с чекпоинта, сохранённого до начала спада самого прогона: "
                                      "ветка оттуда и дальше лишь повторила бы прогон.")))
        self.run.description, self.step.description = tr("Run", "Прогон"), tr("step", "шаг")
        self.frac.description = tr("decays", "доля спада")
        self.machine.description = tr("Machine", "Машина")
        self.go.description = tr("Cooldown branch", "Ветка охлаждения")
        choices = lab_machines.machine_choices(accounts.names(), tr)
        keep = self.machine.value if self.machine.value in [v for _, v in choices] else "auto"
        self.machine.options = choices
        self.machine.value = keep

    def refresh(self, runs: list | None = None) -> None:
        """The runs that can branch as the lab has them now (`runs`, what a panel listed, is not
        needed: the lab says which checkpoints a branch can start from), the selection kept where
        it still can."""
        self.steps_of = lab_runs.branch_points()
        ids = list(self.steps_of)
        keep = self.run.value if self.run.value in ids else (ids[0] if ids else "")
        self.run.options = [(i, i) for i in ids] or [(tr("no checkpoint before a decay", "нет чекпоинтов до спада"), "")]
        self.run.value = keep  # a drop-down given new options shows a blank until it is given a value
        self.go.disabled = not ids
        self._steps()
        self.relabel()

    def _steps(self) -> None:
        steps = self.steps_of.get(self.run.value, [])
        self.step.options = [(num(s), s) for s in steps]
        self.step.value = steps[-1] if steps else None

    def branch(self) -> None:
        if self.run.value not in self.steps_of or self.step.value is None:
            return
        try:
            run_id = lab_runs.branch(self.run.value, int(self.step.value), float(self.frac.value),
                                     self.machine.value or "auto").id
        except UserError as e:
            self.out.value = note(error_text(e), "error")
            return
        self.out.value = note(tr(f"Branch {run_id} started; the monitor and the runs list show it.",
                                 f"Ветка {run_id} запущена; монитор и список прогонов показывают её."), "ok")
        if self.on_started:
            self.on_started(run_id)
