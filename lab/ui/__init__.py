"""The control notebook's widgets: what `notebooks/control.ipynb` shows, one call per cell.

    from lab import ui
    ui.setup()                   # 1. the lab home, the version, this computer's GPU; RU | EN
    ui.machines()                # 2. machines: Kaggle accounts (add, probe, remove), quota, checkpoints kept
    ui.data()                    # 3. constellations: declare, edit, remove, prepare
    form = ui.new_run()          # 4. the "New run" form with the calculator and Start beside it
    ui.start(form, press=False)  #    (headless: presses Start)
    ui.monitor(form)             # 5. links, log, the loss plot; Stop and Continue
    ui.runs()                    # 6. the lab's runs: compare curves, more steps, cooldown branches
    ui.try_model()               # 8. a run's checkpoint writing text from a prompt, streamed

Each call shows its panel and returns it (for `form.set(layers=12)`, `monitor.refresh()`...).
The panels live in `lab.ui.machines`, `data`, `form` (with `calc`, `start`), `monitor`, `runs`,
`branch`, `recipes`, `trymodel` and `panels` (setup); their words in `lab.ui.text`; they ask the lab
through `lab.api` (the machines' state they share is kept in `lab.ui.console`); what they tell each
other goes through `lab.ui.parts`. No widget keeps a
secret: widget state is saved into notebooks.
"""
from __future__ import annotations

from lab.ui.data import DataPanel
from lab.ui.form import NewRunForm
from lab.ui.machines import MachinesPanel
from lab.ui.monitor import Monitor
from lab.ui.panels import SetupPanel
from lab.ui.parts import tell
from lab.ui.runs import RunsPanel
from lab.ui.text import language_switch, set_language
from lab.ui.trymodel import TryModel

__all__ = ["setup", "machines", "data", "new_run", "start", "monitor", "runs", "try_model", "set_language",
           "language_switch", "NewRunForm", "MachinesPanel", "DataPanel", "Monitor", "RunsPanel", "SetupPanel",
           "TryModel"]

_form: NewRunForm | None = None  # the newest form: its cell run again keeps what the person had in it


def setup() -> SetupPanel:
    """Cell 1: where the lab lives and what this computer has; the language switch."""
    return SetupPanel().show()


def machines() -> MachinesPanel:
    """Cell 2: every machine with its quota and probe; adding, probing, removing an account; the
    checkpoint datasets kept on each account."""
    return MachinesPanel().show()


def data() -> DataPanel:
    """Cell 3: the constellations with their sources, licence and tokens; declare, edit, prepare."""
    return DataPanel().show()


def new_run(**values) -> NewRunForm:
    """Cell 4: the "New run" form, with the calculator and Start beside it. `values` pre-fill
    fields (RunConfig names, `mode`, `resume_from`); the cell run again keeps the rest of what the
    person had in the form, and the monitor follows the new form."""
    global _form
    before = _form.values() if _form is not None else {}
    form = NewRunForm(**values)
    form.keep({k: v for k, v in before.items() if k not in values})
    _form = form
    tell("form", form)
    return form.show()


def start(form: NewRunForm, press: bool = False) -> None:
    """Headless runs (papermill, tests): `press` presses the form's Start and waits until the run
    is registered and has started, failed or waits for a machine; a form that cannot start, or a
    run that failed before it started, is an error then. A person presses the form's own Start:
    nothing is shown here (one Start button on the page)."""
    if not press:
        return
    form.settle()
    if form.start(wait=True) is None:
        problems = "; ".join(p.en for p in form.errors) or form.start_error or "Start is disabled"
        raise RuntimeError(f"the run did not start: {problems}")
    if form.launch.wait(600, until=("started", "failed", "waiting")) == "failed":
        raise RuntimeError(f"the run did not start: {form.launch.message}")


def monitor(form: NewRunForm | None = None, run: str | None = None, wait_minutes: float = 0) -> Monitor:
    """Cell 5: follows the run the newest form started (or `run`); `wait_minutes` blocks until
    it ends (headless)."""
    m = Monitor(form, run).show()
    if wait_minutes:
        m.wait(wait_minutes)
    return m


def runs() -> RunsPanel:
    """Cell 6: the lab's runs with lineage, their curves compared, "when to grow", more steps for
    a finished run, a cooldown branch."""
    return RunsPanel().show()


def try_model(run: str | None = None) -> TryModel:
    """Cell 8: a run's checkpoint writes text from a prompt, streamed into the cell."""
    return TryModel(run).show()
