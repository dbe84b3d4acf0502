"""The control notebook's widgets: what `notebooks/control.ipynb` shows, one call per cell.

    from lab import ui
    ui.setup()                   # 1. the lab home, the version, this computer's GPU; RU | EN
    ui.machines()                # 2. Kaggle accounts with their quota bars, and the local card
    form = ui.new_run()          # 3-4. the "New run" form with the calculator beside it
    ui.start(form)               # 5. Start, and where the run went
    ui.monitor(form)             # 6. links, log tail and the loss plot, refreshed while it runs
    ui.runs()                    # 7. the lab's runs, lineage, overlay plot, "when to grow"
    ui.try_model()               # 9. a run's checkpoint writing text from a prompt, streamed

Each call shows its panel and returns it (for `form.set(layers=12)`, `monitor.refresh()`...).
The panels live in `lab.ui_form` (the form), `lab.ui_calc` (the calculator) and
`lab.ui_panels`; their words in `lab.ui_text`; what they ask of the lab (machines, Auto,
start, status) in `lab.ui_backend`. No widget ever holds a secret: widget state is saved
into notebooks.
"""
from __future__ import annotations

from lab.ui.form import NewRunForm
from lab.ui.panels import MachinesPanel, Monitor, RunsPanel, SetupPanel, StartPanel, lineage_rows
from lab.ui.text import language_switch, set_language
from lab.ui.trymodel import TryModel

__all__ = ["setup", "machines", "new_run", "start", "monitor", "runs", "try_model", "set_language", "language_switch",
           "NewRunForm", "MachinesPanel", "Monitor", "RunsPanel", "SetupPanel", "StartPanel", "TryModel", "lineage_rows"]


def setup() -> SetupPanel:
    """Cell 1: where the lab lives and what this computer has; the language switch."""
    return SetupPanel().show()


def machines() -> MachinesPanel:
    """Cell 2: each Kaggle account's quota (left / total, reset time) and runs; the local card."""
    return MachinesPanel().show()


def new_run(**values) -> NewRunForm:
    """Cells 3-4: the "New run" form, with the calculator beside it. `values` pre-fill fields
    (RunConfig names, `mode`, `resume_from`)."""
    return NewRunForm(**values).show()


def start(form: NewRunForm, press: bool = False) -> StartPanel:
    """Cell 5: the form's Start button and where the run went. `press` presses it and waits
    until the run is registered (headless runs); an invalid form is an error then."""
    panel = StartPanel(form).show()
    if press:
        form.settle()
        if form.start(wait=True) is None:
            problems = "; ".join(p.en for p in form.errors) or form.start_error or "Start is disabled"
            raise RuntimeError(f"the run did not start: {problems}")
    return panel


def monitor(form: NewRunForm | None = None, run: str | None = None, wait_minutes: float = 0) -> Monitor:
    """Cell 6: follows the form's run (or `run`); `wait_minutes` blocks until it ends (headless)."""
    m = Monitor(form, run).show()
    if wait_minutes:
        m.wait(wait_minutes)
    return m


def runs() -> RunsPanel:
    """Cell 7: the lab's runs with lineage, an overlay plot of chosen runs, "when to grow"."""
    return RunsPanel().show()


def try_model(run: str | None = None) -> TryModel:
    """Cell 9: a run's checkpoint writes text from a prompt, streamed into the cell."""
    return TryModel(run).show()
