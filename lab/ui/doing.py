"""What the lab is doing for a run right now, in the view's language: the driver's newest line in
the run's `control.log` (`RunStatus.control_tail`), for the steps a person would otherwise watch
in silence — a session's end, its outputs coming back and merged, the next link's machine, its
uploads and its push — or, where that is newer news, where the running link's session is
(`RunStatus.session`: staging, queued, running, collecting); and the driver's own words beside a
Continue button.

The lines are the control side's own (`lab watch RUN` prints them); a line this module does not
know is not shown: the log tail and the driver's message say the rest.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

from lab.ui.text import tr

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")
_ENDED = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED", "CANCEL_REQUESTED")


# Where a link's session is, in order: a line or a state of a later phase is newer news.
STAGING, QUEUED, RUNNING, COLLECTING, ENDED = range(5)
PHASES = {"staging": STAGING, "queued": QUEUED, "running": RUNNING, "collecting": COLLECTING, "ended": ENDED}


def _session(m: re.Match) -> tuple[str, str, int]:
    n, status = m.group(1), m.group(3)
    if status == "QUEUED":
        return f"link {n}: Kaggle has queued its session", f"звено {n}: сессия в очереди Kaggle", QUEUED
    if status == "RUNNING":
        return f"link {n}: its session runs", f"звено {n}: сессия идёт", RUNNING
    if status in _ENDED:
        return (f"link {n}: its session ended ({status}); its outputs are coming back",
                f"звено {n}: сессия кончилась ({status}); её результаты скачиваются", COLLECTING)
    return f"link {n}: its session reads {status}", f"звено {n}: сессия в состоянии {status}", QUEUED


def _ru(digits: str) -> str:
    return digits.replace(",", "\u00a0")  # "4,500" as Russian writes it, never broken across lines


# (the line's pattern, its words (en, ru) and phase from the match), first match wins.
_LINES = (
    (re.compile(r"^link (\d+): (\S+) ([A-Z_]+)(?:: .*)?$"), _session),
    (re.compile(r"^link (\d+): downloaded (\d+) files into "),
     lambda m: (f"link {m[1]}: its outputs are here ({m[2]} files); merging them into the run",
                f"звено {m[1]}: результаты скачаны (файлов: {m[2]}); лаба добавляет их в прогон", COLLECTING)),
    (re.compile(r"^link (\d+): (done|stopped) at step (\d+) "),
     lambda m: (f"link {m[1]} ended at step {m[3]}; the lab picks the machine for the next link",
                f"звено {m[1]} кончилось на шаге {m[3]}; лаба выбирает машину для следующего звена", ENDED)),
    (re.compile(r"^link (\d+) on this computer"),
     lambda m: (f"link {m[1]} runs on this computer", f"звено {m[1]} идёт на этом компьютере", RUNNING)),
    (re.compile(r"^link (\d+) on (\S+?)(?: \(limit [\d.]+ min\))?: "),
     lambda m: (f"link {m[1]} goes to {m[2]}: its data and checkpoint go up there, then its notebook is pushed",
                f"звено {m[1]} — на {m[2]}: туда загружаются данные и чекпоинт, затем отправляется блокнот", STAGING)),
    (re.compile(r"^(\S+): uploading (\S+) "),
     lambda m: (f"{m[1]}: uploading {m[2]}", f"{m[1]}: загружаю {m[2]}", STAGING)),
    (re.compile(r"^link (\d+): pushed (\S+)"),
     lambda m: (f"link {m[1]}: its notebook is pushed; Kaggle starts its session",
                f"звено {m[1]}: блокнот отправлен; Kaggle запускает сессию", QUEUED)),
    (re.compile(r"^link (\d+): step ([\d,]+)/([\d,]+)"),
     lambda m: (f"link {m[1]}: its session runs (step {m[2]} of {m[3]}, from its log)",
                f"звено {m[1]}: сессия идёт (шаг {_ru(m[2])} из {_ru(m[3])}, по её журналу)", RUNNING)),
)


def now_doing(status, step: int) -> tuple[str, str, float | None] | None:
    """(English, Russian, seconds since it was so where known) for what the lab does for the run
    now: the driver's newest line in its control log (`RunStatus.control_tail`), unless where the
    running link's session is (`RunStatus.session`: its machine's record, or its live curve) is
    newer news: a line that says the session is queued stands no longer once it trains, a line
    about an earlier link no longer once the next one is under way."""
    line = _newest_line(status.control_tail)
    state = _state_words(status, step)
    if state is None:
        return line[:3] if line is not None else None
    if line is not None and (line[4] is None or line[4] == state[4]) and line[3] >= state[3]:
        return line[:3]  # the driver's line says the same phase, or a later one, in more detail
    return state[:3]


def _newest_line(control_tail: str) -> tuple[str, str, float, int, int | None] | None:
    """The driver's newest line, when it is one of the steps above: (en, ru, its age, its phase,
    the number of the link it names, where it names one)."""
    lines = [line for line in (control_tail or "").splitlines() if _STAMP.match(line)]
    if not lines:
        return None
    stamp, text = _STAMP.match(lines[-1]).groups()
    for pattern, words in _LINES:
        m = pattern.search(text)
        if m:
            en, ru, phase = words(m)
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
            return en, ru, _age(at), phase, int(m[1]) if m[1].isdigit() else None
    return None


def _state_words(status, step: int) -> tuple[str, str, float | None, int, int] | None:
    """Where the running link's session is, in words: (en, ru, its age where known, its phase,
    the link's number); None when no link runs or nothing is known of its session."""
    link = status.link
    if link is None or link.status not in ("starting", "running") or status.session not in PHASES:
        return None
    n = link.n
    en_at, ru_at = ("this computer", "этом компьютере") if link.machine == "local" else (link.machine, link.machine)
    words = {"staging": (f"link {n}: its data and checkpoint go up to {en_at}",
                         f"звено {n}: данные и чекпоинт загружаются на {ru_at}"),
             "queued": (f"link {n}: its session waits in {en_at}'s queue", f"звено {n}: сессия в очереди на {ru_at}"),
             "running": (f"link {n}: its session trains (step {step:,})",
                         f"звено {n}: сессия обучает (шаг {_ru(f'{step:,}')})"),
             "collecting": (f"link {n}: its session ended; its outputs are coming back",
                            f"звено {n}: сессия кончилась; её результаты скачиваются"),
             "ended": (f"link {n}: its session ended", f"звено {n}: сессия кончилась")}[status.session]
    at = _parse(status.session_at)
    return words[0], words[1], _age(at) if at else None, PHASES[status.session], n


def _parse(iso: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(iso).astimezone(timezone.utc) if iso else None
    except ValueError:
        return None


def _age(at: datetime) -> float:
    return (datetime.now(timezone.utc) - at).total_seconds()


# The driver's pointers to the command that continues a run (lab.machines.driver): beside the
# monitor's Continue button the button is the way, so they give way to its name.
_WATCH = re.compile(r"(?:\s*[;:,]\s*|\.?\s+)(?:Then |Затем )?`lab watch [^`]*` (?:continues|resumes|продолжит)"
                    r"(?: it| the run| его| прогон)?\.?")


def with_continue_button(message: str) -> str:
    """The driver's message with its "`lab watch RUN` continues it" said as the Continue button."""
    if "`lab watch" not in message:
        return message
    text = _WATCH.sub("", message).rstrip(" .;:")
    return f"{text}. " + tr("Continue below goes on with it.", "Кнопка «Продолжить» продолжит его.")
