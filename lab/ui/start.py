"""What Start says under its button, and when: a run is registered (in the background), then
watched until it has really started — its first session runs — or failed before that. Only then
the green ✔ (with where it went) or the red ✖ (with why, in the view's language, the same words
the monitor shows). Meanwhile "getting ready" — until the run waits for a machine: then what it
waits for and until when, as the driver says it (its message and `waiting_until`)."""
from __future__ import annotations

import threading
import time

from lab.config import UserError
from lab.home import runs_dir
from lab.api import runs as lab_runs
from lab.ui.parts import GREY, RED, WAIT
from lab.ui.text import error_text, esc, said, tr, until_words

HALTED = ("done", "failed", "cancelled", "stopped")
WATCH_S = 0.5  # how often a run that was just started is looked at
GIVE_UP_S = 6 * 3600  # a run that prepares data or waits for a machine this long: the monitor tells the rest


class Launch:
    """The line under Start: `phase` is "", "registering", "preparing", "waiting", "started" or "failed"."""

    def __init__(self, where, on_change=None):
        self.where, self.on_change = where, on_change
        self.phase, self.run_id, self.machine, self.message = "", None, None, ""
        self.waits: tuple[str | None, str | None, str | None] = (None, None, None)  # the driver's (en, ru, until)
        self._watching: threading.Thread | None = None
        self._epoch = 0  # a newer Start makes older watches stop

    def registering(self) -> None:
        self._epoch += 1
        self.phase, self.run_id, self.machine, self.message = "registering", None, None, ""
        self.render()

    def failed_to_register(self, error: Exception) -> None:
        self.phase, self.message = "failed", error_text(error)
        self.render()

    def registered(self, run_id: str, links_before: int = 0) -> None:
        """Watches the run until its first new link runs (✔) or it halts before that (✖)."""
        self.phase, self.run_id = "preparing", run_id
        self.render()
        epoch = self._epoch
        self._watching = threading.Thread(target=self._watch, args=(run_id, links_before, epoch), daemon=True)
        self._watching.start()

    def _watch(self, run_id: str, links_before: int, epoch: int) -> None:
        deadline = time.monotonic() + GIVE_UP_S
        while epoch == self._epoch and time.monotonic() < deadline:
            try:
                status = lab_runs.status(run_id)
            except UserError:
                time.sleep(WATCH_S)
                continue
            phase = started(status, links_before)
            if epoch != self._epoch:
                return
            if phase is not None:
                link = status.link
                self.machine = (link.kind, link.machine) if link is not None else None
                self.message = said(status.message, status.message_ru) if phase == "failed" else ""
                self.phase = phase
                self.render()
                if self.on_change:
                    self.on_change(phase)
                return
            self._waiting(status)
            time.sleep(WATCH_S)

    def _waiting(self, status) -> None:
        """While the run waits for a machine, what for and until when; getting ready again once
        the driver looks anew (a machine came free, a refresh came)."""
        if status.status == "waiting":
            self.phase, self.waits = "waiting", (status.message, status.message_ru, status.waiting_until)
            self.render()  # each look: "in 2 h 10 min" counts down
        elif self.phase == "waiting":
            self.phase = "preparing"
            self.render()

    def wait(self, timeout_s: float = 60.0, until: tuple[str, ...] = ("started", "failed")) -> str:
        """Waits until the run's phase is one of `until` (tests and headless runs); the phase."""
        deadline = time.monotonic() + timeout_s
        while (self.phase not in until and self._watching is not None and self._watching.is_alive()
               and time.monotonic() < deadline):
            time.sleep(0.05)
        watch = self._watching
        if self.phase in ("started", "failed") and watch is not None and watch is not threading.current_thread():
            # The watch sets the phase, then renders and calls back, then ends: let it finish.
            watch.join(max(0.0, deadline - time.monotonic()))
        return self.phase

    def render(self) -> None:
        run = f"<b class='lab-run-id'>{esc(self.run_id)}</b>" if self.run_id else ""
        if self.phase == "registering":
            self.where.value = f"<i>{esc(tr('Starting…', 'Запускается…'))}</i>"
        elif self.phase == "preparing":
            self.where.value = (f"<div class='lab-start-pending' style='color:{GREY}'>{WAIT} {esc(tr('Run', 'Прогон'))} {run}: "
                                f"{esc(tr('getting ready (its data, a machine)…', 'готовится (данные, машина)…'))}</div>")
        elif self.phase == "waiting":
            en, ru, until = self.waits
            self.where.value = (f"<div class='lab-start-waiting' style='color:{GREY};line-height:1.4'>{WAIT} "
                                f"{esc(tr('Run', 'Прогон'))} {run} {esc(tr('waits for a machine', 'ждёт машину'))} "
                                f"<b class='lab-start-until'>{esc(until_words(until))}</b><br>"
                                f"<span style='font-size:85%'>{esc(said(en, ru))}</span></div>")
        elif self.phase == "started":
            self.where.value = (f"<div class='lab-start-ok' style='line-height:1.4'>✔ {esc(tr('Run', 'Прогон'))} {run} → "
                                f"{esc(_where(self.machine))}<br><span style='color:{GREY};font-size:85%'>"
                                f"{esc(runs_dir() / self.run_id)}</span></div>")
        elif self.phase == "failed":
            self.where.value = (f"<div class='lab-start-failed' style='color:{RED}'>✖ {esc(tr('Did not start', 'Не запустился'))}"
                                f"{' ' + run if run else ''}: {esc(self.message)}</div>")
        else:
            self.where.value = ""


def started(status, links_before: int = 0) -> str | None:
    """"started" once a link after the first `links_before` runs (or the run is done), "failed"
    when the run halted before that, None while it is still getting ready."""
    new = status.links[links_before:]
    if any(link.status in ("running", "done", "stopped") for link in new) or status.status == "done":
        return "started"
    if status.status in HALTED:
        return "failed"
    return None


def _where(machine: tuple | None) -> str:
    kind, name = machine or (None, None)
    if name == "local":
        return tr("this computer", "этот компьютер")
    if not name:
        return tr("the lab picks the machine", "машину выберет лаба")
    if kind == "kaggle":
        return f"Kaggle: {name}"
    if kind == "slurm":
        return f"{tr('Cluster', 'Кластер')}: {name}"
    return f"{tr('Box', 'Машина')}: {name}" if kind == "ssh" else name
