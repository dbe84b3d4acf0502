"""The driver: a run chained from links on whichever machines the Auto rule picks, deciding from each link's
typed outcome (lab.runs.End) alone: it never asks which machine it drives. With no machine free it waits for
the earliest quota refresh, looking again every LAB_DRIVER_POLL_S. Every step is in the run registry, so the
driver may die anywhere: `lab watch RUN` resumes it.
"""
from __future__ import annotations

import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from itertools import takewhile
from typing import Callable, Iterator

from lab.config import RunConfig, UserError
from lab.machines.auto import FOREIGN, Choice, Machine, pick, worth_waiting
from lab.machines.base import Follow, env_seconds
from lab.machines.control import (DriverLock, active_link, active_runs, cancel_flag, cancel_requested, driver_alive,
                                  logged, read_control, set_control)
from lab.machines.lifecycle import age_s
from lab.machines.needs import data_id, finish_hours, measured_on, need_hours, pin_data, slow_links, source_checkpoint
from lab.machines.registry import host_for, host_of, hosts
from lab.runs import REFUSED, End, Link, Outcome, Run, load_run, now, updating
from lab.sizing.calibration import read_predictions, record_prediction
from lab.sizing.speeds import run_info
from lab.sizing.words import format_number

HALTED = ("done", "failed", "stopped", "cancelled")
POLL_ENV = "LAB_DRIVER_POLL_S"  # how often a waiting driver looks again (the person's setting; default 30 s)
POLL_S = 30.0
RECHECK_POLLS = 10  # a waiting driver asks the machines again every 10 polls (5 minutes)
MAX_LOST_IN_A_ROW = 2  # sessions lost one after another with no progress: the run stops and says why
MAX_INPUT_WAITS = 3  # sessions in a row that found their inputs not mounted yet: then the run stops
LOCK_TRIES, LOCK_RETRY_S = 5, 0.1  # a driver tries its lock this often before it leaves the run to another
NOT_WAITING = {"waiting_until": None, "waiting_for": None, "waiting_for_ru": None}


class DriverBusy(UserError):
    """Another process drives the run already."""


def overview(patient: bool = False, only: str | None = None) -> list[Machine]:
    """Every machine of the lab with its state, asked all at once (`only`: that one)."""
    active = active_runs()
    found = hosts(only)
    with ThreadPoolExecutor(max_workers=min(8, len(found)) or 1) as pool:
        return list(pool.map(lambda h: h.state(active.get(h.name, []), patient), found))


def drive(run_id: str, *, say: Callable[[str], None] = print, resume: bool = True, progress: bool = True,
          nproc: int = 0) -> Run:
    """Drives the run until it is done, fails, is cancelled, or stops after a machine's one link per start.
    `resume`: an earlier cancel is forgotten. `nproc`: processes under torchrun here (0: one per GPU)."""
    run_id = load_run(run_id).id
    lock = DriverLock(run_id)
    # `driver_alive` probes with this very lock for an instant: a few tries tell a probe from a driver.
    for _ in range(LOCK_TRIES):
        if lock.acquire():
            break
        time.sleep(LOCK_RETRY_S)
    else:
        raise DriverBusy(f"run {run_id} is already being driven by another process; `lab watch {run_id}` follows it")
    say = logged(run_id, say)
    state = _Driving(env_seconds(POLL_ENV, POLL_S), progress, nproc)
    try:
        if resume:
            cancel_flag(run_id).unlink(missing_ok=True)
        set_control(run_id, pid=os.getpid(), message=None, message_ru=None, **NOT_WAITING)
        with updating(run_id) as r:
            if r.status in HALTED + ("new",):
                r.status = "running"
        try:
            return _drive(run_id, state, say)
        except Exception as e:  # noqa: BLE001 - no run is left "running" by surprise
            return _unexpected(run_id, e, say)
    finally:
        set_control(run_id, pid=None)
        lock.release()


def _unexpected(run_id: str, e: Exception, say: Callable[[str], None]) -> Run:
    """An error the driver did not expect: the run fails, its traceback in its folder."""
    folder = load_run(run_id).folder
    (folder / "failure.txt").write_text("".join(traceback.format_exception(e)), encoding="utf-8")
    return _halt(run_id, "failed", f"run {run_id} stopped on an unexpected {type(e).__name__}: {e} (the traceback "
                                   f"is in {folder / 'failure.txt'}). `lab watch {run_id}` continues it.",
                 f"прогон {run_id} остановился на неожиданной ошибке {type(e).__name__}: {e} (трассировка — в "
                 f"{folder / 'failure.txt'}). `lab watch {run_id}` продолжит его.", say=say)


@dataclass
class _Driving:
    """What one driver remembers between links (the registry holds everything else)."""
    poll_s: float  # between looks while the run waits for a machine
    progress: bool
    nproc: int
    excluded: dict[str, tuple[float, Outcome]] = field(default_factory=dict)  # refused a session: until when, how
    passed_over: dict[str, str] = field(default_factory=dict)  # machines that cannot take this run's link: why
    started: set[int] = field(default_factory=set)  # the links this driver started
    one_link: bool = False  # a machine that runs one link per start ran it
    last_wait: str | None = None

    def exclude(self, machine: str, why: Outcome, seconds: float | None = None) -> None:
        self.excluded[machine] = (time.monotonic() + (RECHECK_POLLS * self.poll_s if seconds is None else seconds), why)


def _drive(run_id: str, state: _Driving, say: Callable[[str], None]) -> Run:
    try:
        pin_data(run_id, say, state.progress)
    except UserError as e:
        return _halt_on(run_id, str(e), e.ru, say)
    while True:
        run = load_run(run_id)
        link = active_link(run)
        halted = _go_on_with(run, link, state, say) if link is not None else _next_step(run, state, say)
        if halted is not None:
            return halted


def _go_on_with(run: Run, link: Link, state: _Driving, say: Callable[[str], None]) -> Run | None:
    how = Follow(say, lambda: cancel_requested(run.id), fresh=link.n in state.started, progress=state.progress,
                 nproc=state.nproc)
    try:
        ended = host_of(link).follow(run, link, how)
    except UserError as e:  # the link could not be taken to an end now: `lab watch RUN` takes it up again
        return _halt_on(run.id, str(e), e.ru, say, _failed_or_cancelled(run.id))
    if ended.outcome is None:
        raise RuntimeError(f"machine '{ended.machine}' ended link {ended.n} without saying how (no outcome)")
    return _after(run.id, ended, state, say)


def _after(run_id: str, ended: Link, state: _Driving, say: Callable[[str], None]) -> Run | None:
    """What the link's outcome means for the run: the halted run, or None to go on."""
    out = ended.outcome
    if out.session:  # the calculator's prediction for the cards the session ran on, where the run has none yet
        run = load_run(run_id)
        info = run_info(str(run.folder))
        if info and info.get("gpu") and info["gpu"] not in read_predictions(run.folder):
            record_prediction(run.folder, run.cfg, gpu=info["gpu"])
    if out.pass_over:  # its service lost the session: another machine takes the next link where one can
        state.exclude(ended.machine, out)
    if out.kind in REFUSED:  # a picked machine too: the lab waits for it and asks again
        # Until the time the machine named (Kaggle's Retry-After), else until a recheck.
        state.exclude(ended.machine, out, -age_s(out.until) if out.until else None)
        again = f" at {datetime.fromisoformat(out.until).astimezone(timezone.utc):%H:%M:%S UTC}" if out.until else ""
        say(f"{out.reason} The lab tries another machine meanwhile and asks {ended.machine} again{again}."
            if load_run(run_id).cfg.machine in ("auto", "", None) else f"{out.reason} The lab waits for it and "
                                                                        f"asks again{again}.")
        return None
    if out.kind is End.UNFIT:  # the machine is marked so: the rule passes it over from now on
        say(f"{out.reason} The lab continues the run on another machine.")
        return None
    if out.kind is End.ELSEWHERE:  # passed over for this run, by this driver (`lab watch` tries it again)
        state.passed_over[ended.machine] = out.reason
        say(f"{out.reason} The lab continues the run on another machine where one can take it.")
        return None
    if out.kind is End.PUSH_AGAIN:
        if len(list(takewhile(lambda kind: kind is End.PUSH_AGAIN, _endings(load_run(run_id))))) < MAX_INPUT_WAITS:
            return None  # the machine waited; the next link pushes again
        return _halt_on(run_id, f"{out.reason}; {MAX_INPUT_WAITS} sessions in a row found their inputs not "
                        "mounted: the lab stops here", f"{out.reason_ru or out.reason}; {MAX_INPUT_WAITS} сессии "
                        "подряд не нашли своих входных данных: лаба останавливается", say)
    if out.kind is End.LOST:
        if _lost_in_a_row(load_run(run_id)) < MAX_LOST_IN_A_ROW:
            say(f"link {ended.n} on {ended.machine} failed; only that session is lost: the run goes on from step "
                f"{load_run(run_id).step}. ({out.reason})")
            return None
        return _halt_on(run_id, out.reason or "the link failed", out.reason_ru or (
            f"{MAX_LOST_IN_A_ROW} сессии подряд потеряны: {out.reason or 'звено упало'}"), say)
    if out.kind is End.FAILED:
        return _halt_on(run_id, out.reason, out.reason_ru, say, _failed_or_cancelled(run_id))
    if out.kind is End.CANCELLED:
        return _halt(run_id, "cancelled", *_cancelled_words(run_id, load_run(run_id).step), say=say)
    if out.kind is End.CONTINUE:
        _pass_over_if_slow(run_id, ended, state, say)
    return None  # CONTINUE, INTERRUPTED: the next link goes on from the run's step


def _pass_over_if_slow(run_id: str, ended: Link, state: _Driving, say: Callable[[str], None]) -> None:
    slow = next((s for s in slow_links(load_run(run_id)) if s.link == ended.n), None)
    if slow is None:
        return
    state.exclude(ended.machine, Outcome(End.BUSY, slow.words(), slow.words(ru=True), session=False))
    say(f"{slow.words()}. The lab passes {ended.machine} over for the next link while another machine can take it.")


def _failed_or_cancelled(run_id: str) -> str:
    return "cancelled" if cancel_requested(run_id) else "failed"


def _endings(run: Run) -> Iterator[End | None]:  # its links' outcomes, the newest first
    return (link.outcome.kind if link.outcome else None for link in reversed(run.links))


def _lost_in_a_row(run: Run) -> int:
    """How many sessions were lost one after another at the run's end (links of other endings between skipped)."""
    kinds = takewhile(lambda kind: kind not in (End.CONTINUE, End.CANCELLED), _endings(run))
    return sum(kind is End.LOST for kind in kinds)


def _next_step(run: Run, state: _Driving, say: Callable[[str], None]) -> Run | None:
    run_id = run.id
    if cancel_requested(run_id):
        return _halt(run_id, "cancelled", *_cancelled_words(run_id, run.step), say=say)
    if run.step >= run.cfg.steps_until:
        return _halt(run_id, "done", f"run {run_id} done: step {run.step:,} of {run.cfg.steps_until:,}",
                     f"прогон {run_id} готов: шаг {_ru(run.step)} из {_ru(run.cfg.steps_until)}", say=say)
    if state.one_link:  # this computer runs one link per start: its limit is the person's time
        return _halt(run_id, "stopped", f"run {run_id} stopped at step {run.step:,} ({run.links[-1].reason}); "
                                        f"`lab watch {run_id}` continues it",
                     f"прогон {run_id} остановлен на шаге {_ru(run.step)} ({run.links[-1].reason}); "
                     f"`lab watch {run_id}` продолжит его", say=say)
    try:
        choice, considered = _next_choice(run, state)
    except UserError as e:
        return _halt_on(run_id, str(e), e.ru, say)
    if choice.machine is None:
        if not worth_waiting(considered, run.cfg.machine or "auto"):
            return _halt(run_id, "failed", _then_watch(choice.reason_en, run_id), choice.reason_ru, say=say)
        if choice.reason_en != state.last_wait:
            say(choice.reason_en)
            state.last_wait = choice.reason_en
        _wait(run_id, choice, state.poll_s)
        return None
    state.last_wait = None
    host = host_for(choice.machine)
    chosen = next(m for m in considered if m.name == choice.machine)
    set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, **NOT_WAITING)
    link = host.start(run, chosen, choice.reason_en)
    with updating(run_id) as r:  # each link says why its machine was picked, in both languages
        r.links[-1].picked = {"en": choice.reason_en, "ru": choice.reason_ru}
    state.started.add(link.n)
    state.one_link = host.one_link_per_start
    limit = f" (limit {link.limit_min:g} min)" if link.limit_min else ""
    # This computer's link is the person's own pick: said once, plainly.
    say(f"link {link.n} on this computer{limit}" if chosen.kind == "local" else
        f"link {link.n} on {chosen.name}{limit}: {choice.reason_en}")
    return None


def _cancelled_words(run_id: str, step: int) -> tuple[str, str]:
    return (f"run {run_id} cancelled at step {step:,}: `lab watch {run_id}` continues it",
            f"прогон {run_id} отменён на шаге {_ru(step)}: `lab watch {run_id}` продолжит его")


def _ru(n: int) -> str:
    return format_number(n, "ru")  # "1 500": the Russian view writes every number so


def _halt_on(run_id: str, en: str, ru: str | None, say: Callable[[str], None], status: str = "failed") -> Run:
    return _halt(run_id, status, _then_watch(en, run_id), _then_watch(ru, run_id, ru=True), say=say)


def _then_watch(message: str | None, run_id: str, ru: bool = False) -> str | None:
    if message is None:
        return None
    message = message.replace("lab watch RUN", f"lab watch {run_id}")
    if "lab watch" in message:
        return message
    return f"{message} Затем `lab watch {run_id}` продолжит прогон." if ru else \
        f"{message} Then `lab watch {run_id}` continues the run."


def _halt(run_id: str, status: str, message: str, message_ru: str | None = None,
          say: Callable[[str], None] | None = None) -> Run:
    with updating(run_id) as r:
        r.status = status
    set_control(run_id, message=message, message_ru=message_ru, **NOT_WAITING)
    (say or logged(run_id, lambda text: None))(message)
    return load_run(run_id)


def _next_choice(run: Run, state: _Driving) -> tuple[Choice, list[Machine]]:
    """The machine for the run's next link, with the machines considered (a picked one is asked alone first)."""
    pinned = run.cfg.machine or "auto"
    # Once a session of the run has run, the rule may continue it elsewhere (a picked account whose
    # quota the run spent); before that, the person's pick stands and the lab waits for it.
    went_on = any(link.outcome is not None and link.outcome.session for link in run.links)
    if pinned != "auto":
        mine = _considered(state, only=pinned)
        if not mine:
            raise UserError(f"the run's machine '{pinned}' is no longer one of the lab's machines: "
                            f"`lab run --resume {run.id} --machine auto` continues it elsewhere")
        choice = pick(run.cfg, need_hours(run), mine, holdings(mine, run.cfg, run), pinned, went_on)
        if choice.machine is not None or not went_on:
            return choice, mine
    machines = _considered(state)
    measured = measured_on(run)  # the plan learns from the run's own sessions (lab.machines.needs)
    return pick(run.cfg, need_hours(run), machines, holdings(machines, run.cfg, run), pinned, went_on,
                finish_hours(run.cfg, run.step, machines, measured, run), measured), machines


def _considered(state: _Driving, only: str | None = None) -> list[Machine]:
    return [_as_left(m, state) for m in overview(patient=True, only=only)]


def _as_left(m: Machine, state: _Driving) -> Machine:
    """A machine as the run's last links left it: passed over for the run (and why), paused until the time
    it asked for, or (refused for its session cap) running sessions the lab did not start, until a recheck."""
    if m.name in state.passed_over:
        return replace(m, free=False, error=f"passed over for this run: {state.passed_over[m.name].rstrip('. ')}")
    until, out = state.excluded.get(m.name, (0.0, None))
    if until <= time.monotonic() or out is None:
        return m
    if out.until:
        return replace(m, free=False, busy_until=max(out.until, m.busy_until or ""))
    return replace(m, free=False, running=m.running + [FOREIGN])


def _wait(run_id: str, choice: Choice, poll_s: float) -> None:
    # The message first: whoever sees the run waiting finds why, and what for.
    en, ru = choice.waits_for or (None, None)
    set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, waiting_until=choice.wait_until,
                waiting_for=en, waiting_for_ru=ru)
    with updating(run_id) as r:
        r.status = "waiting"
    deadline = time.monotonic() + RECHECK_POLLS * poll_s
    if choice.wait_until:
        deadline = min(deadline, time.monotonic() + max(-age_s(choice.wait_until), 0.0) + poll_s)
    while time.monotonic() < deadline and not cancel_requested(run_id):
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def holdings(machines: list[Machine], cfg: RunConfig, run: Run | None = None) -> dict[str, set[str]]:
    """What each machine already holds of the next link, from the lab's own records (the form asks it too)."""
    if not machines:
        return {}
    source = source_checkpoint(run) if run is not None else None
    found_id = data_id(cfg)
    known = {h.name: h for h in hosts()}
    return {m.name: known[m.name].holds(found_id, source["sha256"] if source else None, run.id if run else "")
            if m.name in known else set() for m in machines}


def cancel_loses(run_id: str) -> tuple[str, str] | None:
    """(English, Russian) of what cancelling the run now loses (a session that cannot save first), or None."""
    run = load_run(run_id)
    link = active_link(run)
    return host_of(link).cancel_loses(run, link) if link is not None else None


def cancel(run_id: str) -> str:
    """No further link starts, and the running session stops as its machine can; says what happened."""
    run = load_run(run_id)
    link = active_link(run)
    if link is None and run.status in ("done", "cancelled"):
        return f"run {run.id} is already {run.status}"
    cancel_flag(run.id).write_text(now(), encoding="utf-8")
    alive = driver_alive(run.id)
    if link is None:
        if not alive:
            _halt(run.id, "cancelled", *_cancelled_words(run.id, run.step))
            return f"run {run.id} cancelled at step {run.step}"
        return f"run {run.id}: cancelled; no further link will start"
    pid = read_control(run.id).get("pid") if alive else None
    return host_of(link).cancel(run, link, int(pid) if pid else None)
