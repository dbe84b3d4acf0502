"""Runs: previewed and sized, started, continued, branched, cancelled, followed.

    preview(given, resume, machine)   the run the fields describe, settled as it would be registered
                                      (lab.settle.preview), with the calculator's figures for exactly
                                      that run: the form and `lab size` both call it
    register / start / continue_run / branch   registered (and driven in the background)
    drive(run_id)                     driven here (`lab watch`, `lab run`)
    cancel(run_id)                    no further link; the session saves and stops, or where to stop it
    status(run_id)                    a RunStatus: where the run is, what it waits for, its links,
                                      where its session is
    rows()                            every run as both faces list it (a RunRow)
    checkpoints(), run_checkpoints    the checkpoints the runs keep
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab import sizing
from lab.config import Problem, RunConfig, UserError
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
from lab.kernel.metrics import METRICS_MARK, read_metrics
from lab.machines import driver
from lab.machines.control import (active_link, cancel_requested, driver_alive, read_control, set_control, spawn_driver,
                                  spawned, tail)
from lab.machines.driver import HALTED
from lab.machines.live import live_curve
from lab.machines.needs import Slow, slow_links
from lab.machines.registry import host_of
from lab.models.bpb import last_val, val_bpb
from lab.recipes.branch import DECAY_FRAC, branch_steps, create_branch
from lab.recipes.predict import predicted
from lab.runs import Link, Run, Settled, lineage, list_runs, load_run
from lab.sizing import Estimate
from lab.sizing.calibration import Check
from lab.sizing.calibration import check as speed_check
from lab.settle import preview as settle_preview
from lab.settle import register_run

DriverBusy = driver.DriverBusy


@dataclass(frozen=True)
class Sized:
    """A previewed run and the calculator's figures for it: what Start would register and run."""
    settled: Settled
    estimate: Estimate

    @property
    def problems(self) -> list[Problem]:
        return self.estimate.problems


def preview(given: dict, resume: str | None = None, machine: str | None = None, *, vocab: int | None = None,
            manifest: dict | None = None, machine_cards: str | None = None) -> Sized:
    """The run the fields `given` describe from `resume` on `machine`, settled as `register_run`
    would record it, and sized: every figure is for that config (a continued run's model and
    every field it was not given are its checkpoint's). `machine_cards`: with gpu "auto", the card
    set of the machine it goes to (this computer's, a box's); None: Kaggle's. Never raises on a
    half-typed field value the form holds: its problem is said at its field."""
    pv = settle_preview(given, resume, machine)
    est = sizing.estimate(pv.cfg, vocab=vocab, manifest=manifest, checkpoint=pv.checkpoint,
                          machine_cards=machine_cards)
    seen = {(p.field, p.en) for p in est.problems}
    est.problems = [p for p in pv.problems if (p.field, p.en) not in seen] + est.problems
    est.predicted_val_loss = predicted(est)
    return Sized(pv.settled, est)


# ---------------------------------------------------------------------------------------------
# Starting, continuing, cancelling


def register(given: dict, resume: str | None = None, machine: str | None = None,
             warn: Callable[[Problem], None] | None = None) -> Run:
    """Registers the run (lab.settle.register_run); nothing runs yet: `drive` or `spawn` it."""
    return register_run(given, resume, machine, warn)


def start(given: dict, resume: str | None = None, machine: str | None = None) -> str:
    """Registers the run the fields describe and drives it in the background; returns its id."""
    run = register_run(given, resume, machine)
    spawn_driver(run.id)  # not resume: a cancel given from now on holds
    return run.id


def continue_run(run_id: str, given: dict | None = None, machine: str | None = None) -> str:
    """The run goes on from its newest checkpoint (`given` on top of its own fields: a higher
    `steps_until` continues a finished run), driven in the background; returns its id."""
    run = register_run(dict(given or {}), run_id, machine)
    spawn_driver(run.id)
    return run.id


def branch(run_id: str, at: int, decay_frac: float = DECAY_FRAC, machine: str | None = None,
           background: bool = True) -> Run:
    """A cooldown branch of the run from its checkpoint at `at`, registered (and driven in the
    background unless `background` is off: `drive` it then)."""
    run = create_branch(run_id, at, decay_frac, machine)
    if background:
        spawn_driver(run.id)
    return run


def branch_points() -> dict[str, list[int]]:
    """Run id -> the steps of its kept checkpoints a cooldown branch can start from (after its
    warmup, before its own decay began: a branch from there on would only repeat it), oldest
    first; newest run first, a run with none left out."""
    found = {r.id: branch_steps(r) for r in _newest_first(list_runs())}
    return {run_id: steps for run_id, steps in found.items() if steps}


def spawn(run_id: str) -> None:
    """Drives the registered run in a background process (`lab run --detach`); a cancel given from
    now on holds."""
    spawn_driver(run_id)


def drive(run_id: str, *, say: Callable[[str], None] = print, progress: bool = True, nproc: int = 0) -> Run:
    """Drives the run here until it is done, fails, is cancelled or stops after this computer's one
    link (`lab watch RUN`, `lab run` without --detach). A person asked, so an earlier cancel is
    forgotten. Raises DriverBusy when another process drives it."""
    return driver.drive(run_id, resume=True, progress=progress, nproc=nproc, say=say)


def cancel(run_id: str) -> str:
    """No further link starts; the running session stops (this computer's and a box's save a
    checkpoint first), or the person is told where to stop it (Kaggle's API cannot). Returns what
    happened."""
    return driver.cancel(run_id)


def newest_image(run_id: str) -> None:
    """The run's next Kaggle links run on Kaggle's newest image (each pins its first link's otherwise)."""
    set_control(run_id, kaggle_image="newest")


def cancel_loses(run_id: str) -> tuple[str, str] | None:
    """(English, Russian) of what a cancel now loses, for the person to confirm (a Kaggle session
    cannot save first: its kernel is deleted); None where the session saves and stops."""
    return driver.cancel_loses(run_id)


def driven(run_id: str) -> bool:
    """Whether a process drives the run now."""
    return driver_alive(run_id)


# ---------------------------------------------------------------------------------------------
# Where a run is


@dataclass(frozen=True)
class RunStatus:
    """Where a run is, for the monitor, Start's line and `lab watch`: its registry state, the
    control side's message (both languages), what it waits for and until when, its links, where
    its newest session is, the end of that session's log and its live curve."""
    id: str
    status: str  # new, running, waiting, stopped, done, failed, cancelled
    step: int  # the newest step the lab knows: the run's, or its running session's live curve's
    steps_until: int
    machine: str | None  # the machine of its newest link
    driver: bool  # a process drives it now
    message: str | None
    message_ru: str | None
    waiting_until: str | None  # ISO 8601 UTC: until when it waits, where something names a time
    waiting_for: str | None  # what it waits for (a quota refresh, the end of Kaggle's pause on an account, ...)
    waiting_for_ru: str | None
    cancel_requested: bool
    links: list[Link]
    session: str | None  # where the running link's session is: "staging", "queued", "running", "collecting"
    session_at: str | None  # since when (ISO 8601 UTC), where its machine recorded it
    log_tail: str
    live: dict | None  # the running session's curve from its log, until its outputs come back
    control_tail: str
    plot: str | None
    folder: str
    slow: list[Slow] = field(default_factory=list)  # its Kaggle sessions far slower than its others

    @property
    def link(self) -> Link | None:
        """The newest link."""
        return self.links[-1] if self.links else None


def status(run_id: str) -> RunStatus:
    """Where the run is now: its record, what its driver said, its running session's live curve
    and log (each machine shows its own: lab.machines.base.Host), its slow sessions."""
    for proc in list(spawned.values()):
        proc.poll()  # reaps finished background drivers
    run = load_run(run_id)
    control, alive = read_control(run.id), driver_alive(run.id)
    current = run.links[-1] if run.links else None
    message, message_ru = _driver_words(run, control, alive)
    live = live_curve(run)
    session, session_at = _session(active_link(run), live)
    return RunStatus(
        run.id, run.status, max([run.step] + [r["step"] for r in (live or {}).get("rows") or []
                                               if isinstance(r.get("step"), int)]),
        run.cfg.steps_until, current.machine if current else None, alive, message, message_ru,
        control.get("waiting_until"), control.get("waiting_for"), control.get("waiting_for_ru"),
        cancel_requested(run.id), list(run.links), session, session_at, _log_tail(run, current), live,
        tail(run.folder / "control.log", 12),
        str(run.folder / "loss.png") if (run.folder / "loss.png").is_file() else None, str(run.folder),
        slow_links(run))


def _driver_words(run: Run, control: dict, alive: bool) -> tuple[str | None, str | None]:
    """The driver's message; for a run no process drives, what to do about it."""
    if run.status in HALTED or alive:
        return control.get("message"), control.get("message_ru")
    if run.status == "new":
        return (f"Run {run.id} has not started: no control process drives it (it may be starting now); "
                f"if this stays, `lab watch {run.id}` starts it.",
                f"Прогон {run.id} ещё не начался: его не ведёт ни один управляющий процесс (возможно, "
                f"он как раз запускается); если так и останется, его запустит `lab watch {run.id}`.")
    return (f"No control process drives run {run.id} now (it was stopped or crashed): "
            f"`lab watch {run.id}` resumes it.",
            f"Прогон {run.id} сейчас не ведёт ни один управляющий процесс (его остановили, или он "
            f"упал): `lab watch {run.id}` продолжит его.")


def _session(link: Link | None, live: dict | None) -> tuple[str | None, str | None]:
    """Where the running link's session is: as its machine recorded it (`Link.state`), else
    "running" once its log shows it training (a curve of its own), else unknown."""
    if link is None:
        return None, None
    if link.state:
        return link.state, link.state_at
    return ("running", None) if (live or {}).get("rows") else (None, None)


# papermill's own progress lines in a session it runs here or on a box ("Executing Cell 3----").
PAPERMILL_PROGRESS = re.compile(r"(Executing|Ending) Cell \d+-*$|Executing notebook with kernel:")
# The training cell's result, shown as a dict at its end ({'step': 3000, ..., 'save_s': 0.007}, on one
# line or pretty-printed over several): the monitor says how the session ended in words of its own.
RESULT_START = re.compile(r"^\{'step': \d+,")


def _log_tail(run: Run, link: Link | None, lines: int = 25) -> str:
    """The session log's last human lines: the metrics lines echoed for the live curve
    (`@lab-metrics {...}`), papermill's progress and the training cell's raw result stay in the
    log and the files, out of the person's view."""
    if link is None:
        return ""
    try:
        text = host_of(link).log_tail(run, link, lines * 8)
    except UserError:  # a machine no longer in the lab: its log is not the lab's to show
        return ""
    human = [line for line in _without_result(text.splitlines())
             if METRICS_MARK not in line and not PAPERMILL_PROGRESS.search(line)]
    return "\n".join(human[-lines:])


def _without_result(lines: list[str]) -> list[str]:
    """The lines without the training cell's result dict (from its "{'step': N," to its closing "}")."""
    out, inside = [], False
    for line in lines:
        inside = inside or bool(RESULT_START.match(line.strip()))
        if not inside:
            out.append(line)
        elif line.rstrip().endswith("}"):
            inside = False
    return out


def session_page(link: Link) -> str | None:
    """Where a person sees (and stops) a link's session by hand: a Kaggle kernel's page."""
    return host_of(link).session_page(link)


def runs() -> list[Run]:
    return list_runs()


def ids() -> list[str]:
    """The lab's runs by id, newest first."""
    return [r.id for r in _newest_first(list_runs())]


def get(run_id: str) -> Run:
    """A run by id, unique prefix or folder."""
    return load_run(run_id)


def _newest_first(found: list[Run]) -> list[Run]:
    return sorted(found, key=lambda r: (r.created, r.id), reverse=True)


@dataclass(frozen=True)
class RunRow:
    """A run as both faces list it (`lab runs`, the notebook's runs panel), built once here."""
    id: str
    status: str
    step: int
    config: RunConfig  # every field as the run trains
    created: str
    loss: float | None  # its newest training loss
    val_loss: float | None  # its newest val loss
    val_bpb: float | None  # that val loss in bits per byte (None: its data is not in this lab home)
    speed: Check | None  # its measured tokens/s beside the calculator's prediction for it
    machines: list[str]  # each link's machine, in order
    lineage: list[str]  # its ancestors' ids, oldest first, then its own
    slow: list[Slow]  # its sessions that spent quota for little
    folder: Path

    @property
    def parent(self) -> str | None:
        return self.lineage[-2] if len(self.lineage) > 1 else None


def rows(newest_first: bool = False) -> list[RunRow]:
    """Every run of the lab as a row, oldest first (or newest)."""
    found = list_runs()
    return [_row(r) for r in (_newest_first(found) if newest_first else found)]


def row(run_id: str) -> RunRow:
    return _row(load_run(run_id))


def _row(r: Run) -> RunRow:
    m = read_metrics(r.folder)
    val = last_val(m)
    return RunRow(r.id, r.status, r.step, r.cfg, r.created, next((x["loss"] for x in reversed(m) if "loss" in x), None),
                  val and val["val_loss"], val_bpb(val, r.cfg), speed_check(r.folder),
                  [link.machine for link in r.links], lineage(r), slow_links(r), r.folder)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def checkpoints() -> dict[str, dict]:
    """Every checkpoint of the lab's runs, newest run first: path -> {step, config, path, run}
    (read from the sidecars: the form lists them)."""
    out: dict[str, dict] = {}
    for run in _newest_first(list_runs()):
        for pt in reversed(list_checkpoints(run.folder / "checkpoints")):
            info = sizing.checkpoint_info(str(pt))
            if info:
                out[info["path"]] = {**info, "run": run.id}
    return out


def checkpoint(target: str) -> dict | None:
    """A checkpoint file, or a run folder's newest, as its sidecar says it: {step, config, path};
    None where there is none."""
    return sizing.checkpoint_info(target)


def run_checkpoints(run_id: str) -> list[tuple[int, Path]]:
    """(step, file) of each checkpoint the run keeps, newest first."""
    return [(checkpoint_step(p), p) for p in reversed(list_checkpoints(load_run(run_id).folder / "checkpoints"))]


def with_checkpoints() -> list[str]:
    """The lab's runs that keep a checkpoint (to sample from), newest first."""
    return [r.id for r in _newest_first(list_runs()) if list_checkpoints(r.folder / "checkpoints")]
