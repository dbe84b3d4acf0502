"""The "New run" form and the sizing calculator beside it.

The fields are the guide's, in its order and words; each shows its help text and, when
something is wrong with it, the message under it (red: an error, which keeps Start
disabled; orange: a warning). Every change recomputes `lab.sizing.estimate` (about a
millisecond) and redraws the calculator. Auto's pick may ask Kaggle for quota, so it is
worked out in a background thread, newest request first. The form holds no secret:
widget state is saved into the notebook.
"""
from __future__ import annotations

import threading
from pathlib import Path

import ipywidgets as widgets
import traitlets

from lab.api import accounts
from lab.api import data as lab_data
from lab.api import machines as lab_machines
from lab.api import runs as lab_runs
from lab.config import MODEL_FIELDS, Problem, RunConfig, UserError
from lab.ui import console
from lab.ui.calc import calculator_html
from lab.ui.fieldrows import FieldRow, field_widget, relabel
from lab.ui.parts import hear, tell
from lab.ui.start import Launch
from lab.ui.text import (GPU_NAMES, MODES, SECTIONS, TITLE, Panel, count, error_text, esc, language_switch, num,
                         on_language, pair, tr)
from lab.ui.threads import Latest, in_background

# The guide's sections and order. Every name but "mode" is a RunConfig field: its widget
# follows from the field's kind and choices, its words from its metadata (`lab.config`).
LAYOUT = {"run": ("mode", "resume_from", "constellations"), "model": MODEL_FIELDS,
          "training": ("gpu", "machine", "batch_per_card", "steps_until", "limit_min"),
          "more": ("schedule", "lr", "warmup_steps", "eval_every")}
# The fields `config()` reads plainly; resume_from counts only in the "from a checkpoint" mode.
CONFIG_FIELDS = tuple(n for section in LAYOUT.values() for n in section if n not in ("mode", "resume_from"))


class NewRunForm(Panel):
    """The form, the calculator and the Start button. `config()` is the run it describes,
    `estimate` the calculator's figures, `start()` presses Start."""

    def __init__(self, **values):
        self._quiet = True  # no recomputing while the form is built
        self._init_state()
        self._make_inputs()
        self._make_controls()
        self.box = self._layout()
        self._fill_choices()
        self._relabel()
        self.inputs["constellations"].value = tuple(n for n in RunConfig().constellations
                                                    if n in self._constellation_names)
        self._observe()
        self._quiet = False
        self.set(**values)

    def _init_state(self) -> None:
        """What the form knows besides its widgets: the calculator's figures, Auto's pick, the start."""
        self._checkpoints: dict[str, dict] = {}
        self.estimate: lab_runs.Estimate | None = None
        self.settled = None  # the previewed run (lab.api.runs.preview): what Start registers
        self.choice = None
        self.choice_error: str | None = None
        self.choice_read_at: float | None = None  # when the machines Auto picked among were read
        self.run_id: str | None = None
        self.start_error: str | None = None
        self._starting = False
        self._start_thread: threading.Thread | None = None
        self._listeners: list = []
        self._auto = Latest(self._choose, self._chosen)
        self._general: list[str] = []
        self._render_lock = threading.RLock()

    def _make_inputs(self) -> None:
        """One input per field of `LAYOUT` (at the guide's values), each in its row."""
        d = RunConfig()
        self.inputs: dict[str, widgets.Widget] = {
            # The form's own: the mode, and the two fields whose options come from the lab home.
            "mode": widgets.ToggleButtons(options=[("", "scratch"), ("", "resume")], value="scratch"),
            "resume_from": widgets.Dropdown(options=[("—", "")], value="", layout=widgets.Layout(width="28em")),
            "machine": widgets.Dropdown(options=[("", "auto"), ("", "local")], value="auto",
                                        layout=widgets.Layout(width="18em")),
        }
        for name in CONFIG_FIELDS:
            self.inputs.setdefault(name, field_widget(name, getattr(d, name)))
        self.rows = {name: FieldRow(name, self.inputs[name]) for section in LAYOUT.values() for name in section}

    def _make_controls(self) -> None:
        """The title, the section headers, the hints switch, the calculator and the Start button."""
        self.hints = widgets.Checkbox(value=True, indent=False, layout=widgets.Layout(width="auto"))
        self.title = widgets.HTML()
        self.headers = {k: widgets.HTML() for k in ("run", "model", "training")}
        self.more = widgets.Accordion(children=[widgets.VBox([self.rows[n].box for n in LAYOUT["more"]])])
        self.more.selected_index = None
        self.more.add_class("lab-more")
        self.calc = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.calc.add_class("lab-calc")
        self.start_button = widgets.Button(button_style="success", icon="play", layout=widgets.Layout(width="12em"))
        self.start_button.add_class("lab-start")
        self.start_button.on_click(lambda _: self.start())
        self.where = widgets.HTML()
        self.where.add_class("lab-where")
        self.launch = Launch(self.where, on_change=self._launched)

    def _layout(self) -> widgets.VBox:
        """The fields on the left in the guide's sections, the calculator and Start on the right."""
        fields = [self.headers["run"], *(self.rows[n].box for n in LAYOUT["run"]),
                  self.headers["model"], *(self.rows[n].box for n in LAYOUT["model"]),
                  self.headers["training"], *(self.rows[n].box for n in LAYOUT["training"]), self.more]
        left = widgets.VBox(fields, layout=widgets.Layout(flex="1 1 560px", min_width="480px"))
        right = widgets.VBox([self.calc, self.start_button, self.where],
                             layout=widgets.Layout(flex="1 1 380px", min_width="340px", padding="0 0 0 16px"))
        top = widgets.HBox([self.title, language_switch(), self.hints],
                           layout=widgets.Layout(align_items="center", justify_content="space-between"))
        box = widgets.VBox([top, widgets.HBox([left, right], layout=widgets.Layout(flex_flow="row wrap"))])
        box.add_class("lab-new-run")
        return box

    def _observe(self) -> None:
        """Every change recomputes; the mode and the checkpoint also lock or fill the model fields."""
        for name, w in self.inputs.items():
            if name not in ("mode", "resume_from"):
                w.observe(self._changed, names="value")
        self.inputs["mode"].observe(self._mode_changed, names="value")
        self.inputs["resume_from"].observe(self._checkpoint_changed, names="value")
        self.hints.observe(lambda _: self._relabel(), names="value")
        on_language(self._relabel)
        hear("constellations", "NewRunForm", self.lab_changed)  # what another cell changed: listed anew, no re-run
        for topic in ("machines", "runs"):  # an account, a probe, a run started or ended: Auto picks anew too
            hear(topic, "NewRunForm", self._machines_changed)

    # -- the widget -------------------------------------------------------------------------

    def on_started(self, callback) -> None:
        """`callback(run_id)` once a run started from this form is registered."""
        self._listeners.append(callback)

    def lab_changed(self) -> None:
        """Constellations, accounts or runs changed elsewhere: the lists and token counts anew."""
        if self._starting:
            return
        overview_gone = accounts.names() != self._accounts
        self._fill_choices()
        self._relabel()
        if overview_gone and self.inputs["machine"].value == "auto":
            self.update()  # Auto's pick over the machines as they are now

    def _machines_changed(self, *_) -> None:
        """The machines changed (the kept view is stale by now): the lists, and Auto's pick over
        the machines as they are now."""
        if self._starting:
            return
        self.lab_changed()
        if self.inputs["machine"].value == "auto":
            self.update()

    def keep(self, values: dict) -> None:
        """Fills what still fits of an earlier form's `values` (a constellation or account since
        removed is passed over); the others stay at the guide's values."""
        first = {k: values[k] for k in ("mode", "resume_from") if k in values}
        for name, value in [(None, first)] + [(k, {k: v}) for k, v in values.items() if k not in first]:
            try:
                self.set(**value)
            except (UserError, traitlets.TraitError):
                if name == "constellations":
                    self.set(constellations=[c for c in value[name] if c in self._constellation_names])

    def values(self) -> dict:
        """What the person has in the form (the fields `set` takes): a re-run of its cell keeps it."""
        out = {n: self.inputs[n].value for n in CONFIG_FIELDS if not self.inputs[n].disabled}
        out["constellations"] = list(out.get("constellations", ()))
        out["mode"] = self.inputs["mode"].value
        if out["mode"] == "resume" and self.inputs["resume_from"].value:
            out["resume_from"] = self.inputs["resume_from"].value
        return out

    # -- choices and labels -----------------------------------------------------------------

    def _fill_choices(self) -> None:
        self._constellation_tokens = lab_data.tokens()
        try:
            self._constellation_names = [c.name for c in lab_data.constellations()]
        except UserError as e:
            self._constellation_names, self._general = [], [str(e)]
        self._accounts = accounts.names()
        self._checkpoints = lab_runs.checkpoints()

    def _relabel(self) -> None:
        quiet, self._quiet = self._quiet, True
        try:
            self._constellation_tokens = lab_data.tokens()  # data prepared since
            self.title.value = f"<h3 style='margin:4px 0'>{esc(pair(TITLE))}</h3>"
            self.hints.description = tr("hints", "подсказки")
            for key, header in self.headers.items():
                header.value = f"<h4 style='margin:10px 0 4px 0'>{esc(pair(SECTIONS[key]))}</h4>"
            self.more.set_title(0, pair(SECTIONS["more"]))
            for row in self.rows.values():
                row.relabel(self.hints.value)
            relabel(self.inputs["mode"], [(pair(MODES[m]), m) for m in MODES])
            relabel(self.inputs["gpu"], [(pair(GPU_NAMES[g]), g) for g in GPU_NAMES])
            relabel(self.inputs["machine"], lab_machines.machine_choices(self._accounts, tr))
            relabel(self.inputs["constellations"], [(self._constellation_label(n), n) for n in self._constellation_names])
            self.inputs["constellations"].rows = max(2, min(6, len(self._constellation_names)))
            relabel(self.inputs["resume_from"], self._checkpoint_options())
            self.start_button.description = tr("Start", "Старт")
            self.launch.render()
        finally:
            self._quiet = quiet
        if not quiet:
            self.update()

    def _constellation_label(self, name: str) -> str:
        tokens = self._constellation_tokens.get(name)
        if tokens is None:
            return f"{name} — " + tr("not prepared", "не подготовлено")
        return f"{name} — {count(tokens)} " + tr("tokens", "токенов")

    def _checkpoint_options(self) -> list[tuple[str, str]]:
        if not self._checkpoints:
            return [(tr("— no checkpoints yet —", "— чекпоинтов пока нет —"), "")]
        out = [(tr("— pick a checkpoint —", "— выберите чекпоинт —"), "")]
        for path, info in self._checkpoints.items():
            c = info.get("config") or {}
            out.append((f"{info['run']} · {tr('step', 'шаг')} {num(info['step'])} · {c.get('layers', '?')}×{c.get('width', '?')}"
                        f", n {c.get('context', '?')}", path))
        return out

    # -- values ---------------------------------------------------------------------------

    def set(self, **values) -> None:
        """Fills fields (RunConfig names, plus `mode`); `resume_from` picks a checkpoint."""
        unknown = sorted(set(values) - set(self.inputs))
        if unknown:
            raise UserError(f"the form has no field(s) {', '.join(unknown)}; its fields: {', '.join(self.inputs)}")
        quiet, self._quiet = self._quiet, True
        try:
            mode = values.get("mode", "resume" if values.get("resume_from") else None)
            if mode is not None:
                self.inputs["mode"].value = mode
            if self.inputs["mode"].value == "resume" and (mode == "resume" or "resume_from" in values):
                if mode == "resume":
                    self._checkpoints = lab_runs.checkpoints()
                if values.get("resume_from"):
                    self._add_checkpoint(str(values["resume_from"]))
                relabel(self.inputs["resume_from"], self._checkpoint_options())
                self._apply_checkpoint()  # a checkpoint picked: its run's fields, then the values given
            for name, value in values.items():
                if name in ("mode", "resume_from") or self.inputs[name].disabled:
                    continue  # a locked model field keeps the checkpoint's value
                if name == "constellations":
                    value = (value.split(",") if isinstance(value, str) else list(value))
                    missing = [v for v in value if v not in self._constellation_names]
                    if missing:
                        raise UserError(f"unknown constellation(s) {', '.join(missing)}; known: "
                                        f"{', '.join(self._constellation_names)}")
                    value = tuple(value)
                self.inputs[name].value = value
            if self.inputs["mode"].value == "scratch":
                self._unlock()
        finally:
            self._quiet = quiet
        self.update()

    def _add_checkpoint(self, target: str) -> None:
        """Picks a checkpoint given as a file or a run folder (its newest), listed or not."""
        info = lab_runs.checkpoint(target)
        if info is None:
            self.inputs["resume_from"].value = ""
            return
        if info["path"] not in self._checkpoints:
            self._checkpoints[info["path"]] = {**info, "run": Path(info["path"]).parent.parent.name}
        relabel(self.inputs["resume_from"], self._checkpoint_options())
        self.inputs["resume_from"].value = info["path"]

    def given(self) -> dict:
        """The fields the form gives, each as it shows it: every one counts as given, so Start
        registers exactly what the person sees (a default shown is a default chosen)."""
        v = {n: self.inputs[n].value for n in CONFIG_FIELDS}
        v["constellations"] = list(v["constellations"])
        return v

    def resume(self) -> str | None:
        """The checkpoint the run continues from, in the "from a checkpoint" mode."""
        return (self.inputs["resume_from"].value or None) if self.inputs["mode"].value == "resume" else None

    def config(self) -> RunConfig:
        """The run the form describes, as it would be registered (whatever its validity): the
        previewed run's settled config, a continued run's every field as it will train."""
        if self.settled is not None:
            return self.settled.cfg
        return RunConfig.from_dict(self.given())

    def _checkpoint(self) -> dict | None:
        return self._checkpoints.get(self.inputs["resume_from"].value)

    def _mode_changed(self, change) -> None:
        if self._quiet:
            return
        if change["new"] == "resume":
            self._quiet = True
            try:
                self._checkpoints = lab_runs.checkpoints()
                relabel(self.inputs["resume_from"], self._checkpoint_options())
                self._apply_checkpoint()
            finally:
                self._quiet = False
        else:
            self._unlock()
        self.update()

    def _checkpoint_changed(self, change) -> None:
        if self._quiet:
            return
        self._quiet = True
        try:
            self._apply_checkpoint()
        finally:
            self._quiet = False
        self.update()

    def _apply_checkpoint(self) -> None:
        """Every field the form shows filled from the checkpoint's run as it was (the model fields
        locked), so what the form shows is what will run; "Steps until" moved past its step. The
        machine stays the person's: where a run goes is not the checkpoint's."""
        info = self._checkpoint()
        self.rows["resume_from"].box.layout.display = None
        for name in MODEL_FIELDS:
            self.inputs[name].disabled = True
        if info is None:
            return
        theirs = info.get("config") or {}
        for name in CONFIG_FIELDS:
            if name in theirs and name != "machine":
                self._show_value(name, theirs[name])
        if self.inputs["steps_until"].value <= info["step"] and int(theirs.get("steps_until", 0)) > info["step"]:
            self.inputs["steps_until"].value = int(theirs["steps_until"])

    def _show_value(self, name: str, value) -> None:
        """A checkpoint's value in its widget, where the widget can hold it (a constellation the
        lab no longer declares, a choice the form does not offer, stay as they are)."""
        widget = self.inputs[name]
        if name == "constellations":
            value = tuple(v for v in value if v in self._constellation_names)
            if not value:
                return
        options = getattr(widget, "options", None)
        if options is not None and name != "constellations":
            values = [o[1] if isinstance(o, tuple) else o for o in options]
            if value not in values:
                return
        try:
            widget.value = value
        except traitlets.TraitError:
            pass

    def _unlock(self) -> None:
        for name in MODEL_FIELDS:
            self.inputs[name].disabled = False
        self.rows["resume_from"].box.layout.display = "none"

    def _changed(self, change) -> None:
        if not self._quiet:
            self.update()

    # -- the calculator -------------------------------------------------------------------

    def update(self) -> None:
        """Recomputes the figures and the problems; redraws the calculator and the fields."""
        with self._render_lock:
            self._update()

    def _update(self) -> None:
        self.estimate = self._estimate()
        cfg = self.config()
        if cfg.machine == "auto":
            self._auto.submit(cfg, self.estimate.hours_to_finish or 0.0)
            if self.choice is not None and self.choice.machine == "local":  # most likely still: no flicker
                self.estimate = self._estimate(picked="local")
        else:
            self.choice, self.choice_error = None, None
        self._render()

    def _estimate(self, picked: str | None = None) -> lab_runs.Estimate:
        """The run Start would register (`lab.api.runs.preview`, as `lab size` sizes it), with
        figures for the card it will get: GPU "auto" on this computer or a box means its own
        measured cards. The previewed run is kept: `config()` is its config."""
        given = self.given()
        cards = lab_machines.sized_cards(picked or given["machine"])
        try:
            sized = lab_runs.preview(given, self.resume(), machine_cards=cards)
        except UserError as e:  # the checkpoint is gone: said at its field, the rest sized from scratch
            sized = lab_runs.preview(given, machine_cards=cards)
            sized.estimate.problems.insert(0, Problem("resume_from", str(e), e.ru or str(e)))
        self.settled = sized.settled
        return sized.estimate

    def _choose(self, cfg: RunConfig, need_h: float):
        """Auto's pick, and when the machines it picked among were read."""
        return console.machines.choose(cfg, need_h), console.machines.read_at

    def _chosen(self, args, picked, error) -> None:
        choice, read_at = picked if picked is not None else (None, None)
        with self._render_lock:
            if self.config().machine != "auto":  # the person picked a machine meanwhile: Auto's answer is stale
                return
            self.choice, self.choice_error = choice, (error_text(error) if error else None)
            self.choice_read_at = read_at
            self.estimate = self._estimate(picked=choice.machine if choice is not None else None)
            self._render()

    def settle(self, timeout_s: float = 30.0) -> None:
        """Waits for Auto's pick (tests and headless runs)."""
        self._auto.wait(timeout_s)

    def problems(self) -> list[Problem]:
        probs = list(self.estimate.problems) if self.estimate else []
        if self.inputs["mode"].value == "resume" and not self.inputs["resume_from"].value:
            probs.append(Problem("resume_from", "pick the checkpoint to continue from", "выберите чекпоинт, с которого продолжить"))
        return probs

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems() if p.severity == "error"]

    def _render(self) -> None:
        self.rows["heads"].relabel(self.hints.value, width=self.inputs["width"].value, heads=self.inputs["heads"].value)
        probs = self.problems()
        for name, row in self.rows.items():
            row.show([p for p in probs if p.field == name])
        loose = [p for p in probs if p.field not in self.rows]
        self.calc.value = calculator_html(self.estimate, self.config(), self.choice, self.choice_error, loose,
                                          self._general, self.choice_read_at)
        blocked = bool([p for p in probs if p.severity == "error"])
        self.start_button.disabled = blocked or self._starting
        self.start_button.tooltip = tr("Fix the fields marked in red", "Исправьте поля, отмеченные красным") \
            if blocked else tr("Start the run", "Запустить прогон")

    # -- Start ----------------------------------------------------------------------------

    def start(self, wait: bool = False) -> str | None:
        """Presses Start: the run is registered in the background and watched until it has
        really started (`lab.ui.start`); `wait` returns its id once registered."""
        if self.start_button.disabled:
            return None
        given, resume = self.given(), self.resume()
        self._starting, self.start_error, self.run_id = True, None, None
        self.start_button.disabled = True
        self.launch.registering()
        self._start_thread = in_background(self._register, given, resume, on_done=self._started,
                                           on_error=self._start_failed)
        if wait:
            self._start_thread.join()
        return self.run_id

    @staticmethod
    def _register(given: dict, resume: str | None) -> str:
        """The run the form shows, registered and driven in the background (lab.api.runs.start)."""
        run_id = lab_runs.start(given, resume, given["machine"])
        console.machines.forget()  # the kept overview no longer says who is busy
        return run_id

    def _started(self, run_id: str) -> None:
        self._starting, self.run_id = False, run_id
        self.launch.registered(run_id)
        self._render()
        for callback in self._listeners:
            callback(run_id)
        tell("started", run_id)  # the monitor follows it, whichever cell shows this form

    def _launched(self, phase: str) -> None:
        """The run has started or failed: the data it prepared and its checkpoints are listed anew."""
        self._fill_choices()
        self._relabel()
        tell("constellations")

    def _start_failed(self, error: Exception) -> None:
        self._starting, self.start_error = False, error_text(error)
        self.launch.failed_to_register(error)
        self._render()
