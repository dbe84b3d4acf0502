"""Runs: previewed and sized, started, continued, branched, cancelled, followed.

    preview(given, resume, machine)   the run the fields describe, settled as it would be registered
                                      (lab.settle.preview), with the calculator's figures for exactly
                                      that run: the form and `lab size` both call it
    register / start / continue_run / branch   registered (and driven in the background)
    drive(run_id)                     driven here (`lab watch`, `lab run`)
    cancel(run_id)                    no further link; the session saves and stops, or where to stop it
    status(run_id)                    a RunStatus: where the run is, what it waits for, its links
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from lab import sizing
from lab.config import Problem
from lab.kernel.checkpoint import list_checkpoints
from lab.machines import driver
from lab.machines.control import driver_alive, spawn_driver
from lab.machines.live import curve_rows  # noqa: F401 - the monitor's curve: the run's rows, then the live ones
from lab.machines.pace import Slow, slow_links
from lab.machines.registry import host_of
from lab.recipes.branch import DECAY_FRAC, create_branch
from lab.recipes.predict import predicted
from lab.runs import Link, Run, Settled, list_runs, load_run
from lab.settle import preview as settle_preview
from lab.settle import register_run

DriverBusy = driver.DriverBusy


@dataclass(frozen=True)
class Sized:
    """A previewed run and the calculator's figures for it: what Start would register and run."""
    settled: Settled
    estimate: sizing.Estimate

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


def driven(run_id: str) -> bool:
    """Whether a process drives the run now."""
    return driver_alive(run_id)


# ---------------------------------------------------------------------------------------------
# Where a run is


@dataclass(frozen=True)
class RunStatus:
    """Where a run is, for the monitor, Start's line and `lab watch`: its registry state, the
    control side's message (both languages), what it waits for and until when, its links, the end
    of its session's log and the running session's live curve."""
    id: str
    status: str  # new, running, waiting, stopped, done, failed, cancelled
    step: int
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
    """Where the run is now (lab.machines.driver.status), with its slow sessions (lab.machines.pace)."""
    return RunStatus(**driver.status(run_id), slow=slow_links(load_run(run_id)))


def slow_sessions(run: Run) -> list[Slow]:
    """The run's Kaggle sessions that trained far slower than its others (lab.machines.pace)."""
    return slow_links(run)


def session_page(link: Link) -> str | None:
    """Where a person sees (and stops) a link's session by hand: a Kaggle kernel's page."""
    return host_of(link).session_page(link)


def runs() -> list[Run]:
    return list_runs()


def get(run_id: str) -> Run:
    """A run by id, unique prefix or folder."""
    return load_run(run_id)


def checkpoints() -> dict[str, dict]:
    """Every checkpoint of the lab's runs, newest run first: path -> {step, config, path, run}
    (read from the sidecars: the form lists them)."""
    out: dict[str, dict] = {}
    for run in sorted(list_runs(), key=lambda r: (r.created, r.id), reverse=True):
        for pt in reversed(list_checkpoints(run.folder / "checkpoints")):
            info = sizing.checkpoint_info(str(pt))
            if info:
                out[info["path"]] = {**info, "run": run.id}
    return out
