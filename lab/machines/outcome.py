"""How a link ended, as its machine reports it: the one thing the driver decides from.

A machine ends each link with an `Outcome` and records it on the link (`lab.runs.Link.outcome`)
in the same write that ends the link. Its kind says what the driver does next; its reason is
what the driver says (in Russian too where the control notebook shows it); `session` says
whether the machine started a session for the link (it spent the machine's time or quota), so
the run "went on" there and the Auto rule may continue it elsewhere.

    CONTINUE     the session ended with its work saved (its time limit, done, a checkpoint
                 before a kill): the run goes on from its step
    LOST         the session ran and died, or its outputs were lost: only that session is lost;
                 MAX_LOST_IN_A_ROW such links one after another stop the run
    INTERRUPTED  the session died with the control process it ran in: the run goes on, and it
                 counts as no failure (nothing of the session's own went wrong)
    PUSH_AGAIN   the session found its inputs not yet mounted and trained nothing: the next link
                 is pushed again after a wait; MAX_INPUT_WAITS in a row stop the run
    BUSY         the machine refused the session: it runs its maximum of sessions
    NO_QUOTA     the machine refused the session: its quota is spent
    UNFIT        the session came without the cards it was pushed for and trained nothing: the
                 machine is marked unable to run such sessions (the Auto rule skips it) and the
                 run goes on elsewhere; the reason says what to fix
    FAILED       the run stops here; the reason says what to fix, then `lab watch RUN`
    CANCELLED    the person cancelled the run

Stdlib only: the run registry reads and writes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class End(str, Enum):
    CONTINUE = "continue"
    LOST = "lost"
    INTERRUPTED = "interrupted"
    PUSH_AGAIN = "push-again"
    BUSY = "busy"
    NO_QUOTA = "no-quota"
    UNFIT = "unfit"
    FAILED = "failed"
    CANCELLED = "cancelled"


REFUSED = (End.BUSY, End.NO_QUOTA)  # the machine started nothing: another machine, or a wait for this one


@dataclass(frozen=True)
class Outcome:
    kind: End
    reason: str
    reason_ru: str | None = None
    session: bool = True  # the machine started a session for the link

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        return cls(End(d["kind"]), d.get("reason") or "", d.get("reason_ru"), bool(d.get("session", True)))
