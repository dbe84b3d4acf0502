"""What the lab is doing for a run right now, in the view's language: the driver's newest line in
the run's `control.log` (`RunStatus.control_tail`), for the steps a person would otherwise watch
in silence — a session's end, its outputs coming back and merged, the next link's machine, its
uploads and its push — and the driver's own words beside a Continue button.

The lines are the control side's own (`lab watch RUN` prints them); a line this module does not
know is not shown: the log tail and the driver's message say the rest.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

from lab.ui.text import tr

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")
_ENDED = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED", "CANCEL_REQUESTED")


def _session(m: re.Match) -> tuple[str, str]:
    n, status = m.group(1), m.group(3)
    if status == "QUEUED":
        return f"link {n}: Kaggle has queued its session", f"звено {n}: сессия в очереди Kaggle"
    if status == "RUNNING":
        return f"link {n}: its session runs", f"звено {n}: сессия идёт"
    if status in _ENDED:
        return (f"link {n}: its session ended ({status}); its outputs are coming back",
                f"звено {n}: сессия кончилась ({status}); её результаты скачиваются")
    return f"link {n}: its session reads {status}", f"звено {n}: сессия в состоянии {status}"


# (the line's pattern, its words (en, ru) from the match), first match wins.
_LINES = (
    (re.compile(r"^link (\d+): (\S+) ([A-Z_]+)(?:: .*)?$"), _session),
    (re.compile(r"^link (\d+): downloaded (\d+) files into "),
     lambda m: (f"link {m[1]}: its outputs are here ({m[2]} files); merging them into the run",
                f"звено {m[1]}: результаты скачаны (файлов: {m[2]}); лаба добавляет их в прогон")),
    (re.compile(r"^link (\d+): (done|stopped) at step (\d+) "),
     lambda m: (f"link {m[1]} ended at step {m[3]}; the lab picks the machine for the next link",
                f"звено {m[1]} кончилось на шаге {m[3]}; лаба выбирает машину для следующего звена")),
    (re.compile(r"^link (\d+) on this computer"),
     lambda m: (f"link {m[1]} runs on this computer", f"звено {m[1]} идёт на этом компьютере")),
    (re.compile(r"^link (\d+) on (\S+?)(?: \(limit [\d.]+ min\))?: "),
     lambda m: (f"link {m[1]} goes to {m[2]}: its data and checkpoint go up there, then its notebook is pushed",
                f"звено {m[1]} — на {m[2]}: туда загружаются данные и чекпоинт, затем отправляется блокнот")),
    (re.compile(r"^(\S+): uploading (\S+) "),
     lambda m: (f"{m[1]}: uploading {m[2]}", f"{m[1]}: загружаю {m[2]}")),
    (re.compile(r"^link (\d+): pushed (\S+)"),
     lambda m: (f"link {m[1]}: its notebook is pushed; Kaggle starts its session",
                f"звено {m[1]}: блокнот отправлен; Kaggle запускает сессию")),
    (re.compile(r"^link (\d+): step ([\d,]+)/([\d,]+)"),
     lambda m: (f"link {m[1]}: its session runs (step {m[2]} of {m[3]}, from its log)",
                f"звено {m[1]}: сессия идёт (шаг {m[2].replace(',', ' ')} из {m[3].replace(',', ' ')}, по её журналу)")),
)


def now_doing(control_tail: str) -> tuple[str, str, float] | None:
    """(English, Russian, seconds since it was said) for the driver's newest line, when it is one
    of the steps above; None otherwise."""
    lines = [line for line in (control_tail or "").splitlines() if _STAMP.match(line)]
    if not lines:
        return None
    stamp, text = _STAMP.match(lines[-1]).groups()
    for pattern, words in _LINES:
        m = pattern.search(text)
        if m:
            en, ru = words(m)
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
            return en, ru, (datetime.now(timezone.utc) - at).total_seconds()
    return None


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
