"""The runs cell: the lab's runs with their lineage; any runs' curves compared (steps or tokens,
each val set its own line, ancestors drawn in or not); "when to grow" for the run looked at; a
finished run continued with more steps; a cooldown branch."""
from __future__ import annotations

import ipywidgets as widgets

from lab.api import accounts, curves, words
from lab.api import machines as lab_machines
from lab.api import runs as lab_runs
from lab.config import Problem, UserError
from lab.ui.branch import BranchRow
from lab.ui.parts import RED, button, hear, html, note, png, row, table, tell, x_labels, x_toggle
from lab.ui.text import (Panel, error_text, esc, fixed, lang, machine_word, num, on_language, problem_text,
                         status_word, tr)


def speed_cell(speed) -> str:
    """The run's measured tokens/s beside the calculator's prediction for it (`RunRow.speed`), or "-"."""
    if speed is None:
        return "-"
    pred = f"{tr('predicted', 'прогноз')} {num(round(speed.predicted))}"
    text = f"? ({pred})" if speed.measured is None else f"{num(round(speed.measured))} ({pred}, {speed.error:+.0%})"
    return f"<span class='lab-speed-check'>{esc(text)}</span>"


class RunsPanel(Panel):
    """The lab's runs with lineage; an overlay of chosen runs; the "when to grow" verdict; more
    steps for a finished run; a cooldown branch."""

    def __init__(self):
        self.table = html("lab-runs-table")
        self.choose = widgets.SelectMultiple(rows=5, layout=widgets.Layout(width="30em"))
        self.choose.add_class("lab-runs-choose")
        self.x = x_toggle()
        self.ancestors = widgets.Checkbox(value=True, indent=False, layout=widgets.Layout(width="auto", min_width="13em"))
        self.refresh_button = button("lab-runs-refresh", "refresh")
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))
        self.plot.add_class("lab-runs-plot")
        self.plot.layout.display = "none"
        self.verdict = html("lab-grow")
        self.more = MoreSteps(on_started=self._started)
        self.branching = BranchRow(on_started=self._started)
        self.looked_at: str | None = None  # the run the person picked last: "when to grow" is about it
        self.box = widgets.VBox([self.refresh_button, self.table,
                                 row([self.choose, widgets.VBox([self.x, self.ancestors])]),
                                 self.plot, self.verdict, self.more.box, self.branching.box])
        self.box.add_class("lab-runs")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.choose.observe(self._chosen, names="value")
        for w in (self.x, self.ancestors):
            w.observe(lambda _: self.draw(), names="value")
        hear("runs", "RunsPanel", self.refresh)
        on_language(self._relabel)
        self._relabel()

    def _relabel(self) -> None:
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.ancestors.description = tr("with ancestors", "с предками")
        x_labels(self.x)
        self.refresh()

    def _started(self, run_id: str) -> None:
        tell("started", run_id)  # the monitor follows it
        self.refresh()

    def refresh(self) -> None:
        self.runs = {r.id: r for r in lab_runs.rows(newest_first=True)}
        rows = [self._row(r) for r in self.runs.values()]
        head = [tr(*h) for h in (("run", "прогон"), ("status", "статус"), ("step", "шаг"), ("size", "размер"),
                                 ("loss", "loss"), ("val", "val"), ("val bits/byte", "val бит/байт"),
                                 ("tok/s (predicted)", "ток/с (прогноз)"), ("machines", "машины"), ("from", "от кого"))]
        self.table.value = table([esc(h) for h in head], rows, "lab-runs") if rows else \
            f"<i>{esc(tr('No runs yet.', 'Прогонов пока нет.'))}</i>"
        chosen = tuple(i for i in self.choose.value if i in self.runs) or tuple(list(self.runs)[:1])
        self._quiet = True
        self.choose.options = list(self.runs)
        self.choose.value = chosen
        self._quiet = False
        if self.looked_at not in chosen:
            self.looked_at = chosen[0] if chosen else None
        self.more.refresh(list(self.runs.values()))
        self.branching.refresh()
        self.draw()

    def _row(self, r: lab_runs.RunRow) -> list[str]:
        c = r.config
        return [f"<code>{esc(r.id)}</code>", esc(status_word(r.status)), esc(f"{num(r.step)} / {num(c.steps_until)}"),
                esc(f"{c.layers}×{c.width}, n {c.context}"), "-" if r.loss is None else fixed(r.loss),
                "-" if r.val_loss is None else fixed(r.val_loss), "-" if r.val_bpb is None else fixed(r.val_bpb),
                speed_cell(r.speed), esc(", ".join(machine_word(m) for m in dict.fromkeys(r.machines)) or "-"),
                esc(" ← ".join(reversed(r.lineage[:-1])) or "-")]

    def _chosen(self, change) -> None:
        """The run added to the selection last is the one looked at."""
        if getattr(self, "_quiet", False):
            return
        added = [i for i in change["new"] if i not in change["old"]]
        if added:
            self.looked_at = added[-1]
        elif self.looked_at not in change["new"]:
            self.looked_at = change["new"][0] if change["new"] else None
        self.draw()

    def draw(self) -> None:
        chosen = [i for i in self.choose.value if i in self.runs]
        series = {i: curves.curve(i, ancestors=self.ancestors.value) for i in chosen}
        series = {k: v for k, v in series.items() if any("loss" in x for x in v)}
        if series:
            one = next(iter(series)) if len(series) == 1 else None  # the plot says which run it draws
            self.plot.value = png(series, self.x.value, title=one or tr("comparison", "сравнение"))
            self.plot.layout.display = None
        else:
            self.plot.layout.display = "none"
        looked = self.runs.get(self.looked_at or "")
        self.verdict.value = self._verdict(looked.id) if looked else ""

    def _verdict(self, run_id: str) -> str:
        v = curves.grow(run_id)
        head = tr("Grow", "Пора расти") if v.grow else tr("Not yet", "Расти рано")
        return (f"<div><b>{esc(tr('When to grow', 'Когда расти'))} — <span class='lab-grow-run'>{esc(run_id)}</span>: "
                f"{esc(head)}.</b> {esc(v.reason(lang()))}</div>")


class MoreSteps:
    """A finished run continued with more steps ("added data — raise Steps until", as the guide
    says): from its newest checkpoint, every other field as the run had it (the model locked), a
    new Steps until checked against the run's step and its data before anything starts."""

    def __init__(self, on_started):
        self.on_started = on_started
        self.title, self.info = html(), html("lab-more-info")
        self.run = widgets.Dropdown(layout=widgets.Layout(width="26em"), style={"description_width": "initial"})
        self.steps = widgets.IntText(layout=widgets.Layout(width="14em"), style={"description_width": "initial"},
                                     continuous_update=True)
        self.machine = widgets.Dropdown(layout=widgets.Layout(width="16em"), style={"description_width": "initial"})
        for w, cls in ((self.run, "lab-more-run"), (self.steps, "lab-more-steps"), (self.machine, "lab-more-machine")):
            w.add_class(cls)
        self.go = button("lab-more-go", "forward", "success")
        self.go.on_click(lambda _: self.submit())
        self.message, self.done = html("lab-message-more-steps"), html("lab-more-done")
        self.runs: dict = {}
        self._said = None  # what the last Continue started, drawn in the view's language
        self._refreshing = False
        self.run.observe(lambda _: None if self._refreshing else self._picked(), names="value")
        self.steps.observe(lambda _: self.check(), names="value")
        self.box = widgets.VBox([self.title, row([self.run, self.steps, self.machine, self.go]),
                                 self.message, self.info, self.done])

    def refresh(self, runs: list) -> None:
        self.runs = {r.id: r for r in runs if r.status == "done" and r.step > 0}  # RunRows
        self.title.value = (f"<h4 style='margin:8px 0 2px'>{esc(tr('Continue a finished run with more steps', 'Продолжить законченный прогон: больше шагов'))}</h4>")
        self.run.description, self.steps.description = tr("Run", "Прогон"), tr("Steps until", "Шагов до")
        self.machine.description, self.go.description = tr("Machine", "Машина"), tr("Continue", "Продолжить")
        before = self.run.value
        keep = before if before in self.runs else next(iter(self.runs), "")
        self._refreshing = True  # new options pass through other values: not the person's pick
        try:
            self.run.options = [(i, i) for i in self.runs] or [(tr("no finished runs", "законченных прогонов нет"), "")]
            self.run.value = keep
        finally:
            self._refreshing = False
        machines = lab_machines.machine_choices(accounts.names(), tr)
        self.machine.options = machines
        self.machine.value = self.machine.value if self.machine.value in [v for _, v in machines] else "auto"
        self.go.disabled = not self.runs
        if self._said is not None:
            self.done.value = self._said()  # in the view's language, after a switch too
        # A refresh (a run started, the table reloaded) keeps what the person typed for the same run.
        if keep != before or not self.steps.value:
            self._picked()
        else:
            self._info()
            self.check()

    def _picked(self) -> None:
        run = self.runs.get(self.run.value)
        if run is None:
            self.info.value, self.message.value = "", ""
            return
        self.steps.value = run.config.steps_until * 2  # a suggestion: the checks below say what it means
        self._info()
        self.check()

    def _info(self) -> None:
        """Where the picked run goes on from, and with what, in the view's language."""
        run = self.runs.get(self.run.value)
        c = run.config if run is not None else None
        self.info.value = "" if run is None else \
            note(tr(f"From its checkpoint at step {num(run.step)}; the model ({c.layers}×{c.width}, n {c.context}, "
                    f"{c.heads} heads) and every other field as the run had them.",
                    f"С его чекпоинта на шаге {num(run.step)}; модель ({c.layers}×{c.width}, n {c.context}, "
                    f"голов {c.heads}) и остальные поля — как были у прогона."))

    def problems(self) -> list:
        """What is wrong with the new Steps until: not past the run's step, or more steps than
        its data holds tokens for (a warning: it reads the data again)."""
        run = self.runs.get(self.run.value)
        if run is None:
            return []
        sized = lab_runs.preview({"steps_until": int(self.steps.value or 0)}, run.id)  # the run as it would go on
        cfg, est = sized.settled.cfg, sized.estimate
        out = [p for p in est.problems if p.field == "steps_until"]
        if cfg.steps_until <= run.step and not out:
            out.append(Problem("steps_until", f"steps_until {cfg.steps_until:,} is not above the run's step {run.step:,}: "
                                              "raise it", f"«Шагов до» {words.number(cfg.steps_until, 'ru')} не больше "
                                                          f"шага прогона {words.number(run.step, 'ru')}: увеличьте"))
        per_step, have = est.tokens_per_step.value, est.tokens_available.value
        if per_step and have and cfg.steps_until * per_step > have:
            times = cfg.steps_until * per_step / have
            out.append(Problem("steps_until", f"{cfg.steps_until:,} steps read the data {times:.1f} times: add data "
                                              "or take fewer steps", f"{words.number(cfg.steps_until, 'ru')} шагов "
                                              f"прочтут данные {times:.1f} раза: добавьте данных или возьмите меньше "
                                              "шагов".replace(".", ","),
                               "warning"))
        return out

    def check(self) -> bool:
        probs = self.problems()
        errors = [p for p in probs if p.severity == "error"]
        self.message.value = "".join(f"<div>{note(problem_text(p), p.severity)}</div>" for p in probs)
        self.steps.layout.border = f"2px solid {RED}" if errors else None
        self.go.disabled = bool(errors) or not self.runs
        return not errors

    def submit(self) -> None:
        self.done.value, self._said = "", None
        if not self.check():
            return
        try:
            run_id = lab_runs.continue_run(self.run.value, {"steps_until": int(self.steps.value)}, self.machine.value)
        except UserError as e:
            self.message.value = note(error_text(e), "error")
            return
        self._said = lambda: _went_on_words(run_id, self.run.value, self.steps.value)
        self.done.value = self._said()
        self.on_started(run_id)


def _went_on_words(run_id: str, continued: str, steps_until: int) -> str:
    steps = num(steps_until)
    if run_id == continued:
        said = tr(f"Run {run_id} goes on to step {steps}; the monitor shows it.",
                  f"Прогон {run_id} идёт дальше, до шага {steps}; его показывает монитор.")
    else:  # grown from its stable phase: a run of its own from the checkpoint before the decay
        said = tr(f"Run {run_id} grows {continued} from before its decay to step {steps}; the monitor shows it.",
                  f"Прогон {run_id} продолжает {continued} с шага до его спада, до шага {steps}; его "
                  "показывает монитор.")
    return note(said, "ok")
