"""The Auto rule (guide: "Machine"), a pure function of the machines' states: among the free machines
elsewhere (Kaggle accounts, the lab's boxes and Slurm clusters), first one that covers the whole run (an
account whose quota does, or a box or a cluster, which have no quota), the soonest to finish by the speed
measured on its cards; then one that already holds the data and the checkpoint; then the most quota left.
This computer is chosen only when picked, or when the lab has no other machine at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

from lab.config import RunConfig
from lab.sizing import (
    STARTUP_MIN,  # a session's start, data mount and final save, spent from quota
)

MIN_LINK_MIN = 5.0  # a link shorter than this is not worth starting
FOREIGN = "a session the lab did not start"
ELSEWHERE = ("kaggle", "ssh", "slurm")  # the kinds Auto runs on; this computer only when there is none
OWN = ("ssh", "slurm")  # the lab's own machines: no quota, so each covers a whole run


@dataclass
class Machine:
    """One machine as the control notebook shows it. No secret inside."""
    name: str
    kind: str  # "local" | "kaggle" | "ssh" | "slurm"
    gpu: str  # "2xT4" | "T4" | "rtx3050" | "cpu" | another card set's name ("2xNVIDIA A100-SXM4-80GB")
    quota_left_h: float | None = None  # None: no quota (this computer, a box); on Kaggle what a new session has
    quota_total_h: float | None = None
    refresh: str | None = None  # the next quota refresh, ISO 8601 UTC
    running: list[str] = field(default_factory=list)  # run ids with a session here now
    free: bool = True  # can start one more session now
    error: str | None = None  # why the machine cannot be used (credentials, unreachable, its check)
    # A box's cards as its last check measured them, host by host: {"host", "name", "memory_gb",
    # "capability", "count"}; `checked`: when (ISO 8601 UTC); `hosts`: a group's host count.
    cards: list[dict] = field(default_factory=list)
    checked: str | None = None
    hosts: int = 1
    wait_h: float | None = None  # a Slurm cluster: how long Slurm expects the run's next job to wait in its queue
    quota_used_h: float | None = None  # may pass the total: a running session is not stopped at it
    busy_until: str | None = None  # its service asked for a pause until then (ISO 8601 UTC): not free meanwhile
    has_ever_run: bool | None = None  # Kaggle's quota says the account started a GPU session (None: not asked)


@dataclass
class Choice:
    """The machine for the next link and why."""
    machine: str | None
    reason_en: str
    reason_ru: str
    continues: bool = False  # its quota will not cover the whole run: it will be continued elsewhere
    wait_until: str | None = None  # with no machine: the earliest quota refresh or end of a pause (ISO 8601 UTC)
    waits_for: tuple[str, str] | None = None  # with no machine: what the lab waits for, (English, Russian)


def takes_link(m: Machine) -> bool:
    """The machine can take a useful link now: free, no error, and on Kaggle quota for more than the start-up."""
    enough = m.kind != "kaggle" or (m.quota_left_h or 0) * 60 >= STARTUP_MIN + MIN_LINK_MIN
    return m.free and m.error is None and enough


def pick(cfg: RunConfig, need_hours: float | None, machines: list[Machine], holds: dict[str, set[str]],
         pinned: str, went_on: bool, finish_h: dict[str, float | None] | None = None,
         measured: dict[str, float] | None = None) -> Choice:
    """The machine for a run's next link: the one the person picked (`pinned`) while it can take one; one
    that cannot, once the run has gone on before (`went_on`), gives way to the Auto rule. Pure."""
    if pinned == "auto":
        return choose(cfg, need_hours, machines, holds, finish_h, measured)
    m = next(m for m in machines if m.name == pinned)
    if takes_link(m):
        if m.kind == "local":
            return Choice(m.name, "This computer: you picked it.", "Этот компьютер: вы его выбрали.")
        if m.quota_left_h is None:
            return Choice(m.name, f"{m.name}: you picked it.", f"{m.name}: вы его выбрали.")
        return Choice(m.name, f"{m.name}: you picked it; {_h(m.quota_left_h)} h of quota left.",
                      f"{m.name}: вы его выбрали; осталось {_h(m.quota_left_h, True)} ч квоты.")
    if m.kind == "local":
        busy = ", ".join(m.running)
        return Choice(None, f"This computer runs {busy}; the lab waits until it is free.",
                      f"Этот компьютер занят прогоном {busy}; лаба ждёт, пока он освободится.")
    if not went_on:
        return nothing_free([m])
    return choose(cfg, need_hours, machines, holds, finish_h, measured)


def worth_waiting(machines: list[Machine], pinned: str) -> bool:
    """Waiting helps when some machine is only busy or out of quota, not when every one elsewhere is broken."""
    elsewhere = [m for m in machines if m.kind in ELSEWHERE]
    picked_here = any(m.name == pinned and m.kind == "local" for m in machines)
    return not elsewhere or picked_here or any(m.error is None for m in elsewhere)


def _h(x: float, ru: bool = False) -> str:
    text = f"{x:.1f}"
    return text.replace(".", ",") if ru else text


_BOTH = frozenset({"data", "checkpoint"})
_WHAT = {_BOTH: ("the data and the checkpoint", "данные и чекпоинт"), frozenset({"data"}): ("the data", "данные"),
         frozenset({"checkpoint"}): ("the checkpoint", "чекпоинт")}  # what a machine holds, (English, Russian)
_LOCAL_EN = " This computer runs a run only when you pick it."
_LOCAL_RU = " Этот компьютер берётся, только если выбрать его явно."


def choose(cfg: RunConfig, need_hours: float | None, machines: list[Machine],
           holds: dict[str, set[str]] | None = None, finish_h: dict[str, float | None] | None = None,
           measured: dict[str, float] | None = None) -> Choice:
    """The Auto rule over `machines`; `holds`: which machines have the run's data and checkpoint
    ({"alice": {"data", "checkpoint"}}); `finish_h`: the hours the rest of the run takes on each, by the
    speed measured on its cards; `measured`: the tokens/s the run's own last session on a machine measured
    (there `finish_h` is the hours at that speed, and an account covers the run only if its quota holds them)."""
    holds, finish_h, measured = holds or {}, finish_h or {}, measured or {}
    elsewhere = [m for m in machines if m.kind in ELSEWHERE]
    if not elsewhere:
        return _local_only(machines)
    candidates = [m for m in elsewhere if takes_link(m)]
    if not candidates:
        return nothing_free(elsewhere)
    has = lambda m: frozenset(holds.get(m.name, set()) & _BOTH)  # noqa: E731
    need = lambda m: finish_h[m.name] if m.name in measured and finish_h.get(m.name) is not None \
        else need_hours  # noqa: E731 -- what the run's own sessions there measured, once they have
    covers = lambda m: m.kind in OWN or (need(m) is not None and m.quota_left_h >= need(m))  # noqa: E731
    soon = lambda m: -finish_h[m.name] if covers(m) and finish_h.get(m.name) is not None else -math.inf  # noqa: E731
    best = max(candidates, key=lambda m: (covers(m), soon(m), has(m) == _BOTH, m.quota_left_h or 0.0, m.name))
    local_en, local_ru = (_LOCAL_EN, _LOCAL_RU) if any(m.kind == "local" for m in machines) else ("", "")
    if covers(best):
        rivals = [m for m in candidates if covers(m) and m.name != best.name]
        en, ru = _covering(best, rivals, need(best), finish_h, has(best), _passed_over(best, candidates, has, covers),
                           measured.get(best.name))
        return Choice(best.name, en + local_en, ru + local_ru)
    en, ru = _continued(best, candidates, need_hours, has(best))
    return Choice(best.name, en + local_en, ru + local_ru, continues=True)


def _covering(best: Machine, rivals: list[Machine], need_hours: float | None, finish_h: dict[str, float | None],
              held: frozenset, passed: tuple[str, str], tok_s: float | None = None) -> tuple[str, str]:
    soon_en, soon_ru = _soonest(best, rivals, finish_h)
    holds_en, holds_ru = ((f"; it already holds {_WHAT[held][0]}", f"; на нём уже есть {_WHAT[held][1]}")
                          if held in _WHAT else ("", ""))
    tail_en, tail_ru = f"{soon_en}{holds_en}{passed[0]}.", f"{soon_ru}{holds_ru}{passed[1]}."
    if best.kind in OWN:  # only a cluster has a queue: a box's is ("", "")
        slurm = best.kind == "slurm"
        what_en, what_ru, its = (("one of the lab's Slurm clusters", "кластер Slurm лабы", "его") if slurm
                                 else ("one of the lab's own machines", "своя машина лабы", "её"))
        return (f"{best.name}: {what_en}, with no quota, so it covers the whole run{_queue(best)[0]}{tail_en}",
                f"{best.name}: {what_ru}, без квоты, так что {its} хватит на весь прогон{_queue(best)[1]}{tail_ru}")
    at_en, at_ru = ((f" at the {tok_s:,.0f} tok/s this run's last session there measured",
                     f" при {tok_s:,.0f} ток/с, измеренных последней сессией прогона там".replace(",", "\u00a0"))
                    if tok_s else ("", ""))
    return (f"{best.name}: its {_h(best.quota_left_h)} h of GPU quota cover the whole run "
            f"({_h(need_hours)} h{at_en}){tail_en}",
            f"{best.name}: его {_h(best.quota_left_h, True)} ч квоты GPU хватит на весь прогон "
            f"({_h(need_hours, True)} ч{at_ru}){tail_ru}")


def _queue(m: Machine) -> tuple[str, str]:
    """"; Slurm expects its job to start in about 20 min" for a cluster whose queue says so."""
    if m.wait_h is None:
        return "", ""
    if m.wait_h * 60 < 1:
        return "; Slurm would start its job now", "; Slurm запустит её задачу сразу"
    minutes = m.wait_h * 60
    en = f"{minutes:.0f} min" if minutes < 90 else f"{_h(m.wait_h)} h"
    ru = f"{minutes:.0f} мин" if minutes < 90 else f"{_h(m.wait_h, True)} ч"
    return (f"; Slurm expects its job to start in about {en} (counted in its time)",
            f"; Slurm ожидает начала её задачи примерно через {ru} (это учтено во времени)")


def _soonest(best: Machine, rivals: list[Machine], finish_h: dict[str, float | None]) -> tuple[str, str]:
    """"; it finishes soonest ..." where a box is among the machines that cover the run."""
    hours = finish_h.get(best.name)
    if best.kind not in OWN and (hours is None or not any(m.kind in OWN for m in rivals)):
        return "", ""  # Kaggle accounts alike: their cards are the same
    if hours is None:
        return (f"; its speed is not measured yet (`lab machines check {best.name}`)",
                f"; её скорость ещё не измерена (`lab machines check {best.name}`)")
    others = [(m.name, finish_h[m.name]) for m in rivals if finish_h.get(m.name) is not None]
    en = "; ".join(f"{name} {_h(x)} h" for name, x in others)
    ru = "; ".join(f"{name} {_h(x, True)} ч" for name, x in others)
    return (f"; by the speed measured on its cards it finishes soonest, in about {_h(hours)} h" + (f" ({en})" if en else ""),
            f"; по скорости, измеренной на её картах, она закончит раньше всех, примерно за {_h(hours, True)} ч"
            + (f" ({ru})" if ru else ""))


def _continued(best: Machine, candidates: list[Machine], need_hours: float | None, held: frozenset) -> tuple[str, str]:
    most = max(m.quota_left_h or 0.0 for m in candidates)
    if held == _BOTH and best.quota_left_h < most:
        left_en = (f"it already holds the data and the checkpoint, with {_h(best.quota_left_h)} h of quota left "
                   f"(another account has {_h(most)} h)")
        left_ru = (f"на нём уже есть данные и чекпоинт, квоты осталось {_h(best.quota_left_h, True)} ч "
                   f"(у другого аккаунта {_h(most, True)} ч)")
    else:
        left_en = f"it has the most left ({_h(best.quota_left_h)} h)"
        left_ru = f"у него её больше всех ({_h(best.quota_left_h, True)} ч)"
    if need_hours is None:
        return (f"{best.name}: the run's need is unknown (fix the fields the calculator names); {left_en}. "
                f"If its quota runs out, the lab continues the run from its checkpoint on another free machine.",
                f"{best.name}: сколько нужно прогону, неизвестно (исправьте поля, которые называет калькулятор); "
                f"{left_ru}. Если квота кончится, лаба продолжит прогон с чекпоинта на другой свободной машине.")
    return (f"{best.name}: no free account's quota covers the whole run ({_h(need_hours)} h); {left_en}. "
            f"When it runs out, the lab continues the run from its checkpoint on another free machine.",
            f"{best.name}: ни у одного свободного аккаунта квоты не хватит на весь прогон "
            f"({_h(need_hours, True)} ч); {left_ru}. Когда она "
            f"кончится, лаба продолжит прогон с чекпоинта на другой свободной машине.")


def _passed_over(best: Machine, candidates: list[Machine], has, covers) -> tuple[str, str]:
    """Why a machine that holds more of the link than `best` was not picked, as a clause of the reason
    (covering comes first); ("", "") when none holds more. `has(machine)`, `covers(machine)`: choose's own tests."""
    richer = [m for m in candidates if m.name != best.name and len(has(m)) > len(has(best))]
    if not richer:
        return "", ""
    m = max(richer, key=lambda m: (len(has(m)), m.quota_left_h or 0.0))
    en, ru = _WHAT[has(m)]
    if covers(m) and (m.kind in OWN or best.kind in OWN):  # the soonest to finish decided
        return f"; {m.name} holds {en} but not all of the link", f"; у {m.name} есть {ru}, но не всё для звена"
    if covers(m):  # it holds only part of the link: the most quota decides
        return (f"; {m.name} holds {en} but not all of the link, and {best.name} has more quota left",
                f"; у {m.name} есть {ru}, но не всё для звена, а квоты больше у {best.name}")
    return (f"; {m.name} holds {en}, but its {_h(m.quota_left_h)} h do not cover the run",
            f"; у {m.name} есть {ru}, но его {_h(m.quota_left_h, True)} ч не хватит на весь прогон")


def _local_only(machines: list[Machine]) -> Choice:
    local = next((m for m in machines if m.kind == "local"), None)
    if local is not None and local.free:
        return Choice(local.name, "This computer: the lab has no Kaggle account yet (add one in the control "
                             "notebook's machines cell, or with `lab accounts add NAME --kaggle-json PATH`).",
                      "Этот компьютер: в лабе пока нет аккаунтов Kaggle (добавьте в ячейке «Машины» пульта "
                      "или командой `lab accounts add ИМЯ --kaggle-json ПУТЬ`).")
    busy = ", ".join(local.running) if local else ""
    return Choice(None, f"No machine is free: the lab has no Kaggle account and this computer runs {busy}. "
                        "The lab waits until it is free.",
                  f"Свободной машины нет: аккаунтов Kaggle в лабе нет, а этот компьютер занят прогоном {busy}. "
                  "Лаба подождёт, пока он освободится.")


def _why_not(m: Machine) -> tuple[str, str]:
    if m.error:
        return f"{m.name}: {m.error}", f"{m.name}: ошибка — {m.error}"
    if m.busy_until:
        who = "Kaggle" if m.kind == "kaggle" else "it"
        return (f"{m.name}: {who} asked the lab to wait (busy) until {_when(m.busy_until)}",
                f"{m.name}: {'Kaggle попросил' if m.kind == 'kaggle' else 'машина попросила'} лабу подождать "
                f"(занят{'' if m.kind == 'kaggle' else 'а'}) до {_when(m.busy_until)}")
    if not m.free and m.kind in OWN:
        en = [f"{r} (`lab watch {r}` collects it)" for r in m.running if r != FOREIGN]
        ru = [f"{r} (его заберёт `lab watch {r}`)" for r in m.running if r != FOREIGN]
        if FOREIGN in m.running:
            en.append("work the lab did not start, on its GPUs")
            ru.append("чужая работа на его GPU")
        return f"{m.name}: busy with {', '.join(en)}", f"{m.name}: занят: {', '.join(ru)}"
    if not m.free:
        en = [r if r == FOREIGN else f"{r} (`lab watch {r}` collects it)" for r in m.running]
        ru = [r if r == FOREIGN else f"{r} (его заберёт `lab watch {r}`)" for r in m.running]
        return (f"{m.name}: busy with {len(m.running)} GPU session(s): {', '.join(en)}",
                f"{m.name}: занят, идут сессии GPU ({len(m.running)}): {', '.join(ru)}")
    left = m.quota_left_h or 0.0
    need = STARTUP_MIN + MIN_LINK_MIN
    short_en = short_ru = ""
    if left * 60 < need:  # what it lacks: a link is a session's start and a useful stretch of training
        short_en = (f" ({left * 60:.0f} min); the run's next link needs at least {need:.0f} min ({STARTUP_MIN:.0f} "
                    f"for its session's start, {MIN_LINK_MIN:.0f} of training)")
        short_ru = (f" ({left * 60:.0f} мин); следующему звену прогона нужно не меньше {need:.0f} мин ({STARTUP_MIN:.0f} "
                    f"на запуск сессии, {MIN_LINK_MIN:.0f} на обучение)")
    return (f"{m.name}: {_h(left)} h of quota left{short_en}; it refreshes {'at ' if m.refresh else ''}"
            f"{_when(m.refresh)}",
            f"{m.name}: осталось {_h(left, True)} ч квоты{short_ru}; обновится {_when(m.refresh, ru=True)}")


def nothing_free(elsewhere: list[Machine]) -> Choice:
    """No Kaggle account or box can take the run: why each cannot, and what the lab waits for."""
    why_en, why_ru = zip(*(_why_not(m) for m in elsewhere))
    boxes = any(m.kind in OWN for m in elsewhere)
    head_en, head_ru = (("No machine can take the run now (", "Ни одна машина сейчас не может взять прогон (")
                        if boxes else ("No Kaggle account can take the run now (",
                                       "Ни один аккаунт Kaggle сейчас не может взять прогон ("))
    until, waits = _awaited(elsewhere)
    if waits is not None:
        tail_en, tail_ru = f" The lab waits for {waits[0]}, and starts then.", f" Лаба ждёт {waits[1]}, и тогда начнёт."
    elif any(not m.error for m in elsewhere):
        waits = ("a session to end", "конца какой-нибудь сессии") if not boxes else \
            ("a machine to be free", "пока какая-нибудь машина освободится")
        tail_en = " The lab waits until a session ends." if not boxes else " The lab waits until one is free."
        tail_ru = " Лаба ждёт, пока какая-нибудь сессия закончится." if not boxes else \
            " Лаба ждёт, пока какая-нибудь освободится."
    else:
        tail_en = " Fix the accounts (see `lab accounts`)." if not boxes else " Fix them (see `lab machines`)."
        tail_ru = " Исправьте аккаунты (см. `lab accounts`)." if not boxes else " Исправьте их (см. `lab machines`)."
    return Choice(None, head_en + "; ".join(why_en) + ")." + tail_en, head_ru + "; ".join(why_ru) + ")." + tail_ru,
                  wait_until=until, waits_for=waits)


def _awaited(elsewhere: list[Machine]) -> tuple[str | None, tuple[str, str] | None]:
    """The earliest time something frees a machine, and what it is: a quota refresh, or the end of a pause."""
    found = [(m.refresh, m.name, "refresh") for m in elsewhere if not m.error and m.free and m.refresh]
    found += [(m.busy_until, m.name, "pause") for m in elsewhere if not m.error and m.busy_until]
    if not found:
        return None, None
    until, name, what = min(found)
    if what == "pause":
        kaggle = next(m.kind == "kaggle" for m in elsewhere if m.name == name)
        return until, ((f"the end of Kaggle's pause on {name}, {_when(until)}",
                        f"конца паузы Kaggle на {name}, {_when(until)}") if kaggle else
                       (f"the end of the pause {name} asked for, {_when(until)}",
                        f"конца паузы, о которой попросила {name}, {_when(until)}"))
    return until, (f"the earliest quota refresh, {_when(until)}", f"ближайшего обновления квоты, {_when(until)}")


def _when(iso: str | None, ru: bool = False) -> str:
    if not iso:
        return "в неизвестное время" if ru else "at an unknown time"
    try:
        return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso

