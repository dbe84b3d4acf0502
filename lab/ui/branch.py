"""A cooldown branch from a WSD run's checkpoint (`lab branch RUN --at STEP`), as one row of
widgets: the run, the step, the fraction that decays, the machine it runs on, the button. The
runs cell and the recipe lab cell show the same row."""
from __future__ import annotations

import ipywidgets as widgets

from lab.api import accounts
from lab.api import machines as lab_machines
from lab.api import runs as lab_runs
from lab.config import UserError
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
from lab.recipes.branch import BRANCHABLE, parent_decay_start
from lab.ui.parts import button, html, note
from lab.sizing.words import format_number
from lab.ui.text import error_text, esc, lang, tr


def branchable(runs: list) -> dict[str, list[int]]:
    """Run id -> the steps of its checkpoints in its constant phase, newest run first."""
    out: dict[str, list[int]] = {}
    for r in sorted(runs, key=lambda r: (r.created, r.id), reverse=True):
        cfg = r.cfg
        if cfg.schedule not in BRANCHABLE:
            continue
        steps = [s for s in (checkpoint_step(p) for p in list_checkpoints(r.folder / "checkpoints"))
                 if s <= parent_decay_start(cfg)]
        if steps:
            out[r.id] = steps
    return out


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
        self.box = widgets.VBox([self.title, widgets.HBox([self.run, self.step, self.frac, self.machine, self.go],
                                                          layout=widgets.Layout(align_items="center")), self.out])

    def relabel(self) -> None:
        self.title.value = (f"<h4 style='margin:8px 0 2px'>{esc(tr('A cooldown branch from a WSD run’s checkpoint', 'Ветка охлаждения из чекпоинта WSD-прогона'))}</h4>")
        self.run.description, self.step.description = tr("Run", "Прогон"), tr("step", "шаг")
        self.frac.description = tr("decays", "доля спада")
        self.machine.description = tr("Machine", "Машина")
        self.go.description = tr("Cooldown branch", "Ветка охлаждения")
        choices = lab_machines.machine_choices(accounts.names(), tr)
        keep = self.machine.value if self.machine.value in [v for _, v in choices] else "auto"
        self.machine.options = choices
        self.machine.value = keep

    def refresh(self, runs: list) -> None:
        """The runs that can branch, the selection kept where it still can."""
        self.steps_of = branchable(runs)
        ids = list(self.steps_of)
        keep = self.run.value if self.run.value in ids else (ids[0] if ids else "")
        self.run.options = [(i, i) for i in ids] or [(tr("no WSD checkpoints", "нет WSD-чекпоинтов"), "")]
        self.run.value = keep  # a drop-down given new options shows a blank until it is given a value
        self.go.disabled = not ids
        self._steps()
        self.relabel()

    def _steps(self) -> None:
        steps = self.steps_of.get(self.run.value, [])
        self.step.options = [(format_number(s, lang()), s) for s in steps]
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
