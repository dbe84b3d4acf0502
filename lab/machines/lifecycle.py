"""One link's life on a machine whose session runs away from the driver (a Kaggle account, a box, a Slurm
cluster), in phases each recorded on the link (`Away`) before and after its side effect, so the control
side may die anywhere and `lab watch RUN` picks up where it stopped:

    planned -> staged -> submitting -> submitted -> ended -> collected -> merged

A kind supplies only its verbs (`Session`); the rest is here, once for every kind.

Never trust a service to end a session. A session its service has lost stays RUNNING for hours past
its timeout (unsloth's Kaggle CI, 2026-08-11: "sat in RUNNING for over two hours, past that ceiling
... and stopped only on a manual delete"), and a 12-hour limit may not be enforced at all
(helmet-png/m45-imf-analysis measured a 17.4-hour session). So the watchdog deletes a session still
running its own limit plus a margin after it began, or one whose signs of life stopped far longer than any
gap it had shown; deleting gives the machine's time back (unsloth: "the account's used-hours figure went
DOWN"), and the run goes on from its newest checkpoint.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from lab.config import UserError
from lab.kernel.metrics import read_metrics
from lab.machines.base import env_seconds
from lab.machines.ending import Facts, Said, ended
from lab.machines.handoff import SessionOutputs, from_known, merge_link_outputs, read_outputs
from lab.runs import End, Link, Outcome, Run, load_run, now, updating

LIVE = "live-metrics.jsonl"  # the running session's metrics rows as its machine shows them, in the link's folder
PATIENCE_S = 3600.0  # its machine unreachable this long while watching: the lab stops following for now
R = TypeVar("R", bound="LinkRecord")


def get_link(run_id: str, n: int) -> tuple[Run, Link]:
    run = load_run(run_id)
    return run, run.links[n - 1]


@dataclass
class LinkRecord:
    """A record of one link kept in `Link.detail` as plain JSON, beside the others (the lifecycle's,
    its kind's): each reads its own keys, and keys it does not know are kept as they are."""
    @classmethod
    def of(cls: type[R], link: Link) -> R:
        return from_known(cls, link.detail)

    @classmethod
    def update(cls, run_id: str, n: int, *, status: str | None = None, **changes: Any) -> Link:
        """Its fields changed (and the link's status) in one locked write."""
        with updating(run_id) as run:
            link = run.links[n - 1]
            cls.put(link, **changes)
            if status is not None:
                link.status = status
        return link

    @classmethod
    def put(cls, link: Link, **changes: Any) -> None:
        """Changes fields on a link being written (inside `lab.runs.updating`); a misspelt field is an error."""
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
        link.detail.update(changes)


@dataclass
class Away(LinkRecord):
    """The lifecycle's record of a link (kept in `Link.detail` beside its kind's own)."""
    folder: str = ""  # the link's in the run folder
    phase: str = "planned"
    why: str = ""  # why its machine was picked
    source: dict | None = None  # the checkpoint it starts from: {"path", "name", "step", "sha256"}
    spec: dict | None = None  # what it was sent (lab.spec.LinkSpec's JSON)
    seen: dict | None = None  # {"said", "words"} once it ended
    output: dict | None = None  # SessionOutputs, once collected
    stop_sent: str | None = None
    deleted: dict | None = None  # {"why", "at", "last_step"}: the lab ended it


@dataclass(frozen=True)
class Seen:
    """One look at a session."""
    state: str  # queued, running or ended (then `said`, how)
    words: str = ""  # its service's own
    said: Said | None = None
    row: dict | None = None  # its newest live metrics row
    activity: object = None  # what it has shown so far (a log's events, its metrics' bytes): a change is life
    alive: bool = True  # whether it shows signs of life while it runs at all (a log Kaggle keeps until the end)
    note: tuple[str, str] | None = None  # for the monitor, (en, ru)


@dataclass(frozen=True)
class Watchdog:
    """When the lab ends a session its service has lost."""
    margin_s: float = 1800.0  # past its own limit (counted from when it began to run) and its machine's margin
    silence_s: float = 1800.0  # the least silence that counts, once it showed a sign of life
    factor: float = 10.0  # silence this many times its longest gap yet

    @classmethod
    def from_env(cls) -> "Watchdog":  # the person's settings
        return cls(margin_s=env_seconds("LAB_WATCHDOG_MARGIN_MIN", cls.margin_s / 60, "minutes") * 60,
                   silence_s=env_seconds("LAB_WATCHDOG_SILENCE_MIN", cls.silence_s / 60, "minutes") * 60)


@dataclass
class LinkCtx:
    """One link being followed: which, how to tell the person, whether the person cancelled."""
    run_id: str
    n: int
    say: Callable[[str], None]
    cancelled: Callable[[], bool]

    def link(self) -> tuple[Run, Link]:
        return get_link(self.run_id, self.n)

    @property
    def record(self) -> Away:
        return Away.of(self.link()[1])

    @property
    def folder(self) -> Path:
        run, link = self.link()
        return run.folder / Away.of(link).folder


class Session(ABC):
    """A kind's verbs for one link of a run. Each may be called again after a crash: it records what
    it did in its kind's record and does nothing twice."""
    poll_s: float = 30.0  # between looks while the session runs
    end_margin_s: float = 600.0  # what the session needs past its limit to save and hand its outputs back

    def __init__(self, ctx: LinkCtx, where: str):
        self.ctx, self.where = ctx, where

    @abstractmethod
    def stage(self) -> None:
        """Puts the link's inputs where its session reads them (its data, the checkpoint, the notebook)."""

    @abstractmethod
    def submit(self) -> None:
        """Starts the session, once: a submission whose answer was lost is found, not repeated."""

    @abstractmethod
    def poll(self) -> Seen:
        """Where the session is now. Raises UserError when its machine cannot be asked now."""

    @abstractmethod
    def fetch(self, folder: Path) -> str | None:
        """The session's outputs into `folder`; what kept them from coming back, where something did."""

    def stop(self, reason: str) -> bool:
        """Asks the session to save a checkpoint and stop; False: this kind cannot (it is deleted)."""
        return False

    @abstractmethod
    def delete(self) -> str:
        """Ends the session now, whatever it was doing; says what happened."""

    def refusal(self, e: UserError) -> Outcome | None:
        """How a link that failed before its session ran ends, for a kind's own causes; None: FAILED."""
        return None

    def submitted(self) -> bool:
        """Whether a submission was sent, or maybe sent: then a session may run."""
        return False

    def facts(self, seen: dict, out: SessionOutputs) -> dict:
        """What the kind adds to the ending's Facts (lab.machines.ending), from the service's last word."""
        return {}

    def after(self, link: Link, out: SessionOutputs) -> None:
        """The kind's own bookkeeping once the link ended (what its machine holds, what it measured)."""

    def close(self) -> None:
        """The watch is over (ended, or given up for now): what the kind keeps open is closed."""


class Unreachable(UserError):
    """The session's machine cannot be asked now: the session goes on there, and the watch asks again."""


def follow(session: Session) -> Link:
    """Takes the link from wherever its record says it is to its end; the ended link. Raises UserError
    only when it cannot be ended now: the link stays as it is, and `lab watch RUN` takes it up again."""
    ctx = session.ctx
    if ctx.record.phase in ("planned", "staged", "submitting") and (done := _start(session)) is not None:
        return done
    if ctx.record.phase == "submitted":
        _watch(session, Watchdog.from_env())
    if ctx.record.phase == "ended":
        _collect(session)
    return _finish(session)


CANCELLED_BEFORE = Outcome(End.CANCELLED, "cancelled before its session started", "отменён до начала сессии",
                           session=False)


def _start(session: Session) -> Link | None:
    ctx = session.ctx
    try:
        if ctx.record.phase == "planned":
            if ctx.cancelled():
                return _end_before(ctx, CANCELLED_BEFORE, "cancelled")
            set_state(ctx, "staging")
            session.stage()
            Away.update(ctx.run_id, ctx.n, phase="staged")
        if ctx.record.phase == "staged":
            if ctx.cancelled():
                return _end_before(ctx, CANCELLED_BEFORE, "cancelled")
            Away.update(ctx.run_id, ctx.n, phase="submitting")
        set_state(ctx, "submitting")
        session.submit()
        Away.update(ctx.run_id, ctx.n, status="running", phase="submitted")
    except UserError as e:
        if session.submitted():
            raise  # a session may run: the next try asks its machine before it submits again
        return _end_before(ctx, session.refusal(e) or Outcome(End.FAILED, str(e), e.ru, session=False), "failed")
    return None


def _end_before(ctx: LinkCtx, outcome: Outcome, status: str) -> Link:
    with updating(ctx.run_id) as run:
        link = run.links[ctx.n - 1]
        link.status, link.ended, link.reason, link.outcome = status, now(), outcome.reason, outcome
        _put_state(link, "ended")
    ctx.say(f"link {ctx.n}: {outcome.reason}")
    return link


@dataclass
class _Watching:
    running_since: float | None = None
    alive_at: float | None = None
    longest_gap: float = 0.0
    last_step: int | None = None
    activity: object = None
    lost_at: float | None = None
    said_note: tuple[str, str] | None = None


def _watch(session: Session, dog: Watchdog) -> None:
    """Looks at the session until it ends, asking it to stop on a cancel, ending it where its service lost it."""
    ctx, w = session.ctx, _Watching()
    try:
        while True:
            if ctx.cancelled() and not ctx.record.stop_sent and _cancel(session):
                return  # ended on the cancel: its kind cannot ask it to save
            try:
                seen = session.poll()
            except Unreachable as e:
                _out_of_reach(session, w, e)
                continue
            w.lost_at = None
            set_state(ctx, seen.state if seen.state != "ended" else "collecting")
            _heard(ctx, w, seen)
            if seen.state == "ended":
                Away.update(ctx.run_id, ctx.n, phase="ended", seen={"said": (seen.said or Said.EXITED).value,
                                                                    "words": seen.words})
                return
            why = _lost_by_its_service(session, w, seen, dog)
            if why is not None:  # the lab ends it, and says what it had shown
                said, lost = session.delete(), f" (it had shown step {w.last_step:,})" if w.last_step else ""
                ctx.say(f"link {ctx.n}: the lab ended the session on {session.where}: {why}{lost}; {said}")
                Away.update(ctx.run_id, ctx.n, phase="ended", seen={"said": Said.DELETED.value, "words": "the lab "
                            f"ended the session: {why}"}, deleted={"why": why, "at": now(), "last_step": w.last_step})
                return
            time.sleep(session.poll_s)
    finally:
        session.close()


def _out_of_reach(session: Session, w: _Watching, e: UserError) -> None:
    ctx = session.ctx
    if w.lost_at is None:
        w.lost_at = time.monotonic()
        ctx.say(f"link {ctx.n}: {e}; the session goes on there, and the lab asks again")
    elif time.monotonic() - w.lost_at > PATIENCE_S:
        raise UserError(f"{session.where}: no answer for {PATIENCE_S / 60:.0f} min while following link {ctx.n}; "
                        "the session there goes on. When its machine answers again, `lab watch RUN` follows it and "
                        "collects its outputs") from None
    time.sleep(min(60.0, session.poll_s * 2))


def _heard(ctx: LinkCtx, w: _Watching, seen: Seen) -> None:
    t = time.monotonic()
    if seen.state == "running" and w.running_since is None:
        w.running_since = t
    step = (seen.row or {}).get("step")
    if seen.state == "running" and seen.alive and (w.alive_at is None or (step, seen.activity) != (w.last_step,
                                                                                                 w.activity)):
        if w.alive_at is not None:
            w.longest_gap = max(w.longest_gap, t - w.alive_at)
        w.alive_at, w.activity = t, seen.activity
    if step is not None and step != w.last_step:  # said whatever `progress` says: it is the run's own event
        w.last_step = step
        ctx.say(progress_line(ctx, seen.row))
    if seen.note and seen.note != w.said_note:
        w.said_note = seen.note
        ctx.say(f"link {ctx.n}: {seen.note[0]}")


def progress_line(ctx: LinkCtx, row: dict) -> str:
    run, _ = ctx.link()
    loss = f" loss {row['loss']:.4f}" if isinstance(row.get("loss"), (int, float)) else ""
    val = f" val {row['val_loss']:.4f}" if isinstance(row.get("val_loss"), (int, float)) else ""
    speed = f" {row['tok_s']:,.0f} tok/s" if isinstance(row.get("tok_s"), (int, float)) else ""
    return f"link {ctx.n}: step {row['step']:,}/{run.cfg.steps_until:,}{loss}{val}{speed} (live)"


def _lost_by_its_service(session: Session, w: _Watching, seen: Seen, dog: Watchdog) -> str | None:
    if seen.state != "running" or w.running_since is None:
        return None
    t = time.monotonic()
    _, link = session.ctx.link()
    limit_s = (link.limit_min or 0) * 60
    if limit_s and t - w.running_since > limit_s + session.end_margin_s + dog.margin_s:
        return (f"it still ran {_span(t - w.running_since)} after it began, past its own limit of "
                f"{limit_s / 60:g} min and the margin")
    if w.alive_at is not None and seen.alive:
        quiet = t - w.alive_at
        if quiet > max(dog.silence_s, dog.factor * w.longest_gap):
            return f"it showed no sign of life for {_span(quiet)} while its service said it ran"
    return None


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _cancel(session: Session) -> bool:
    """The person cancelled: the session saves and stops where its kind can ask it to, else it is
    deleted (the cancel said what that loses). Whether it ended here."""
    ctx = session.ctx
    if session.stop("cancelled with lab cancel"):
        ctx.say(f"link {ctx.n}: asked the session on {session.where} to save a checkpoint and stop")
        Away.update(ctx.run_id, ctx.n, stop_sent=now())
        return False
    said = session.delete()
    ctx.say(f"link {ctx.n}: cancelled: the session on {session.where} was ended; {said}")
    Away.update(ctx.run_id, ctx.n, stop_sent=now(), phase="ended",
                seen={"said": Said.CANCELLED.value, "words": "ended on the person's cancel"})
    return True


def _collect(session: Session) -> None:
    ctx = session.ctx
    folder = ctx.folder
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        problem = session.fetch(folder)
        out = read_outputs(folder)
        out = replace(out, problem=out.problem or problem)
        if not out.problem or problem:
            break
        ctx.say(f"link {ctx.n}: {out.problem}; fetching the outputs again")
    Away.update(ctx.run_id, ctx.n, phase="collected", output={**out.to_dict(), "done": True})


def facts_of(session: Session) -> Facts:
    ctx = session.ctx
    _, link = ctx.link()
    rec = Away.of(link)
    out, seen = from_known(SessionOutputs, rec.output), rec.seen or {}
    facts = Facts(where=session.where, said=Said(seen.get("said") or Said.EXITED.value), out=out,
                  from_step=link.from_step, words=seen.get("words") or "",
                  cancel_asked=bool(rec.stop_sent) or ctx.cancelled(), folder=rec.folder)
    return replace(facts, **session.facts(seen, out))


def _finish(session: Session) -> Link:
    """How the link ended (one table for every kind), its outputs merged into the run folder."""
    ctx = session.ctx
    run, link = ctx.link()
    rec = Away.of(link)
    out = from_known(SessionOutputs, rec.output)
    end = ended(facts_of(session))
    if rec.deleted:  # its service lost it: the next link goes elsewhere where it can
        end = replace(end, outcome=replace(end.outcome, pass_over=True))
    merge_link_outputs(run.folder, run.id, ctx.folder, link.from_step, out.checkpoint)
    with updating(ctx.run_id) as r:
        link = r.links[ctx.n - 1]
        end.put(link, out)
        if (ctx.folder / "executed.ipynb").is_file():
            link.notebook = f"{rec.folder}/executed.ipynb"
        Away.put(link, phase="merged")
        _put_state(link, "ended")
        r.status = link.status
    session.after(link, out)
    ctx.say(f"link {ctx.n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def set_state(ctx: LinkCtx, state: str) -> None:
    """Records where the session is now (`Link.state`), when that changed."""
    if ctx.link()[1].state != state:
        with updating(ctx.run_id) as run:
            _put_state(run.links[ctx.n - 1], state)


def _put_state(link: Link, state: str) -> None:
    if link.state != state:
        link.state, link.state_at = state, now()


def live(run: Run, link: Link, note: tuple[str, str] | None = None, mode: str = "live") -> dict | None:
    """{"link", "mode", "rows", "last_step", "note_en", "note_ru"}: the running link's curve as its machine
    shows it, past the link's first step."""
    rec = Away.of(link)
    if not rec.folder:
        return None
    rows = [r for r in read_metrics(run.folder / rec.folder / LIVE) if r["step"] > link.from_step]
    return {"link": link.n, "mode": mode, "rows": rows, "last_step": rows[-1]["step"] if rows else None,
            "note_en": note[0] if note else None, "note_ru": note[1] if note else None}


def plan(run_id: str, machine: str, kind: str, source: dict | None, why: str, limit_min: float | None = None,
         **kind_record) -> Link:
    """Appends a link of `kind` on `machine` to the run, before anything is sent, with its kind's record."""
    with updating(run_id) as run:
        n = len(run.links) + 1
        link = Link(n=n, machine=machine, kind=kind, status="starting", limit_min=limit_min,
                    from_step=source["step"] if source else run.step)
        link.detail = {**asdict(Away(folder=f"links/{n:03d}-{machine}", why=why, source=source)), **kind_record}
        _put_state(link, "planned")
        run.links.append(link)
        run.status = "running"
    return link


def age_s(iso: str | None) -> float:
    return (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds() if iso else 0.0
