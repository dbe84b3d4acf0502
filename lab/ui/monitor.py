"""The monitor: one run's state, its links (where each went and why), the loss plot and the log's
human lines, refreshed while it runs; Stop and Continue.

Stop is what `lab cancel RUN` does: no further link; a session on this computer, a box or a cluster
saves a checkpoint and stops; one that cannot save first (Kaggle's API cannot ask a session to: its
kernel is deleted) is ended only after the person has read what that loses and said yes. Continue
registers the stopped run to go on from
its checkpoint (`lab.settle.register_run`), as `lab watch RUN` would. The monitor follows the run
the newest New run form started, whichever cell showed that form.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path, PurePosixPath

import ipywidgets as widgets
from IPython.display import HTML, Image, display

from lab.api import curves
from lab.api import runs as lab_runs
from lab.api.runs import RunStatus
from lab.config import UserError
from lab.ui.doing import now_doing, with_continue_button
from lab.ui.parts import GREY, WAIT, button, hear, html, note, png, row, table, tell, x_labels, x_toggle
from lab.ui.text import (Panel, ago, error_text, esc, lang, machine_word, num, on_language, said, status_word,
                         stop_reason, tr, until_words)

LIVE = ("new", "starting", "running", "waiting")
STOPPED = ("stopped", "cancelled", "failed")
HALTED = ("done",) + STOPPED
ACTIVE = ("starting", "running")  # a link whose session is under way
LOG_LINES = 12  # the log tail shown: its newest lines, no scrolling needed

_monitors: list["Monitor"] = []


class Monitor(Panel):
    """Status of each link, the log tail and the loss plot of one run, refreshed while it runs."""

    def __init__(self, form=None, run_id: str | None = None, every_s: float = 3.0):
        for old in _monitors:  # a re-run cell replaces its monitor
            old.close()
        _monitors[:] = [self]
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self.every_s, self.run_id = every_s, run_id
        self.status: RunStatus | None = None
        self._plotted: tuple | None = None
        self._filling = False
        self._seen_status: str | None = None
        self.answer = None  # what Stop or Continue answered: its HTML, drawn in the view's language
        self._loses: tuple[str, str] | None = None  # what a Stop waiting for a yes would lose (English, Russian)
        self._about: tuple | None = None  # what the answer is about: ("stop", link n), ("continue", links before)
        self._went_on = False  # after Continue: the run has gone on since
        self._make_widgets()
        self._fill_picker(run_id)
        hear("started", "Monitor", self.follow)  # any New run form, the one shown now included
        if form is not None and form.run_id and not run_id:
            self.follow(form.run_id)
        on_language(self._relabel)
        self._relabel()
        threading.Thread(target=self._tick, daemon=True).start()

    def _make_widgets(self) -> None:
        self.picker = widgets.Dropdown(layout=widgets.Layout(width="30em"))
        self.refresh_button = button("lab-monitor-refresh", "refresh")
        self.stop_button = button("lab-stop", "stop", "danger")
        self.continue_button = button("lab-continue", "play", "success")
        self.x = x_toggle()
        self.auto = widgets.Checkbox(value=True, indent=False, layout=widgets.Layout(width="auto", min_width="11em"))
        self.state, self.links, self.log = html("lab-monitor-status"), html("lab-monitor-links"), html("lab-log-box")
        self.said = html("lab-monitor-answer")
        self.lose_yes, self.lose_no = button("lab-stop-confirm", "stop", "danger"), button("lab-stop-keep")
        self.lose_words = html("lab-stop-question")
        self.asking = widgets.VBox([self.lose_words, row([self.lose_yes, self.lose_no])])
        self.asking.layout.display = "none"
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))
        self.plot.add_class("lab-monitor-plot")
        self.plot.layout.display = "none"
        top = row([self.picker, self.refresh_button, self.x, self.auto, self.stop_button, self.continue_button])
        self.box = widgets.VBox([top, self.state, self.asking, self.said, self.links, self.plot, self.log])
        self.box.add_class("lab-monitor")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.stop_button.on_click(lambda _: self.stop())
        self.lose_yes.on_click(lambda _: self._cancel(self._loses))
        self.lose_no.on_click(lambda _: self._ask(None))
        self.continue_button.on_click(lambda _: self.go_on())
        self.picker.observe(self._picked, names="value")
        self.x.observe(lambda _: self.refresh(), names="value")

    def close(self) -> None:
        self._stop.set()

    def _relabel(self) -> None:
        if self._stop.is_set():
            return  # a closed monitor (its cell was run again)
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.auto.description = tr("auto refresh", "обновлять сам")
        self.stop_button.description = tr("Stop", "Стоп")
        self.lose_yes.description = tr("Stop, lose it", "Остановить, потерять")
        self.lose_no.description = tr("Keep it running", "Пусть идёт")
        self.continue_button.description = tr("Continue", "Продолжить")
        x_labels(self.x)
        self.refresh()

    def _fill_picker(self, selected: str | None) -> None:
        ids = lab_runs.ids()
        if selected and selected not in ids:
            ids.insert(0, selected)
        self._filling = True
        self.picker.options = [(tr("— no runs yet —", "— прогонов пока нет —"), "")] if not ids else ids
        self.picker.value = selected or (ids[0] if ids else "")
        self._filling = False
        self.run_id = self.picker.value or None

    def _picked(self, change) -> None:
        if not self._filling:
            self.run_id = change["new"] or None
            self._answer(None)
            self._forget_plot()
            self.refresh()

    def follow(self, run_id: str) -> None:
        """Shows this run from now on (a form tells it when Start has registered a run)."""
        if self._stop.is_set():
            return
        with self._lock:
            self._fill_picker(run_id)
            self._answer(None)
            self._forget_plot()
        self.refresh()

    def _forget_plot(self) -> None:
        """Another run is followed: the previous run's plot goes, never shown under its header."""
        self._plotted = None
        self.plot.layout.display = "none"
        self.plot.value = b""

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.auto.value and self.run_id and (self.status.status if self.status else "new") in LIVE:
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - a half-written file: the next tick reads it whole
                    pass

    # -- Stop and Continue ----------------------------------------------------------------

    def stop(self) -> None:
        """What `lab cancel RUN` does. A session that cannot save first (a Kaggle session: its
        kernel is deleted) is stopped only once the person has read what that loses and said yes."""
        if not self.run_id:
            return
        loses = lab_runs.cancel_loses(self.run_id)
        if loses is None:
            self._cancel(None)
        else:
            self._ask(loses)

    def _ask(self, loses: tuple[str, str] | None) -> None:
        """Shows (or, with None, takes away) the question whether to stop and lose `loses`."""
        self._loses = loses
        self.asking.layout.display = None if loses else "none"
        self.refresh()

    def _cancel(self, loses: tuple[str, str] | None) -> None:
        """Cancels the run; what happened is said in the view's language until the session it
        speaks of has ended."""
        self._loses, self.asking.layout.display = None, "none"
        link = _active_link(self.status)
        try:
            lab_runs.cancel(self.run_id)
        except UserError as e:  # drawn again in each language, after `e` is gone from this block
            self._answer(lambda error=e: note(error_text(error), "error"))
        else:
            self._answer(lambda: _stop_words(link, loses), ("stop", link.n if link is not None else None))
        self.refresh()

    def go_on(self) -> None:
        """Continues a stopped run from its checkpoint, in the background."""
        if not self.run_id:
            return
        links = len(self.status.links) if self.status is not None else 0
        try:
            lab_runs.continue_run(self.run_id)
        except UserError as e:  # drawn again in each language, after `e` is gone from this block
            self._answer(lambda error=e: note(error_text(error), "error"))
        else:
            self._answer(lambda: note(tr("Continuing from the checkpoint…", "Продолжаю с чекпоинта…"), "ok"),
                         ("continue", links))
        self._plotted = None
        self.refresh()

    def _answer(self, words, about: tuple | None = None) -> None:
        """What Stop or Continue answered (drawn anew in each language), and what it is about: the
        answer goes once that is over."""
        self.answer, self._about, self._went_on = words, about, False

    def _forget_answer(self) -> None:
        """Stop's answer stands while the session it speaks of runs; Continue's until the run's
        next link runs (or the run has gone on and ended): then the header and the links say the rest."""
        kind, mark = self._about or (None, None)
        st = self.status
        if kind == "stop":
            link = next((x for x in st.links if x.n == mark), None)
            over = st.status in HALTED if link is None else link.status not in ACTIVE
        elif kind == "continue":
            running = st.status in ("running", "waiting")
            over = any(x.n > mark and x.status != "starting" for x in st.links) or (self._went_on and not running)
            self._went_on = self._went_on or running
        else:
            return
        if over:
            self.answer, self._about = None, None

    # -- drawing --------------------------------------------------------------------------

    def refresh(self) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        if not self.run_id:
            self.said.value = self.answer() if self.answer else ""
            self.state.value = f"<i>{esc(tr('Press Start in the form or pick a run.', 'Нажмите «Старт» в форме или выберите прогон.'))}</i>"
            self.stop_button.layout.display = self.continue_button.layout.display = "none"
            return
        try:
            self.status = lab_runs.status(self.run_id)
        except UserError as e:
            self.state.value = note(error_text(e), "error")
            return
        self._forget_answer()
        self.said.value = self.answer() if self.answer else ""
        self.lose_words.value = note(tr(f"{self._loses[0]}. Stop it anyway?", f"{self._loses[1]}. Всё равно "
                                        "остановить?"), "warning") if self._loses else ""
        rows = curves.now(self.run_id, self.status.live or None)
        self._draw(rows)  # the plot first: when the header says a run ended, its curve is the final one
        self._header(rows)
        self.links.value = _links_table(self.status.links)
        tail = "\n".join(end_words(line)
                         for line in (self.status.log_tail or "").splitlines()[-LOG_LINES:])
        self.log.value = (f"<pre class='lab-log' style='overflow-x:auto;white-space:pre-wrap;font-size:80%;background:#f7f7f7;"
                          f"padding:4px'>{esc(tail)}</pre>") if tail else ""
        if self._seen_status not in (None, self.status.status):
            tell("runs")  # the runs cell and the form's checkpoints see it too
        self._seen_status = self.status.status

    def _header(self, rows: list[dict]) -> None:
        """"run: status · step N / M" — N the newest step the monitor has (live or downloaded: the
        curve's), the control side's message under it, what the lab does now."""
        st = self.status.status
        step = max([self.status.step] + [r["step"] for r in rows if isinstance(r.get("step"), int)])
        message = said(self.status.message, self.status.message_ru)
        can_continue = st in STOPPED and self.status.driver is False
        if can_continue:  # the button beside it is the way on, not the command
            message = with_continue_button(message)
        live = self.status.live or {}
        if live.get("note_en"):  # Kaggle keeps this session's log until it ends: no curve moves meanwhile
            message = f"{message} {tr(live['note_en'], live['note_ru'])}".strip()
        waits = (f" <span class='lab-run-until'>{esc(until_words(self.status.waiting_until))}</span>"
                 if st == "waiting" else "")
        waiting_for = said(self.status.waiting_for, self.status.waiting_for_ru) if st == "waiting" else ""
        self.state.value = (f"<b>{esc(self.run_id)}</b>: <span class='lab-run-status'>{esc(status_word(st))}</span>"
                            f"{waits} · {esc(tr('step', 'шаг'))} <span class='lab-run-step'>"
                            f"{num(step)} / {num(self.status.steps_until)}</span>"
                            + (f"<div class='lab-run-waiting'>{esc(tr('Waiting for', 'Ждёт'))} {esc(waiting_for)}</div>"
                               if waiting_for else "")
                            + (f"<div class='lab-run-message'>{esc(message)}</div>" if message else "")
                            + self._doing(st, step) + _slow_words(self.status))
        live_run = st in LIVE and not self.status.cancel_requested
        self.stop_button.layout.display = None if live_run else "none"
        self.continue_button.layout.display = None if can_continue else "none"

    def _doing(self, st: str, step: int) -> str:
        """While the run goes on: what the lab does for it now, and since when (a hand-off between
        links takes a minute or more on Kaggle, and the step stands still meanwhile)."""
        now = now_doing(self.status, step) if st in ("new", "starting", "running") else None
        if now is None:
            return ""
        en, ru, age_s = now
        since = f" <span style='font-size:85%'>({esc(ago(age_s))})</span>" if age_s is not None else ""
        return f"<div class='lab-run-doing' style='color:{GREY};font-size:90%'>{WAIT} {esc(tr(en, ru))}{since}</div>"

    def _draw(self, rows: list[dict]) -> None:
        try:
            st = (Path(self.status.folder) / "metrics.jsonl").stat()
        except OSError:
            st = None
        live = self.status.live or {}  # a session elsewhere: the rows its log showed so far
        key = (st and st.st_mtime_ns, st and st.st_size, len(live.get("rows") or ()), self.x.value, self.run_id,
               lang())
        if key == self._plotted or sum("loss" in r for r in rows) < 2:  # one point draws an empty frame
            if self._plotted is not None and key != self._plotted and (
                    self._plotted[4] != self.run_id or self.status.status not in LIVE):
                self._forget_plot()  # another run's, or a session's whose work was lost when it was ended
            return
        self.plot.value = png({self.run_id: rows}, self.x.value, title=self.run_id)
        self.plot.layout.display = None
        self._plotted = key

    def wait(self, minutes: float) -> None:
        """Blocks until the run ends or `minutes` pass, then shows the final state and plot as
        plain outputs too (a headless run's notebook keeps them)."""
        deadline = time.monotonic() + minutes * 60
        while self.run_id and time.monotonic() < deadline:
            self.refresh()
            if self.status is None or self.status.status not in LIVE:
                break
            time.sleep(1.0)
        self.refresh()
        display(HTML(self.state.value + self.links.value))
        if self.plot.value:
            display(Image(data=bytes(self.plot.value)))


# The training loop's last lines (lab.kernel.train, lab.kernel.session): where the session stopped,
# its checkpoint and its plot, by their paths in the session's own file system (a Kaggle session's
# /kaggle/working/...).
_END = re.compile(r"^stopped at step ([\d,]+) \((.+?)\); checkpoint (\S+)$")
_PLOT = re.compile(r"^plot\s+\S*loss\.png$")


def end_words(line: str) -> str:
    """A session log's line as the monitor shows it: the loop's end lines in the view's language,
    its checkpoint and plot said where they are in the run folder, not where the session kept them."""
    if _PLOT.match(line.strip()):
        return tr("plot: loss.png in the run folder", "график — loss.png в папке прогона")
    m = _END.match(line.strip())
    if not m:
        return line
    step, where = int(m[1].replace(",", "")), f"checkpoints/{PurePosixPath(m[3]).name}"
    return tr(f"stopped at step {num(step)} ({stop_reason(m[2])}); its checkpoint is {where} in the run folder",
              f"остановлен на шаге {num(step)} ({stop_reason(m[2])}); чекпоинт — {where} в папке прогона")


def _active_link(status: RunStatus | None):
    link = status.link if status is not None else None
    return link if link is not None and link.status in ("starting", "running") else None


def _slow_words(status: RunStatus) -> str:
    """A warning for each Kaggle session far slower than the run's others: it spends quota for little."""
    return "".join(f"<div class='lab-run-slow'>{note(s.words(ru=lang() == 'ru'), 'warning')}</div>"
                   for s in status.slow)


def _stop_words(link, loses: tuple[str, str] | None) -> str:
    """What Stop did, in the view's language: no further link; the session saves and stops, or (a
    session that cannot save first) it is ended, and what it trained since the last checkpoint is lost."""
    if link is None:
        return note(tr("Cancelled: no further link will start.", "Отменено: следующее звено не начнётся."), "ok")
    if loses:
        return note(tr("Stopped: no further link will start, and the session was ended without saving; what it "
                       "trained since the run's last checkpoint is lost.",
                       "Остановлено: следующее звено не начнётся, а сессия закончена без сохранения; обученное "
                       "после последнего чекпоинта прогона пропало."), "warning")
    return note(tr("Stopping: no further link will start; the session saves a checkpoint at the next step and stops.",
                   "Останавливаю: следующее звено не начнётся; сессия сохранит чекпоинт на ближайшем шаге и "
                   "остановится."), "ok")


def _links_table(links: list) -> str:
    """Each link: its machine, status, steps, start, why its machine was picked and how it ended."""
    rows = []
    for link in links:
        picked = link.picked or {}
        why = said(picked.get("en"), picked.get("ru"))
        ended = stop_reason(link.reason, link.outcome.reason_ru if link.outcome else None)
        rows.append([esc(link.n), esc(machine_word(link.machine)),
                     esc(status_word(link.status)),
                     esc(f"{num(link.from_step)} → {num(link.to_step) if link.to_step is not None else '…'}"),
                     esc((link.started or "")[:19].replace("T", " ")),
                     f"<span class='lab-link-why'>{esc(why)}</span>", esc(ended)])
    head = [esc(tr(*h)) for h in (("link", "звено"), ("machine", "машина"), ("status", "статус"), ("steps", "шаги"),
                                   ("started", "начато"), ("why there", "почему там"), ("how it ended", "чем кончилось"))]
    return table(head, rows, "lab-monitor-links") if rows else ""
