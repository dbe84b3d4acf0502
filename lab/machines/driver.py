"""The driver: runs chained from links, on whichever machines the rule picks.

    overview()                  the machines: this computer, then each Kaggle account with its quota
    choose(cfg, need, machines) the guide's Auto rule (lab.machines.auto), its reason in English and Russian
    status(run_id)              where a run is: its links, the control side's message, the log tail
    cancel(run_id)              no further link; the running session stops, or the person is told how
    drive(run_id)               the continuation loop (`lab watch RUN` runs it)

A run is registered first, its fields settled once (`lab.settle.register_run`); then it is driven
here, in this process, or by a background driver (`lab.machines.control.spawn_driver`).

A run is driven in links (`lab.runs.Link`). Each machine answers for itself through one
interface (lab.machines.base.Host: its state, start a link, follow it to its end, cancel it):
this module never asks which machine it drives. When a link stops before `steps_until` (its
time limit, the account's quota), the next one starts from its checkpoint on the machine the
rule picks; with no machine free the driver waits for the earliest quota refresh and says so.
A machine that runs one link per start (this computer: its limit is the person's time) ends
the drive after it: `lab watch RUN` continues. Every step is in the run registry, so the
driver may die anywhere: `lab watch RUN` resumes it.
"""
from __future__ import annotations

import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable

from lab.config import RunConfig, UserError
from lab.machines.auto import (FOREIGN, Choice, Machine, choose, pick, usable,  # noqa: F401 - re-exported
                               worth_waiting)
from lab.machines.base import Follow, Host, LinkRefused
from lab.machines.control import (DriverLock, active_link, active_runs, cancel_flag, cancel_requested,  # noqa: F401
                                  driver_alive, logged, read_control, set_control, spawn_driver, spawned, tail)
from lab.machines.kaggle_data import KaggleSettings
from lab.machines.live import live_curve
from lab.machines.needs import data_id, need_hours, pin_data
from lab.machines.local import NAME as LOCAL
from lab.machines.local import LocalHost, local_cards, local_gpu  # noqa: F401 - the API
from lab.runs import Run, load_run, now, updating

HALTED = ("done", "failed", "stopped", "cancelled")
RECHECK_POLLS = 10  # a waiting driver looks at the machines again every 10 polls (5 minutes)
MAX_FAILED_IN_A_ROW = 2  # sessions failing one after another with no progress: the run stops and says why
MAX_INPUT_WAITS = 3  # sessions in a row that found their inputs not mounted yet: then the run stops
LOCK_TRIES, LOCK_RETRY_S = 5, 0.1  # a driver tries its lock this often before it leaves the run to another


class DriverBusy(UserError):
    """Another process drives the run already."""


# ---------------------------------------------------------------------------------------------
# The machines


def host_for(name: str, settings: KaggleSettings | None = None,
             events: Callable[[str], None] | None = None) -> Host:
    """The machine called `name` in the lab: this computer, or a Kaggle account (the registry of
    machine kinds; the one place that knows both)."""
    if name == LOCAL:
        return LocalHost()
    from lab.machines.kaggle import KaggleHost
    return KaggleHost(name, settings, events)


def machine_names() -> list[str]:
    """This computer, then the lab's Kaggle accounts by name."""
    from lab.kaggle.accounts import list_accounts
    return [LOCAL] + [a.name for a in list_accounts()]


def overview(kaggle: bool = True, patient: bool = False, settings: KaggleSettings | None = None,
             only: str | None = None) -> list[Machine]:
    """This computer, then every Kaggle account with its quota (asked of Kaggle, all at once).
    `patient`: retry Kaggle as long as a run's driver does, rather than answer a person fast;
    `only`: that one machine."""
    active = active_runs()
    names = machine_names() if kaggle else [LOCAL]
    if only is not None:
        names = [n for n in names if n == only]
    hosts = [host_for(n, settings) for n in names]
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        return list(pool.map(lambda h: h.state(active.get(h.name, []), patient), hosts))


# ---------------------------------------------------------------------------------------------
# The continuation loop


def drive(run_id: str, *, say: Callable[[str], None] = print, resume: bool = True, progress: bool = True,
          nproc: int = 0, settings: KaggleSettings | None = None, events: Callable[[str], None] | None = None) -> Run:
    """Drives the run until it is done, fails, is cancelled, or stops after a machine's one link
    per start. `resume`: a person asked to go on, so an earlier cancel is forgotten. `nproc`:
    processes under torchrun on this computer (0: one per GPU). `settings`: how patient the lab
    is with Kaggle (default: the person's); `events(point)`: told where the control side may die
    before it records what it did."""
    run_id = load_run(run_id).id
    lock = DriverLock(run_id)
    # `driver_alive` probes with this very lock for an instant: a few tries tell a probe from a driver.
    for attempt in range(LOCK_TRIES):
        if lock.acquire():
            break
        if attempt < LOCK_TRIES - 1:
            time.sleep(LOCK_RETRY_S)
    else:
        raise DriverBusy(f"run {run_id} is already being driven by another process; `lab watch {run_id}` follows it")
    say = logged(run_id, say)
    state = _Driving(settings or KaggleSettings.from_env(), events, progress, nproc)
    try:
        if resume:
            cancel_flag(run_id).unlink(missing_ok=True)
        set_control(run_id, pid=os.getpid(), message=None, message_ru=None, waiting_until=None)
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
    """An error the driver did not expect: the run is marked failed, with the reason and the
    traceback in its folder, and `lab watch RUN` continues it."""
    folder = load_run(run_id).folder
    (folder / "failure.txt").write_text("".join(traceback.format_exception(e)), encoding="utf-8")
    return _halt(run_id, "failed", f"run {run_id} stopped on an unexpected {type(e).__name__}: {e} (the traceback "
                                   f"is in {folder / 'failure.txt'}). `lab watch {run_id}` continues it.", say=say)


@dataclass
class _Driving:
    """What one driver remembers between links (the registry holds everything else)."""
    settings: KaggleSettings
    events: Callable[[str], None] | None
    progress: bool
    nproc: int
    excluded: dict[str, float] = field(default_factory=dict)  # machines that refused a session, until a recheck
    started: set[int] = field(default_factory=set)  # the links this driver started
    one_link: bool = False  # a machine that runs one link per start ran it
    last_wait: str | None = None

    def host(self, name: str) -> Host:
        return host_for(name, self.settings, self.events)


def _drive(run_id: str, state: _Driving, say: Callable[[str], None]) -> Run:
    try:
        pin_data(run_id, say, state.progress)
    except UserError as e:
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    while True:
        run = load_run(run_id)
        link = active_link(run)
        if link is not None:
            halted = _go_on_with(run, link, state, say)
        else:
            halted = _next_step(run, state, say)
        if halted is not None:
            return halted


def _go_on_with(run: Run, link, state: _Driving, say: Callable[[str], None]) -> Run | None:
    """Takes the run's unfinished link to its end; returns the halted run, or None to go on."""
    run_id = run.id
    how = Follow(say, lambda: cancel_requested(run_id), fresh=link.n in state.started, progress=state.progress,
                 nproc=state.nproc)
    try:
        ended = state.host(link.machine).follow(run, link, how)
    except LinkRefused as e:
        if e.kind in ("busy", "quota"):  # a picked machine too: the lab waits for it and asks again
            state.excluded[e.machine] = time.monotonic() + RECHECK_POLLS * state.settings.poll_s
            say(f"{e} The lab tries another machine." if run.cfg.machine in ("auto", "", None)
                else f"{e} The lab waits for it and asks again.")
            return None
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    except UserError as e:
        return _halt(run_id, "cancelled" if cancel_requested(run_id) else "failed", _then_watch(str(e), run_id),
                     say=say)
    if ended.status == "failed" and ended.detail.get("input_not_ready"):
        if _in_a_row(load_run(run_id), "input_not_ready") < MAX_INPUT_WAITS:
            return None  # the machine waited; the next link pushes again
        return _halt(run_id, "failed", _then_watch(f"{ended.reason}; {MAX_INPUT_WAITS} sessions in a row found "
                                                   "their inputs not mounted: the lab stops here", run_id), say=say)
    if ended.status == "failed" and not ended.detail.get("abandoned"):
        if _failed_in_a_row(load_run(run_id)) < MAX_FAILED_IN_A_ROW:
            # A session that died, or whose outputs were lost, costs only that session.
            say(f"link {ended.n} on {ended.machine} failed; only that session is lost: the run goes on from step "
                f"{load_run(run_id).step}. ({ended.reason})")
            return None
        return _halt(run_id, "failed", _then_watch(ended.reason or "the link failed", run_id), say=say)
    if ended.status == "cancelled":
        return _halt(run_id, "cancelled", f"run {run_id} cancelled at step {load_run(run_id).step}: "
                                          f"`lab watch {run_id}` continues it", say=say)
    return None


def _failed_in_a_row(run: Run) -> int:
    """How many sessions failed one after another at the run's end. Links that never got a
    session (refused, failed before their push) are passed over, not counted."""
    count = 0
    for link in reversed(run.links):
        if link.status == "failed" and (link.detail.get("refused") or link.detail.get("abandoned")
                                        or link.detail.get("input_not_ready")
                                        or not link.detail.get("session_started")):
            continue
        if link.status != "failed":
            break
        count += 1
    return count


def _in_a_row(run: Run, flag: str) -> int:
    """How many links at the run's end carry `flag` in their detail."""
    count = 0
    for link in reversed(run.links):
        if not link.detail.get(flag):
            break
        count += 1
    return count


def _next_step(run: Run, state: _Driving, say: Callable[[str], None]) -> Run | None:
    """With no link running: stop, wait, or start the next link where the rule says."""
    run_id = run.id
    if cancel_requested(run_id):
        return _halt(run_id, "cancelled", f"run {run_id} cancelled at step {run.step}: "
                                          f"`lab watch {run_id}` continues it", say=say)
    if run.step >= run.cfg.steps_until:
        return _halt(run_id, "done", f"run {run_id} done: step {run.step:,} of {run.cfg.steps_until:,}", say=say)
    if state.one_link:  # this computer runs one link per start: its limit is the person's time
        return _halt(run_id, "stopped", f"run {run_id} stopped at step {run.step:,} ({run.links[-1].reason}); "
                                        f"`lab watch {run_id}` continues it", say=say)
    try:
        choice, considered = _next_choice(run, state)
    except UserError as e:
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    if choice.machine is None:
        if not worth_waiting(considered, run.cfg.machine or "auto"):
            return _halt(run_id, "failed", _then_watch(choice.reason_en, run_id), choice.reason_ru, say=say)
        if choice.reason_en != state.last_wait:
            say(choice.reason_en)
            state.last_wait = choice.reason_en
        _wait(run_id, choice, state.settings.poll_s)
        return None
    state.last_wait = None
    host = state.host(choice.machine)
    chosen = next(m for m in considered if m.name == choice.machine)
    set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, waiting_until=None)
    link = host.start(run, chosen, choice.reason_en)
    state.started.add(link.n)
    state.one_link = host.one_link_per_start
    limit = link.detail.get("limit_min")
    say(f"link {link.n} on {chosen.name}" + (f" (limit {limit:g} min)" if limit else "") + f": {choice.reason_en}")
    return None


def _then_watch(message: str, run_id: str) -> str:
    message = message.replace("lab watch RUN", f"lab watch {run_id}")
    if "lab watch" in message:
        return message
    return f"{message} Then `lab watch {run_id}` continues the run."


def _halt(run_id: str, status: str, message: str, message_ru: str | None = None,
          say: Callable[[str], None] | None = None) -> Run:
    with updating(run_id) as r:
        r.status = status
    set_control(run_id, message=message, message_ru=message_ru, waiting_until=None)
    (say or logged(run_id, lambda text: None))(message)
    return load_run(run_id)


def _next_choice(run: Run, state: _Driving) -> tuple[Choice, list[Machine]]:
    """The machine for the run's next link, with the machines considered. A picked machine is
    asked alone first; the others only when the rule may continue the run elsewhere."""
    pinned = run.cfg.machine or "auto"
    # Once a session of the run has run, the rule may continue it elsewhere (a picked account whose
    # quota the run spent); before that, the person's pick stands and the lab waits for it.
    went_on = any(link.status in ("done", "stopped") or link.detail.get("session_started") for link in run.links)
    if pinned != "auto":
        mine = _considered(state, only=pinned)
        if not mine:
            raise UserError(f"the run's machine '{pinned}' is no longer one of the lab's machines: "
                            f"`lab run --resume {run.id} --machine auto` continues it elsewhere")
        choice = pick(run.cfg, need_hours(run), mine, holdings(mine, run.cfg, run), pinned, went_on)
        if choice.machine is not None or not went_on:
            return choice, mine
    machines = _considered(state)
    return pick(run.cfg, need_hours(run), machines, holdings(machines, run.cfg, run), pinned, went_on), machines


def _considered(state: _Driving, only: str | None = None) -> list[Machine]:
    clock = time.monotonic()
    # A machine that refused a session for its session limit runs sessions the lab did not start.
    return [replace(m, free=False, running=m.running + [FOREIGN]) if state.excluded.get(m.name, 0) > clock else m
            for m in overview(patient=True, settings=state.settings, only=only)]


def _wait(run_id: str, choice: Choice, poll_s: float) -> None:
    """Waits until the earliest quota refresh, or a recheck, whichever is sooner; a cancel ends it."""
    with updating(run_id) as r:
        r.status = "waiting"
    set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, waiting_until=choice.wait_until)
    deadline = time.monotonic() + RECHECK_POLLS * poll_s
    if choice.wait_until:
        left = (datetime.fromisoformat(choice.wait_until) - datetime.now(timezone.utc)).total_seconds()
        deadline = min(deadline, time.monotonic() + max(left, 0.0) + poll_s)
    while time.monotonic() < deadline and not cancel_requested(run_id):
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def holdings(machines: list[Machine], cfg: RunConfig, run: Run | None = None) -> dict[str, set[str]]:
    """What each machine already holds of the next link (the Auto rule's second tier): the run's
    data and, for a run being continued, its checkpoint. The driver and the form's preview both
    ask this, so the preview names the account the driver picks. Reads the lab's own records
    only: no call to Kaggle."""
    from lab.machines.kaggle_data import source_checkpoint
    if not machines:
        return {}
    source = source_checkpoint(run) if run is not None else None
    found_id = data_id(cfg)
    return {m.name: host_for(m.name).holds(found_id, source["sha256"] if source else None, run.id if run else "")
            for m in machines}


# ---------------------------------------------------------------------------------------------
# Asking about a run, and cancelling one


def status(run_id: str) -> dict:
    """{"status", "links", "log_tail", ...} of a run, for the control notebook and `lab watch`."""
    for proc in list(spawned.values()):
        proc.poll()  # reaps finished background drivers
    run = load_run(run_id)
    control = read_control(run.id)
    alive = driver_alive(run.id)
    current = run.links[-1] if run.links else None
    message, message_ru = control.get("message"), control.get("message_ru")
    if run.status not in HALTED and not alive:
        if run.status == "new":
            message = (f"Run {run.id} has not started: no control process drives it (it may be starting now); "
                       f"if this stays, `lab watch {run.id}` starts it.")
            message_ru = (f"Прогон {run.id} ещё не начался: его не ведёт ни один управляющий процесс (возможно, "
                          f"он как раз запускается); если так и останется, его запустит `lab watch {run.id}`.")
        else:
            message = (f"No control process drives run {run.id} now (it was stopped or crashed): "
                       f"`lab watch {run.id}` resumes it.")
            message_ru = (f"Прогон {run.id} сейчас не ведёт ни один управляющий процесс (его остановили, или он "
                          f"упал): `lab watch {run.id}` продолжит его.")
    return {"id": run.id, "status": run.status, "step": run.step, "steps_until": run.cfg.steps_until,
            "machine": current.machine if current else None, "driver": alive,
            "message": message, "message_ru": message_ru,
            "waiting_until": control.get("waiting_until"), "cancel_requested": cancel_requested(run.id),
            "links": [asdict(link) for link in run.links], "log_tail": _log_tail(run, current),
            "live": live_curve(run),  # the running session's curve from its log, until its outputs come
            "control_tail": tail(run.folder / "control.log", 12),
            "plot": str(run.folder / "loss.png") if (run.folder / "loss.png").is_file() else None,
            "folder": str(run.folder)}


def _log_tail(run: Run, link, lines: int = 25) -> str:
    return "" if link is None else host_for(link.machine).log_tail(run, link, lines)


def cancel(run_id: str) -> str:
    """No further link starts; the running session stops (this computer's saves a checkpoint
    first), or the person is told where to stop it (Kaggle's public API cannot). Returns what
    happened."""
    run = load_run(run_id)
    link = active_link(run)
    if link is None and run.status in ("done", "cancelled"):
        return f"run {run.id} is already {run.status}"
    cancel_flag(run.id).write_text(now(), encoding="utf-8")
    alive = driver_alive(run.id)
    if link is None:
        if not alive:
            _halt(run.id, "cancelled", f"run {run.id} cancelled at step {run.step}: `lab watch {run.id}` continues it")
            return f"run {run.id} cancelled at step {run.step}"
        return f"run {run.id}: cancelled; no further link will start"
    pid = read_control(run.id).get("pid") if alive else None
    return host_for(link.machine).cancel(run, link, int(pid) if pid else None)
