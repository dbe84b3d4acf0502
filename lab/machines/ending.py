"""How a session ended, decided once for every kind of machine: a pure function of what the lab knows of
it (`Facts`) and one table of endings (`RULES`), the first that applies winning. Each kind reads its
service's words (Kaggle's CANCEL_ACKNOWLEDGED, Slurm's TIMEOUT, a box's runner gone) into a `Said`, and the
outputs are read the same way for every kind, so the same outputs give the same outcome everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from lab.machines.handoff import SessionOutputs
from lab.runs import End, Link, Outcome, now


class Said(str, Enum):
    """How the session's service says it ended, in the lab's words."""
    EXITED = "exited"  # its own process ended (COMPLETE, ERROR, a box's runner exit, Slurm's COMPLETED)
    CUT = "cut"  # its service ended it: a time limit, a preemption, a failed node, Kaggle's cut-off
    CANCELLED = "cancelled"  # stopped because the person cancelled the run
    OTHERS = "others"  # cancelled by someone outside the lab (scancel by hand, the cluster's admins)
    GONE = "gone"  # no word at all: its process died, or its service forgot it
    NEVER = "never"  # it never ran: a queue that will never start it
    DELETED = "deleted"  # the lab ended it: its service had lost it (lab.machines.lifecycle's watchdog)


@dataclass(frozen=True)
class Facts:
    """What the lab knows of one ended session, and what its kind adds."""
    where: str
    said: Said
    out: SessionOutputs
    from_step: int
    words: str = ""  # the service's own: "ERROR: ...", "job 41 reached its time limit (60 min)"
    cancel_asked: bool = False
    own_cause: bool = False  # the service says the run itself ended it: Slurm's OUT_OF_MEMORY
    error: str | None = None  # the session runner's own error, without a result
    signalled_by: str | None = None  # who sends a SIGTERM the lab did not: Kaggle, Slurm before a time limit
    folder: str = ""  # the link's in the run
    hint: str = ""  # what to do, for a failure
    unfit: tuple[str, str] | None = None  # (en, ru) of a session without its cards
    refused: End | None = None  # NEVER: the machine refused the session at its start (its quota), not the run


@dataclass(frozen=True)
class Ending:
    status: str  # what the person sees: done, stopped, failed, cancelled
    outcome: Outcome

    @property
    def reason(self) -> str:
        return self.outcome.reason

    def put(self, link: Link, out: SessionOutputs) -> None:
        """The ending on `link` (being written, in lab.runs.updating), with how far it took the run: its newest
        whole checkpoint past its start, and the step of the result it saved."""
        link.ended, link.status, link.reason, link.outcome = now(), self.status, self.reason, self.outcome
        if out.went_on(link.from_step):
            link.checkpoint, link.to_step = dict(out.checkpoint), out.checkpoint["step"]
        if out.saved and self.status != "failed":
            link.to_step = int(out.result["step"])


def _step(f: Facts) -> int:
    return f.out.checkpoint["step"] if f.out.checkpoint else f.from_step


def _goes_on(f: Facts) -> tuple[str, str]:
    return (f"; the run goes on from its checkpoint at step {_step(f)}",
            f"; прогон продолжится с чекпоинта на шаге {_step(f)}")


def _what(f: Facts) -> str:
    return f.words or f"the session ended ({f.said.value})"


def _inputs(f: Facts) -> tuple[str, str]:
    wrong = ", ".join((f.out.input_not_ready or {}).get("expected") or {}) or "its inputs"
    return (f"{f.where}: the session did not find {wrong} as sent (not yet in place there); it trained nothing, and "
            "the lab sends them again after a wait",
            f"{f.where}: сессия не нашла {wrong} в том виде, в каком их отправили (их там ещё не было); она ничего "
            "не обучила, и лаба отправит их снова после паузы")


def _cancelled(f: Facts) -> tuple[str, str]:
    at = f" after saving at step {_step(f)}" if f.out.went_on(f.from_step) else ""
    return f"{f.where}: cancelled with lab cancel{at}", f"{f.where}: отменён через lab cancel" + (
        f" после сохранения на шаге {_step(f)}" if at else "")


def _saved(f: Facts) -> tuple[str, str]:
    result = f.out.result or {}
    step, reason = result.get("step", _step(f)), str(result.get("reason") or "")
    if reason == "SIGTERM received" and f.signalled_by:  # the lab never sends one: its service did
        return (f"{f.signalled_by} stopped the session ({_what(f)}); it saved at step {step}, and the run goes on "
                "from there", f"{f.signalled_by} остановил сессию ({_what(f)}); она сохранилась на шаге {step}, и "
                "прогон продолжится оттуда")
    if f.said is Said.CUT and f.words:
        return f"{f.where}: {f.words} after saving at step {step} ({reason})", \
            f"{f.where}: {f.words} — сохранено на шаге {step} ({reason})"
    return reason, reason


def _others(f: Facts) -> tuple[str, str]:
    en, ru = _goes_on(f) if f.out.went_on(f.from_step) else ("", "")
    return (f"{f.where}: {_what(f)}: it was cancelled outside the lab (scancel by hand, or the cluster's admins)"
            f"{en}. The run stops here; `lab watch RUN` continues it",
            f"{f.where}: {_what(f)}: её отменили не из лабы (scancel вручную или администраторы кластера){ru}. Прогон "
            "остановлен; `lab watch RUN` продолжит его")


def _failed(f: Facts) -> tuple[str, str]:
    why = f.out.failure or f.error or _what(f)
    if f.own_cause and f.words and f.words != why:  # its service's word first: what the person changes
        why = f"{f.words} ({why})"
    where = f" The executed notebook and the log are in {f.folder}/;" if f.folder else ""
    return (f"{f.where}: the session failed: {why}.{where} {f.hint + ' ' if f.hint else ''}Fix the cause, then "
            "`lab watch RUN` continues the run",
            f"{f.where}: сессия упала: {why}." + (f" Выполненный блокнот и журнал в {f.folder}/;" if f.folder else "")
            + " исправьте причину, затем `lab watch RUN` продолжит прогон")


def _lost(f: Facts) -> tuple[str, str]:
    why = f.error or f.out.problem
    said = _what(f) + (f": {why}" if why and why not in _what(f) else "")
    hint = f" {f.hint}" if f.hint and f.said is not Said.DELETED else ""
    log = f" Its log is in {f.folder}/." if f.folder and not f.hint else ""
    return (f"{f.where}: {said}; no checkpoint of it came back: only that session is lost.{hint}{log}",
            f"{f.where}: {said}; её чекпоинт не вернулся: потеряна только эта сессия.")


@dataclass(frozen=True)
class Rule:
    name: str
    applies: Callable[[Facts], bool]
    status: Callable[[Facts], str] | str
    kind: Callable[[Facts], End] | End
    words: Callable[[Facts], tuple[str, str]]
    session: bool = True  # a session ran (it spent the machine's time)


RULES: tuple[Rule, ...] = (
    Rule("never started", lambda f: f.said is Said.NEVER, "failed", lambda f: f.refused or End.FAILED,
         lambda f: (f"{f.where}: {_what(f)}",) * 2, session=False),
    Rule("without its cards", lambda f: bool(f.out.no_gpu), "failed", End.UNFIT, lambda f: f.unfit or (
        f"{f.where}: the session came without the cards it was sent for",
        f"{f.where}: сессия пришла без карт, для которых её отправили")),
    Rule("inputs not in place", lambda f: bool(f.out.input_not_ready), "failed", End.PUSH_AGAIN, _inputs),
    Rule("cancelled", lambda f: f.cancel_asked and not (f.out.result or {}).get("done")
         and (f.said is Said.CANCELLED or f.out.saved or f.said is Said.DELETED), "cancelled", End.CANCELLED,
         _cancelled),
    Rule("cancelled by others", lambda f: f.said is Said.OTHERS, "failed", End.FAILED, _others),
    Rule("saved and stopped", lambda f: f.out.saved and f.error is None,
         lambda f: "done" if (f.out.result or {}).get("done") else "stopped", End.CONTINUE, _saved),
    Rule("the run's own cause", lambda f: f.own_cause or f.out.failure is not None and not f.out.went_on(f.from_step),
         "failed", End.FAILED, _failed),
    # Its machine's Python lacks what the notebook needs: no session there will do better until it is installed.
    Rule("its machine lacks a module", lambda f: "ModuleNotFoundError" in (f.error or ""), "failed", End.FAILED,
         _failed),
    Rule("cut after a save", lambda f: f.out.went_on(f.from_step), "stopped", End.CONTINUE,
         lambda f: tuple(f"{f.where}: {_what(f)}{clause}" for clause in _goes_on(f))),
    Rule("lost", lambda f: True, "failed", End.LOST, _lost),
)


def ended(f: Facts) -> Ending:
    rule = next(r for r in RULES if r.applies(f))
    en, ru = rule.words(f)
    status = rule.status if isinstance(rule.status, str) else rule.status(f)
    kind = rule.kind if isinstance(rule.kind, End) else rule.kind(f)
    return Ending(status, Outcome(kind, en, ru, session=rule.session))
