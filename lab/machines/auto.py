"""The Auto rule (guide: "Machine"), a pure function of the machines' states.

Among free Kaggle accounts (reachable, credentials accepted, fewer GPU sessions running than
Kaggle allows, enough quota for a useful link), first one whose quota covers the whole run (the
calculator's quota hours, start-up included); then one that already holds the data and the
checkpoint; then the most quota left. When none covers the run, the choice says that the run
will be continued elsewhere. This computer is chosen only when picked explicitly, or when the
lab has no Kaggle account at all (the form's "Auto" then still starts something rather than
nothing). A machine the person picked is taken while it can take a link.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from lab.config import RunConfig
from lab.sizing import STARTUP_MIN  # a session's start, data mount and final save, spent from quota

MIN_LINK_MIN = 5.0  # a link shorter than this is not worth starting
FOREIGN = "a session the lab did not start"


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


def takes_link(m: Machine) -> bool:
    """The machine can take a useful link now: free, no error, and on Kaggle quota for more
    than the start-up."""
    enough = m.kind != "kaggle" or (m.quota_left_h or 0) * 60 >= STARTUP_MIN + MIN_LINK_MIN
    return m.free and m.error is None and enough


def usable(m: Machine) -> bool:
    """A Kaggle account that can take a useful link now."""
    return m.kind == "kaggle" and takes_link(m)


def pick(cfg: RunConfig, need_hours: float | None, machines: list[Machine], holds: dict[str, set[str]],
         pinned: str, went_on: bool) -> Choice:
    """The machine for a run's next link: the one the person picked (`pinned`) while it can take
    one; a picked Kaggle account that cannot, once the run has gone on before (`went_on`), gives
    way to the Auto rule, which continues the run elsewhere. `pinned` must be one of `machines`
    or "auto". Pure."""
    if pinned == "auto":
        return choose(cfg, need_hours, machines, holds)
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
    return choose(cfg, need_hours, machines, holds)


def worth_waiting(machines: list[Machine], pinned: str) -> bool:
    """Waiting helps when some machine is only busy or out of quota; not when every Kaggle
    account is broken (this computer, picked or the only machine, is worth waiting for)."""
    kaggle = [m for m in machines if m.kind == "kaggle"]
    if not kaggle or any(m.name == pinned and m.kind == "local" for m in machines):
        return True
    return any(m.error is None for m in kaggle)


def _h(x: float, ru: bool = False) -> str:
    text = f"{x:.1f}"
    return text.replace(".", ",") if ru else text


_HOLDS_EN = {frozenset({"data", "checkpoint"}): "; it already holds the data and the checkpoint",
             frozenset({"data"}): "; it already holds the data", frozenset({"checkpoint"}): "; it already holds the checkpoint"}
_HOLDS_RU = {frozenset({"data", "checkpoint"}): "; на нём уже есть данные и чекпоинт",
             frozenset({"data"}): "; на нём уже есть данные", frozenset({"checkpoint"}): "; на нём уже есть чекпоинт"}
_LOCAL_EN = " This computer runs a run only when you pick it."
_LOCAL_RU = " Этот компьютер берётся, только если выбрать его явно."


def choose(cfg: RunConfig, need_hours: float | None, machines: list[Machine],
           holds: dict[str, set[str]] | None = None) -> Choice:
    """The Auto rule over `machines`; `holds` says which accounts already have the run's data
    and checkpoint ({"alice": {"data", "checkpoint"}}). Pure.

    Among the accounts that can take a useful link: first one whose quota covers the whole run,
    then one that already holds both the data and the checkpoint, then the most quota left."""
    holds = holds or {}
    kaggle = [m for m in machines if m.kind == "kaggle"]
    has_local = any(m.kind == "local" for m in machines)
    if not kaggle:
        return _local_only(machines)
    candidates = [m for m in kaggle if usable(m)]
    if not candidates:
        return nothing_free(kaggle)
    both = frozenset({"data", "checkpoint"})
    has = lambda m: frozenset(holds.get(m.name, set()) & both)  # noqa: E731
    covers = lambda m: need_hours is not None and m.quota_left_h >= need_hours  # noqa: E731
    best = max(candidates, key=lambda m: (covers(m), has(m) == both, m.quota_left_h, m.name))
    local_en, local_ru = (_LOCAL_EN, _LOCAL_RU) if has_local else ("", "")
    if covers(best):
        held = has(best)
        other_en, other_ru = _passed_over(best, candidates, holds, need_hours)
        return Choice(best.name,
                      f"{best.name}: its {_h(best.quota_left_h)} h of GPU quota cover the whole run "
                      f"({_h(need_hours)} h){_HOLDS_EN.get(held, '')}{other_en}.{local_en}",
                      f"{best.name}: его {_h(best.quota_left_h, True)} ч квоты GPU хватит на весь прогон "
                      f"({_h(need_hours, True)} ч){_HOLDS_RU.get(held, '')}{other_ru}.{local_ru}")
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


def _passed_over(best: Machine, candidates: list[Machine], holds: dict[str, set[str]],
                 need_hours: float) -> tuple[str, str]:
    """Why an account that holds more of the link than `best` was not picked, as a clause of the
    reason: its quota does not cover the run (covering comes first), or it holds only part of
    it and `best` has more quota; ("", "") when no account holds more."""
    mine = holds.get(best.name, set()) & {"data", "checkpoint"}
    richer = [m for m in candidates if m.name != best.name and len(holds.get(m.name, set()) & {"data", "checkpoint"})
              > len(mine)]
    if not richer:
        return "", ""
    m = max(richer, key=lambda m: (len(holds.get(m.name, set())), m.quota_left_h))
    what = frozenset(holds.get(m.name, set()) & {"data", "checkpoint"})
    en = {frozenset({"data", "checkpoint"}): "the data and the checkpoint", frozenset({"data"}): "the data",
          frozenset({"checkpoint"}): "the checkpoint"}[what]
    ru = {frozenset({"data", "checkpoint"}): "данные и чекпоинт", frozenset({"data"}): "данные",
          frozenset({"checkpoint"}): "чекпоинт"}[what]
    if m.quota_left_h >= need_hours:  # it holds only part of the link: the most quota decides
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


def nothing_free(kaggle: list[Machine]) -> Choice:
    why_en, why_ru = [], []
    for m in kaggle:
        if m.error:
            why_en.append(f"{m.name}: {m.error}")
            why_ru.append(f"{m.name}: ошибка — {m.error}")
        elif not m.free:
            en = [r if r == FOREIGN else f"{r} (`lab watch {r}` collects it)" for r in m.running]
            ru = [r if r == FOREIGN else f"{r} (его заберёт `lab watch {r}`)" for r in m.running]
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


def _when(iso: str | None) -> str:
    if not iso:
        return "at an unknown time"
    try:
        return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso

