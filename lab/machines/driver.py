"""Where runs execute: this computer and the lab's Kaggle accounts, the Auto rule, and runs
that go on in the background.

    overview()                  the machines: each Kaggle account with its quota, and this computer
    choose(cfg, need_hours)     the guide's Auto rule, with its reason in English and Russian
    start(cfg, machine, resume) registers the run and starts `drive` in a background process
    status(run_id)              where a run is: its links, the control side's message, the log tail
    cancel(run_id)              no further link; a local session saves and stops
    drive(run_id)               the continuation loop (`lab watch RUN` runs it)

The Auto rule (guide: "Machine"): among free Kaggle accounts (reachable, credentials accepted,
fewer GPU sessions running than Kaggle allows, enough quota for a useful link), first one
whose quota covers the whole run (the calculator's quota hours, start-up included); then one
that already holds the data and the checkpoint; then the most quota left. When none covers
the run, the choice says that the run will be continued elsewhere. This
computer is chosen only when picked explicitly, or when the lab has no Kaggle account at all
(the form's "Auto" then still starts something rather than nothing).

A run is driven in links (`lab.runs.Link`): on Kaggle, when a link stops before
`steps_until` (its time limit, the account's quota), the next one starts from its checkpoint
on the machine the rule picks; with no machine free the driver waits for the earliest quota
refresh and says so. On this computer a start runs one link (its limit is the person's
time): `lab watch RUN` continues it. Every step is in the run registry, so the driver may die
anywhere: `lab watch RUN` resumes it.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lab.config import MODEL_FIELDS, RunConfig, UserError, card_set, check, check_resume, raise_on_errors
from lab.home import lab_home, runs_dir
from lab.runs import Link, Run, create_run, list_runs, load_run, now, updating

LOCAL = "local"
ACTIVE = ("starting", "running")
HALTED = ("done", "failed", "stopped", "cancelled")
RECHECK_POLLS = 10  # a waiting driver looks at the machines again every 10 polls (5 minutes)
LOCK_TRIES, LOCK_RETRY_S = 5, 0.1  # a driver tries its lock this often before it leaves the run to another
_QUOTA_RETRY = dict(attempts=2, base_s=0.5, cap_s=1.0, max_retry_after_s=5.0)


class DriverBusy(UserError):
    """Another process drives the run already."""


@dataclass
class Machine:
    """One machine as the control notebook shows it. No secret inside."""
    name: str
    kind: str  # "local" | "kaggle"
    gpu: str  # "2xT4" | "T4" | "rtx3050" | "cpu" | another card's name
    quota_left_h: float | None = None
    quota_total_h: float | None = None
    refresh: str | None = None  # the next quota refresh, ISO 8601 UTC
    running: list[str] = field(default_factory=list)  # run ids with a session here now
    free: bool = True  # can start one more session now
    error: str | None = None  # why the account cannot be used (credentials, unreachable)


@dataclass
class Choice:
    """The machine for the next link and why; `continues`: its quota will not cover the whole
    run, so the run will be continued elsewhere; `wait_until`: with no machine, when the
    earliest quota refresh comes (ISO 8601 UTC)."""
    machine: str | None
    reason_en: str
    reason_ru: str
    continues: bool = False
    wait_until: str | None = None


# ---------------------------------------------------------------------------------------------
# The machines


_local_cards: list[str] | None = None


def local_cards() -> list[str]:
    """nvidia-smi's "name, memory" line for each card of this computer, asked once; empty
    without a card. Found without importing torch."""
    global _local_cards
    if _local_cards is None:
        _local_cards = _query_cards()
    return _local_cards


def _query_cards() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def local_gpu() -> str:
    """This computer's card as the sizing calculator names it."""
    cards = local_cards()
    if not cards:
        return "cpu"
    return card_set(cards[0].split(",")[0], len(cards))


def overview(kaggle: bool = True, patient: bool = False) -> list[Machine]:
    """This computer, then every Kaggle account with its quota (asked of Kaggle, all at once).
    `patient`: retry Kaggle as long as a run's driver does, rather than answer a person fast."""
    active = _active_runs()
    busy = active.get(LOCAL, [])
    out = [Machine(LOCAL, "local", local_gpu(), running=busy, free=not busy)]
    if not kaggle:
        return out
    from lab.kaggle import client as kc
    accounts = kc.list_accounts()
    if not accounts:
        return out
    with ThreadPoolExecutor(max_workers=min(8, len(accounts))) as pool:
        out += list(pool.map(lambda a: _kaggle_machine(a, active.get(a.name, []), patient), accounts))
    return out


def _kaggle_machine(account, running: list[str], patient: bool) -> Machine:
    from lab.kaggle import client as kc
    from lab.machines import kaggle as km
    m = Machine(account.name, "kaggle", "2xT4", running=running, free=len(running) < km.MAX_GPU_SESSIONS)
    if account.auth == "broken":
        m.error = f"the credentials of '{account.name}' are damaged: remove and add the account again"
    else:
        try:
            c = km.client(account.name) if patient else \
                kc.client_for(account, retry=kc.RetryPolicy(**_QUOTA_RETRY), timeout_s=20.0)
            q = c.quota()
        except UserError as e:  # one account's trouble does not hide the others
            m.error = f"{e.what}. {e.todo}" if isinstance(e, kc.KaggleError) else str(e)
        except Exception as e:  # noqa: BLE001 - nor does a surprise; its text may hold anything, so not shown
            m.error = f"'{account.name}': unexpected {type(e).__name__} reading the quota"
        else:
            m.quota_left_h, m.quota_total_h = q.left_s / 3600, q.total_s / 3600
            m.refresh = q.refresh_time.isoformat() if q.refresh_time else None
    m.free = m.free and m.error is None
    return m


def usable(m: Machine) -> bool:
    """A Kaggle account that can take a useful link now: free, and quota for more than the start-up."""
    from lab.machines.kaggle import MIN_LINK_MIN, STARTUP_MIN
    return m.kind == "kaggle" and m.free and (m.quota_left_h or 0) * 60 >= STARTUP_MIN + MIN_LINK_MIN


# ---------------------------------------------------------------------------------------------
# The Auto rule


def _h(x: float, ru: bool = False) -> str:
    text = f"{x:.1f}"
    return text.replace(".", ",") if ru else text


_HOLDS_EN = {frozenset({"data", "checkpoint"}): "; it already holds the data and the checkpoint",
             frozenset({"data"}): "; it already holds the data", frozenset({"checkpoint"}): "; it already holds the checkpoint"}
_HOLDS_RU = {frozenset({"data", "checkpoint"}): "; на нём уже есть данные и чекпоинт",
             frozenset({"data"}): "; на нём уже есть данные", frozenset({"checkpoint"}): "; на нём уже есть чекпоинт"}
_LOCAL_EN = " This computer runs a run only when you pick it."
_LOCAL_RU = " Этот компьютер берётся, только если выбрать его явно."


def choose(cfg: RunConfig, need_hours: float | None, machines: list[Machine] | None = None,
           holds: dict[str, set[str]] | None = None) -> Choice:
    """The Auto rule over `machines` (default: `overview()`); `holds` says which accounts already
    have the run's data and checkpoint ({"alice": {"data", "checkpoint"}}). Pure given both.

    Among the accounts that can take a useful link: first one whose quota covers the whole run,
    then one that already holds both the data and the checkpoint, then the most quota left."""
    machines = overview() if machines is None else machines
    holds = holds or {}
    kaggle = [m for m in machines if m.kind == "kaggle"]
    has_local = any(m.kind == "local" for m in machines)
    if not kaggle:
        return _local_only(machines)
    candidates = [m for m in kaggle if usable(m)]
    if not candidates:
        return _nothing_free(kaggle)
    both = frozenset({"data", "checkpoint"})
    has = lambda m: frozenset(holds.get(m.name, set()) & both)  # noqa: E731
    covers = lambda m: need_hours is not None and m.quota_left_h >= need_hours  # noqa: E731
    best = max(candidates, key=lambda m: (covers(m), has(m) == both, m.quota_left_h, m.name))
    local_en, local_ru = (_LOCAL_EN, _LOCAL_RU) if has_local else ("", "")
    if covers(best):
        held = has(best)
        return Choice(best.name,
                      f"{best.name}: its {_h(best.quota_left_h)} h of GPU quota cover the whole run "
                      f"({_h(need_hours)} h){_HOLDS_EN.get(held, '')}.{local_en}",
                      f"{best.name}: его {_h(best.quota_left_h, True)} ч квоты GPU хватит на весь прогон "
                      f"({_h(need_hours, True)} ч){_HOLDS_RU.get(held, '')}.{local_ru}")
    most = max(m.quota_left_h for m in candidates)
    if has(best) == both and best.quota_left_h < most:
        left_en = (f"it already holds the data and the checkpoint, with {_h(best.quota_left_h)} h of quota left "
                   f"(another account has {_h(most)} h)")
        left_ru = (f"на нём уже есть данные и чекпоинт, квоты осталось {_h(best.quota_left_h, True)} ч "
                   f"(у другого аккаунта {_h(most, True)} ч)")
    else:
        left_en = f"it has the most left ({_h(best.quota_left_h)} h)"
        left_ru = f"у него её больше всех ({_h(best.quota_left_h, True)} ч)"
    if need_hours is None:
        en = (f"{best.name}: the run's need is unknown (fix the fields the calculator names); {left_en}. "
              f"If its quota runs out, the lab continues the run from its checkpoint on another free machine.")
        ru = (f"{best.name}: сколько нужно прогону, неизвестно (исправьте поля, которые называет калькулятор); "
              f"{left_ru}. Если квота кончится, лаба продолжит прогон с чекпоинта на другой свободной машине.")
    else:
        en = (f"{best.name}: no free account's quota covers the whole run ({_h(need_hours)} h); {left_en}. "
              f"When it runs out, the lab continues the run from its checkpoint on another free machine.")
        ru = (f"{best.name}: ни у одного свободного аккаунта квоты не хватит на весь прогон "
              f"({_h(need_hours, True)} ч); {left_ru}. Когда она "
              f"кончится, лаба продолжит прогон с чекпоинта на другой свободной машине.")
    return Choice(best.name, en + local_en, ru + local_ru, continues=True)


def _local_only(machines: list[Machine]) -> Choice:
    local = next((m for m in machines if m.kind == "local"), None)
    if local is not None and local.free:
        return Choice(LOCAL, "This computer: the lab has no Kaggle account yet (add one with "
                             "`lab accounts add NAME --kaggle-json PATH`).",
                      "Этот компьютер: в лабе пока нет аккаунтов Kaggle (добавить: "
                      "`lab accounts add ИМЯ --kaggle-json ПУТЬ`).")
    busy = ", ".join(local.running) if local else ""
    return Choice(None, f"No machine is free: the lab has no Kaggle account and this computer runs {busy}. "
                        "The lab waits until it is free.",
                  f"Свободной машины нет: аккаунтов Kaggle в лабе нет, а этот компьютер занят прогоном {busy}. "
                  "Лаба подождёт, пока он освободится.")


def _nothing_free(kaggle: list[Machine]) -> Choice:
    why_en, why_ru = [], []
    for m in kaggle:
        if m.error:
            why_en.append(f"{m.name}: {m.error}")
            why_ru.append(f"{m.name}: ошибка — {m.error}")
        elif not m.free:
            en = [r if r == _FOREIGN else f"{r} (`lab watch {r}` collects it)" for r in m.running]
            ru = [r if r == _FOREIGN else f"{r} (его заберёт `lab watch {r}`)" for r in m.running]
            why_en.append(f"{m.name}: busy with {len(m.running)} GPU session(s): {', '.join(en)}")
            why_ru.append(f"{m.name}: занят, идут сессии GPU ({len(m.running)}): {', '.join(ru)}")
        else:
            refresh = _when(m.refresh)
            why_en.append(f"{m.name}: {_h(m.quota_left_h or 0)} h of quota left, refreshes "
                          f"{'at ' if m.refresh else ''}{refresh}")
            why_ru.append(f"{m.name}: осталось {_h(m.quota_left_h or 0, True)} ч квоты, обновится {refresh}")
    refreshes = sorted(m.refresh for m in kaggle if not m.error and m.free and m.refresh)
    until = refreshes[0] if refreshes else None
    if until:
        tail_en = f" The lab waits for the earliest quota refresh, {_when(until)}, and starts then."
        tail_ru = f" Лаба ждёт ближайшего обновления квоты, {_when(until)}, и тогда начнёт."
    elif any(not m.error for m in kaggle):
        tail_en = " The lab waits until a session ends."
        tail_ru = " Лаба ждёт, пока какая-нибудь сессия закончится."
    else:
        tail_en = " Fix the accounts (see `lab accounts`)."
        tail_ru = " Исправьте аккаунты (см. `lab accounts`)."
    return Choice(None, "No Kaggle account can take the run now (" + "; ".join(why_en) + ")." + tail_en,
                  "Ни один аккаунт Kaggle сейчас не может взять прогон (" + "; ".join(why_ru) + ")." + tail_ru,
                  wait_until=until)


_FOREIGN = "a session the lab did not start"


def _when(iso: str | None) -> str:
    if not iso:
        return "at an unknown time"
    try:
        return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso


# ---------------------------------------------------------------------------------------------
# Registering and starting runs


def start_point(resume: str | None) -> tuple[Run | None, Path | None, dict | None]:
    """(the run being continued or None, the checkpoint, the checkpoint's sidecar) of a resume
    given as a run id, a run folder or a checkpoint file."""
    if not resume:
        return None, None, None
    from lab.kernel.checkpoint import CheckpointError, checkpoint_meta, resolve_checkpoint
    path = Path(resume).expanduser()
    run = None
    if not path.exists():
        run = load_run(resume)
        path = run.folder
    elif (path / "run.json").is_file():
        run = load_run(str(path))
    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    return run, ckpt, checkpoint_meta(ckpt)


def settle_config(cfg: RunConfig, meta: dict | None, given: set[str] | frozenset = frozenset()) -> list:
    """Readies `cfg` (in place) to run from `meta`, the checkpoint's sidecar (None: from scratch),
    and checks it as it will run: a model field `given` now with another value than the
    checkpoint's is an error; then the model fields are the checkpoint's (locked when
    continuing), and every field is checked against that model. Returns the warnings."""
    cfg.resume_from = ""
    if meta is not None:
        raise_on_errors(check_resume(cfg, meta["config"], meta["step"], set(given) & set(MODEL_FIELDS)))
        for name in MODEL_FIELDS:
            setattr(cfg, name, meta["config"][name])
    return raise_on_errors(check(cfg))


def check_machine(machine: str | None) -> str:
    """"auto", "local" or a Kaggle account that answers with these credentials."""
    name = (machine or "auto").strip()
    if name in ("auto", LOCAL):
        return name
    from lab.kaggle import client as kc
    account = kc.get_account(name)  # an unknown name: the error lists the lab's accounts
    kc.check_no_global_token()
    kc.client_for(account, retry=kc.RetryPolicy(**_QUOTA_RETRY), timeout_s=20.0).quota()
    return name


def register_run(cfg: RunConfig, machine: str, cont: Run | None = None, ckpt: Path | None = None,
                 meta: dict | None = None) -> Run:
    """Creates the run (or readies `cont` to be continued) for `machine`; nothing runs yet.
    A person asked to go on, so an earlier cancel is forgotten here, before any driver starts:
    a cancel given after this, even before the driver holds the run, is kept."""
    machine = check_machine(machine)
    cfg = RunConfig.from_dict({**cfg.to_dict(), "resume_from": "", "machine": machine})
    if cont is None:
        parent = None
        if meta:
            owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
            parent = {"run": owner.name if (owner / "run.json").is_file() else None,
                      "checkpoint": str(ckpt), "step": meta["step"]}
        return create_run(cfg, parent=parent)
    if driver_alive(cont.id):
        raise UserError(f"run {cont.id} is running now: wait for it to end, or `lab cancel {cont.id}` first")
    _cancel_flag(cont.id).unlink(missing_ok=True)
    with updating(cont.id) as r:
        r.config = cfg.to_dict()
    return load_run(cont.id)


def start(cfg: RunConfig, machine: str = "auto", resume: str | None = None) -> str:
    """Registers the run and returns its id at once; a background process drives it (and
    outlives the notebook). `resume`: a run id (continued as the same run) or a checkpoint
    (a new run from it; the model fields are the checkpoint's)."""
    cfg = RunConfig.from_dict(cfg.to_dict())
    cont, ckpt, meta = start_point(resume or cfg.resume_from or None)
    settle_config(cfg, meta)
    run = register_run(cfg, machine, cont, ckpt, meta)
    spawn_driver(run.id)
    return run.id


def spawn_driver(run_id: str, resume: bool = False) -> int:
    """`python -m lab.cli.watch RUN --background` in its own session: it survives the notebook."""
    folder = runs_dir() / run_id
    cmd = [sys.executable, "-m", "lab.cli.watch", run_id, "--background"] + (["--resume"] if resume else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LAB_HOME": str(lab_home())}
    with open(folder / "driver.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    _spawned[run_id] = proc
    return proc.pid


_spawned: dict[str, subprocess.Popen] = {}  # kept so finished drivers are reaped, not left as zombies


# ---------------------------------------------------------------------------------------------
# The control side's own state: who drives a run, what it says, a cancel request


def _control_file(run_id: str) -> Path:
    return runs_dir() / run_id / "control.json"


def read_control(run_id: str) -> dict:
    try:
        return json.loads(_control_file(run_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _set_control(run_id: str, **values) -> None:
    path = _control_file(run_id)
    state = {**read_control(run_id), **values, "updated": now()}
    tmp = path.with_name(f".control.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _cancel_flag(run_id: str) -> Path:
    return runs_dir() / run_id / "cancel-requested"


def cancel_requested(run_id: str) -> bool:
    return _cancel_flag(run_id).exists()


class _DriverLock:
    """Held by the one process driving a run; the OS drops it when that process dies, so a
    second `lab watch` knows at once whether to drive or only to follow."""

    def __init__(self, run_id: str):
        self.path = runs_dir() / run_id / ".driver.lock"
        self.file = None

    def acquire(self) -> bool:
        self.file = open(self.path, "a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            self.file.close()
            self.file = None
            return False

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def driver_alive(run_id: str) -> bool:
    lock = _DriverLock(run_id)
    if not lock.path.parent.is_dir():
        return False
    if lock.acquire():
        lock.release()
        return False
    return True


def _active_link(run: Run) -> Link | None:
    return run.links[-1] if run.links and run.links[-1].status in ACTIVE else None


def _active_runs() -> dict[str, list[str]]:
    """Machine -> the runs with a session there now (a local one only while its driver lives)."""
    out: dict[str, list[str]] = {}
    for run in list_runs():
        link = _active_link(run)
        if link is not None and (link.machine != LOCAL or driver_alive(run.id)):
            out.setdefault(link.machine, []).append(run.id)
    return out


def active_runs_on(machine: str) -> list[str]:
    return _active_runs().get(machine, [])


# ---------------------------------------------------------------------------------------------
# The continuation loop


def drive(run_id: str, *, say: Callable[[str], None] = print, resume: bool = True, progress: bool = True,
          nproc: int = 0) -> Run:
    """Drives the run until it is done, fails, is cancelled, or (on this computer) stops at its
    limit. `resume`: a person asked to go on, so an earlier cancel is forgotten. `nproc`:
    processes under torchrun on this computer (0: one per GPU)."""
    run_id = load_run(run_id).id
    lock = _DriverLock(run_id)
    # `driver_alive` probes with this very lock for an instant: a few tries tell a probe from a driver.
    for attempt in range(LOCK_TRIES):
        if lock.acquire():
            break
        if attempt < LOCK_TRIES - 1:
            time.sleep(LOCK_RETRY_S)
    else:
        raise DriverBusy(f"run {run_id} is already being driven by another process; `lab watch {run_id}` follows it")
    say = _logged(run_id, say)
    try:
        if resume:
            _cancel_flag(run_id).unlink(missing_ok=True)
        _set_control(run_id, pid=os.getpid(), message=None, message_ru=None, waiting_until=None)
        with updating(run_id) as r:
            if r.status in HALTED + ("new",):
                r.status = "running"
        return _drive(run_id, say, progress, nproc)
    finally:
        _set_control(run_id, pid=None)
        lock.release()


def _logged(run_id: str, say: Callable[[str], None]) -> Callable[[str], None]:
    """Says it, and keeps it in the run's `control.log` for `status()`."""
    log = runs_dir() / run_id / "control.log"

    def both(text: str) -> None:
        say(text)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
    return both


@dataclass
class _Driving:
    """What one driver remembers between links (the registry holds everything else)."""
    excluded: dict[str, float] = field(default_factory=dict)  # accounts that refused a push, until a recheck
    ran_local: bool = False
    last_wait: str | None = None


def _drive(run_id: str, say: Callable[[str], None], progress: bool, nproc: int) -> Run:
    state = _Driving()
    try:
        _pin_data(run_id, say)
    except UserError as e:
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    while True:
        run = load_run(run_id)
        link = _active_link(run)
        if link is not None:
            halted = _go_on_with(run, link, state, say)
        else:
            halted = _next_step(run, state, say, progress, nproc)
        if halted is not None:
            return halted


def _go_on_with(run: Run, link: Link, state: _Driving, say: Callable[[str], None]) -> Run | None:
    """Takes the run's unfinished link to its end; returns the halted run, or None to go on."""
    from lab.machines import kaggle as km
    run_id = run.id
    if link.machine == LOCAL:
        _abandon_local(run, link, say)
        return None
    try:
        ended = km.run_link(run_id, link.n, lambda: Path(run.cfg.data_dir), say=say,
                            cancelled=lambda: cancel_requested(run_id))
    except km.LinkRefused as e:
        if e.kind in ("busy", "quota"):  # a picked account too: the lab waits for it and asks again
            state.excluded[e.account] = time.monotonic() + RECHECK_POLLS * km.poll_s()
            say(f"{e} The lab tries another machine." if run.cfg.machine in ("auto", "", None)
                else f"{e} The lab waits for it and asks again.")
            return None
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    except UserError as e:
        return _halt(run_id, "cancelled" if cancel_requested(run_id) else "failed", _then_watch(str(e), run_id),
                     say=say)
    if ended.status == "failed":
        return _halt(run_id, "failed", _then_watch(ended.reason or "the link failed", run_id), say=say)
    if ended.status == "cancelled":
        return _halt(run_id, "cancelled", f"run {run_id} cancelled at step {load_run(run_id).step}: "
                                          f"`lab watch {run_id}` continues it", say=say)
    return None


def _next_step(run: Run, state: _Driving, say: Callable[[str], None], progress: bool, nproc: int) -> Run | None:
    """With no link running: stop, wait, or start the next link where the rule says."""
    from lab.machines import kaggle as km
    run_id = run.id
    if cancel_requested(run_id):
        return _halt(run_id, "cancelled", f"run {run_id} cancelled at step {run.step}: "
                                          f"`lab watch {run_id}` continues it", say=say)
    if run.step >= run.cfg.steps_until:
        return _halt(run_id, "done", f"run {run_id} done: step {run.step:,} of {run.cfg.steps_until:,}", say=say)
    if state.ran_local:  # this computer runs one link per start: its limit is the person's time
        return _halt(run_id, "stopped", f"run {run_id} stopped at step {run.step:,} ({run.links[-1].reason}); "
                                        f"`lab watch {run_id}` continues it", say=say)
    try:
        choice, considered = _next_choice(run, state.excluded)
    except UserError as e:
        return _halt(run_id, "failed", _then_watch(str(e), run_id), say=say)
    if choice.machine is None:
        if not _worth_waiting(run, considered):
            return _halt(run_id, "failed", _then_watch(choice.reason_en, run_id), choice.reason_ru, say=say)
        if choice.reason_en != state.last_wait:
            say(choice.reason_en)
            state.last_wait = choice.reason_en
        _wait(run_id, choice)
        return None
    state.last_wait = None
    if choice.machine == LOCAL:
        state.ran_local = True
        try:
            _run_local(run, say, progress, nproc)
        except UserError as e:
            return _halt(run_id, "cancelled" if cancel_requested(run_id) else "failed", str(e), say=say)
        return None
    chosen = next(m for m in considered if m.name == choice.machine)
    planned = km.plan_link(run_id, chosen.name, chosen.quota_left_h * 3600, km.source_checkpoint(run),
                           choice.reason_en)
    _set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, waiting_until=None)
    say(f"link {planned.n} on {chosen.name} (limit {planned.detail['limit_min']:g} min): {choice.reason_en}")
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
    _set_control(run_id, message=message, message_ru=message_ru, waiting_until=None)
    (say or _logged(run_id, lambda text: None))(message)
    return load_run(run_id)


def _next_choice(run: Run, excluded: dict[str, float]) -> tuple[Choice, list[Machine]]:
    """The machine for the run's next link: the one the person picked while it can take it,
    else the Auto rule."""
    pinned = run.cfg.machine or "auto"
    if pinned == LOCAL:
        busy = [r for r in active_runs_on(LOCAL) if r != run.id]
        machines = [Machine(LOCAL, "local", local_gpu(), running=busy, free=not busy)]
        if busy:
            return Choice(None, f"This computer runs {', '.join(busy)}; the lab waits until it is free.",
                          f"Этот компьютер занят прогоном {', '.join(busy)}; лаба ждёт, пока он освободится."), machines
        return Choice(LOCAL, "This computer: you picked it.", "Этот компьютер: вы его выбрали."), machines
    clock = time.monotonic()
    # An account that refused a push for its session limit runs sessions the lab did not start.
    machines = [replace(m, free=False, running=m.running + [_FOREIGN])
                if excluded.get(m.name, 0) > clock else m for m in overview(patient=True)]
    holds = holdings(machines, run.cfg, run)
    need = need_hours(run)
    if pinned != "auto":
        m = next((m for m in machines if m.name == pinned), None)
        if m is not None and usable(m):
            return Choice(pinned, f"{pinned}: you picked it; {_h(m.quota_left_h)} h of quota left.",
                          f"{pinned}: вы его выбрали; осталось {_h(m.quota_left_h, True)} ч квоты."), machines
        if not any(link.status in ("done", "stopped") for link in run.links):
            if m is None:
                raise UserError(f"the run's machine '{pinned}' is no longer one of the lab's accounts: "
                                f"`lab run --resume {run.id} --machine auto` continues it elsewhere")
            return _nothing_free([m]), [m]
    return choose(run.cfg, need, machines, holds), machines


def _worth_waiting(run: Run, machines: list[Machine]) -> bool:
    """Waiting helps when some machine is only busy or out of quota; not when every one is broken."""
    return any(m.error is None for m in machines if m.kind == "kaggle") or run.cfg.machine == LOCAL \
        or not any(m.kind == "kaggle" for m in machines)


def _wait(run_id: str, choice: Choice) -> None:
    """Waits until the earliest quota refresh, or a recheck, whichever is sooner; a cancel ends it."""
    from lab.machines.kaggle import poll_s
    with updating(run_id) as r:
        r.status = "waiting"
    _set_control(run_id, message=choice.reason_en, message_ru=choice.reason_ru, waiting_until=choice.wait_until)
    step = poll_s()
    deadline = time.monotonic() + RECHECK_POLLS * step
    if choice.wait_until:
        left = (datetime.fromisoformat(choice.wait_until) - datetime.now(timezone.utc)).total_seconds()
        deadline = min(deadline, time.monotonic() + max(left, 0.0) + step)
    while time.monotonic() < deadline and not cancel_requested(run_id):
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))


def need_hours(run: Run) -> float | None:
    """GPU quota the rest of the run needs, start-ups included (the calculator's figure)."""
    from lab import sizing
    cfg = run.cfg
    ckpt = {"step": run.step, "config": cfg.to_dict()} if run.step else None
    try:
        return sizing.estimate(cfg, checkpoint=ckpt).hours_to_finish
    except (UserError, ValueError):  # the rule works without it (most quota left)
        return None


def _pin_data(run_id: str, say: Callable[[str], None]) -> None:
    """Every link of a run trains on the same prepared data: found (or prepared) once, then kept
    in the run's config. Text added to a constellation later is a new val set: a new run."""
    run = load_run(run_id)
    if run.cfg.data_dir:
        if not Path(run.cfg.data_dir).is_dir():
            raise UserError(f"run {run_id}: its data folder {run.cfg.data_dir} is gone: prepare it again "
                            f"(lab prepare), or continue with another data folder (lab run --resume {run_id} "
                            f"--data-dir DIR)")
        return
    found = prepared_data(run.cfg.constellations, say)
    with updating(run_id) as r:
        r.config = {**r.config, "data_dir": str(found)}


def prepared_data(constellations: list[str], say: Callable[[str], None], progress: bool = False) -> Path:
    """The data folder prepared for these constellations with their current text: found, or
    prepared now."""
    from lab import corpus
    corpus.get_constellations(constellations)
    found = corpus.find_prepared(constellations)
    if found is None:
        say(f"preparing the data for {'+'.join(constellations)}")
        found = corpus.prepare(constellations, progress=progress)
    return found


def _data_id(cfg: RunConfig) -> str | None:
    """The id of the data the run trains on: its pinned folder, else the one prepared for its
    constellations (as `_pin_data` will find it); None when there is none yet."""
    from lab.corpus.manifests import data_id_of
    try:
        if cfg.data_dir:
            return data_id_of(Path(cfg.data_dir))
        from lab import corpus
        found = corpus.find_prepared(cfg.constellations)
        return data_id_of(found) if found is not None else None
    except (UserError, OSError, ValueError):
        return None


def holdings(machines: list[Machine], cfg: RunConfig, run: Run | None = None) -> dict[str, set[str]]:
    """What each Kaggle account already holds of the next link (the Auto rule's second tier):
    the run's data and, for a run being continued, its checkpoint. The driver and the form's
    preview both ask this, so the preview names the account the driver picks. Reads the lab's
    own records only: no call to Kaggle."""
    from lab.machines import kaggle as km
    if not any(m.kind == "kaggle" for m in machines):
        return {}
    source = km.source_checkpoint(run) if run is not None else None
    data_id = _data_id(cfg)
    return {m.name: km.holds(m.name, data_id, source["sha256"] if source else None, run.id if run else "")
            for m in machines if m.kind == "kaggle"}


def _run_local(run: Run, say: Callable[[str], None], progress: bool, nproc: int) -> Link:
    from lab.kernel.checkpoint import list_checkpoints
    from lab.machines.local import execute_link
    cfg = run.cfg
    data = Path(cfg.data_dir)
    if list_checkpoints(run.folder / "checkpoints"):
        resume = run.folder
    elif run.parent and run.parent.get("checkpoint"):
        resume = Path(run.parent["checkpoint"])
    else:
        resume = None
    _set_control(run_id=run.id, message="running on this computer", message_ru="идёт на этом компьютере",
                 waiting_until=None)
    say(f"link {len(run.links) + 1} on this computer")
    link = execute_link(run, cfg, data, resume, progress=progress, nproc=nproc)
    say(f"run {run.id}: link {link.n} {link.status} at step {link.to_step} ({link.reason})")
    return link


def _abandon_local(run: Run, link: Link, say: Callable[[str], None]) -> None:
    """A local link whose driver died: its session died with it (papermill ran in the driver)."""
    from lab.machines.local import _last_checkpoint_step
    step = _last_checkpoint_step(run.folder)
    with updating(run.id) as r:
        last = r.links[link.n - 1]
        last.status, last.ended = "failed", now()
        last.reason = "the control process stopped while it ran"
        last.to_step = step if step and step > last.from_step else None
    say(f"link {link.n} on this computer: {last.reason}; the run goes on from step {step or 0}")


# ---------------------------------------------------------------------------------------------
# Asking about a run, and cancelling one


def status(run_id: str) -> dict:
    """{"status", "links", "log_tail", ...} of a run, for the control notebook and `lab watch`."""
    for proc in list(_spawned.values()):
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
            "control_tail": _tail(run.folder / "control.log", 12),
            "plot": str(run.folder / "loss.png") if (run.folder / "loss.png").is_file() else None,
            "folder": str(run.folder)}


def _log_tail(run: Run, link: Link | None, lines: int = 25) -> str:
    if link is None:
        return ""
    if link.machine == LOCAL:
        return _tail(run.folder / "driver.log", lines) or _tail(run.folder / "control.log", lines)
    from lab.kaggle.client import log_text
    folder = run.folder / link.detail.get("folder", "")
    slug = (link.detail.get("kernel") or {}).get("slug", "/")
    for path in (folder / f"{slug.split('/')[1]}.log", folder / "live.log"):
        if path.is_file():  # the downloaded log is Kaggle's JSON list of entries
            try:
                return _tail_text(log_text(path.read_text(encoding="utf-8", errors="replace")), lines)
            except OSError:
                return ""
    return ""


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return _tail_text(text, lines)


def _tail_text(text: str, lines: int) -> str:
    """The last lines, with progress bars' carriage returns resolved."""
    out = [line.rsplit("\r", 1)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join([line for line in out if line.strip()][-lines:])


def cancel(run_id: str) -> str:
    """No further link starts; a session on this computer saves a checkpoint and stops; for a
    Kaggle session, says where to stop it (Kaggle's public API cannot). Returns what happened."""
    from lab.machines.kaggle import cancel_hint
    run = load_run(run_id)
    link = _active_link(run)
    if link is None and run.status in ("done", "cancelled"):
        return f"run {run.id} is already {run.status}"
    _cancel_flag(run.id).write_text(now(), encoding="utf-8")
    alive = driver_alive(run.id)
    if link is None:
        if not alive:
            _halt(run.id, "cancelled", f"run {run.id} cancelled at step {run.step}: `lab watch {run.id}` continues it")
            return f"run {run.id} cancelled at step {run.step}"
        return f"run {run.id}: cancelled; no further link will start"
    if link.machine == LOCAL:
        pid = read_control(run.id).get("pid")
        if alive and pid:
            from lab.procs import descendants, signal_quietly
            # To the notebook's kernel (and torchrun's workers), not the driver: the loop's saver
            # catches it, saves a checkpoint and stops cleanly, and the driver records the link.
            for child in descendants(int(pid)):
                signal_quietly(child, signal.SIGINT)
        return f"run {run.id}: the session on this computer saves a checkpoint and stops"
    if not alive:
        spawn_driver(run.id)  # someone must collect what the session saves
    if link.status == "starting" and not (link.detail.get("kernel") or {}).get("pushing"):
        # The driver asks before each upload and before the push: nothing more goes up.
        return f"run {run.id}: cancelled before its push to {link.machine}; no session starts"
    return f"run {run.id}: " + cancel_hint(link.detail.get("kernel") or {"slug": link.machine}, link.machine)
