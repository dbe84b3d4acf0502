"""A link's job followed to its end, every LAB_SLURM_POLL_S seconds (default 15): Slurm's word on
it (lab.machines.slurm.query) and the session's own files on the shared file system (the
cluster's half's `peek`).

* While it waits in the queue, the lab says why, in Slurm's words and its own (`Priority`,
  `Resources`, `QOSMaxGRESPerUser` ...), and when Slurm expects it to start where it says; a
  reason that never clears (a time above the partition's, a wrong account) ends the link there.
* While it runs, the new metrics rows are appended to the link's `live-metrics.jsonl` here (its
  size is how far the lab has read: a control side that crashed goes on without a gap or a
  repeat), which the monitor and `lab watch RUN` show as the live curve.
* A job Slurm requeues after its session started (a preemption, `scontrol requeue`, a node that
  failed) ends the link: the session saved at Slurm's SIGTERM, the lab scancels the requeued job
  so the run never trains twice, and the next link goes on from that checkpoint in a new job (or
  elsewhere under Auto).
* A cancel (`lab cancel`) asks the session to save and stop, as the notebook's stop button does;
  then the job is scancelled where it still runs. A job still waiting is scancelled at once.

A login node that cannot be reached is no failed run: the job runs on, and the lab asks again,
backing off to a minute; after WATCH_PATIENCE_S it stops following for now (`lab watch RUN`).
"""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from lab.config import UserError
from lab.kernel.checkpoint import atomic_write
from lab.machines.slurm.job import SlurmLink, cancel_job, note, record
from lab.machines.slurm.query import (REQUEUED, JobState, SlurmUnreachable, cluster_offset, final_state, job_state,
                                      reason_words)
from lab.machines.slurm.stage import SlurmCtx
from lab.machines.ssh.client import SshError
from lab.machines.ssh.watch import LIVE, LOG, WATCH_PATIENCE_S, read_rows

POLL_ENV = "LAB_SLURM_POLL_S"  # how often the lab asks Slurm and the job's files (the person's setting)
POLL_S = 15.0
CANCEL_GRACE_S = 120.0  # a job asked to stop that still runs this long after is scancelled
REQUEUE_GRACE_S = 120.0  # after a requeue, how long the lab waits for the session's save to be written
CANCEL_REASON = "cancelled with lab cancel"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _age_s(iso: str | None) -> float:
    return (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds() if iso else 0.0


def follow(ctx: SlurmCtx) -> SlurmLink:
    """Follows the link's job to its end; returns its record with Slurm's final word (phase "ended")."""
    live = ctx.folder / LIVE
    live.parent.mkdir(parents=True, exist_ok=True)
    offset, lost_at, backoff, said = cluster_offset(ctx.login), None, 1.0, len(read_rows(live))
    while True:
        try:
            done, said = _look(ctx, live, offset, said)
        except (SshError, SlurmUnreachable) as e:
            if getattr(e, "kind", None) in ("host-key", "auth"):  # waiting does not mend these: the person must
                raise UserError(f"{e}. The job runs on; once that is fixed, `lab watch RUN` follows it") from None
            if lost_at is None:
                lost_at = time.monotonic()
                ctx.say(f"link {ctx.n}: {e}; the job runs on, and the lab asks again")
            elif time.monotonic() - lost_at > WATCH_PATIENCE_S:
                raise UserError(f"{ctx.cluster.where}: no contact for {WATCH_PATIENCE_S / 60:.0f} min; the job runs "
                                "on. When the login node answers again, `lab watch RUN` follows it") from None
            time.sleep(backoff)
            backoff = min(backoff * 2, 60.0)
            continue
        lost_at, backoff = None, 1.0
        if done is not None:
            return done
        time.sleep(ctx.poll_s)


def _look(ctx: SlurmCtx, live: Path, offset: timedelta, said: int) -> tuple[SlurmLink | None, int]:
    """One look at the job and its files; (its record once it ended, the rows said so far)."""
    _, _, rec = record(ctx.run_id, ctx.n)
    markers = _peek(ctx, rec, live)
    state = job_state(ctx.login, rec.job, offset, scontrol=markers.pop("scontrol"))
    said = _progress(ctx, live, said)
    if ctx.cancelled():
        rec = ask_to_stop(ctx, rec, state)
    if state is not None and state.state == "RUNNING" and rec.stop_sent and not rec.scancelled \
            and _age_s(rec.stop_sent) > CANCEL_GRACE_S:  # given its time to save: Slurm ends what is left of it
        cancel_job(ctx.login, rec.job)
        rec = note(ctx.run_id, ctx.n, scancelled=_now())
    if not rec.preempted and _requeued(rec, state, markers):
        rec = _end_requeued(ctx, rec, state)
    elif state is not None and state.pending and state.reason and not rec.preempted:
        rec = _waiting(ctx, rec, state)  # (no reason yet: the scheduler has not looked at it)
    elif state is not None and state.state == "RUNNING" and (rec.pending or state.restarts != rec.restarts):
        if rec.pending:
            ctx.say(f"link {ctx.n}: job {rec.job} runs on {state.nodes or ctx.cluster.where}")
        rec = note(ctx.run_id, ctx.n, pending=None, restarts=state.restarts)
    if rec.pending and rec.pending.get("never"):
        return _ended(ctx, rec, state, markers), said
    if rec.preempted:  # ended once the session's save is written (Slurm gave it KillWait seconds) or given up
        over = markers.get("exit") is not None or _age_s(rec.preempted) > REQUEUE_GRACE_S
    else:
        over = state is None or state.ended
    return (_ended(ctx, rec, state, markers) if over else None), said


def _peek(ctx: SlurmCtx, rec: SlurmLink, live: Path) -> dict:
    """The session's new metrics (appended to the live curve), its log's tail, and its markers."""
    while True:
        here = live.stat().st_size if live.is_file() else 0
        got = ctx.login.node(f"{rec.remote}/node.py", "peek", rec.remote, str(here), rec.job, timeout_s=120)
        text = got.get("metrics") or ""
        if text and got.get("from") == here:
            with open(live, "a", encoding="utf-8") as f:
                f.write(text)
        atomic_write(ctx.folder / LOG, lambda f: f.write((got.get("log") or "").encode("utf-8")))
        if len(text.encode("utf-8")) < 200 * 1024:  # a long history comes in pieces: the rest at once
            return {k: got.get(k) for k in ("runner", "exit", "requeued", "stop", "scontrol")}


def _progress(ctx: SlurmCtx, live: Path, said: int) -> int:
    rows = read_rows(live)
    if len(rows) <= said or not ctx.progress:
        return max(said, len(rows))
    run, _, _ = record(ctx.run_id, ctx.n)
    row = rows[-1]
    loss = f" loss {row['loss']:.4f}" if isinstance(row.get("loss"), (int, float)) else ""
    speed = f" {row['tok_s']:,.0f} tok/s" if isinstance(row.get("tok_s"), (int, float)) else ""
    ctx.say(f"link {ctx.n}: step {row['step']:,}/{run.cfg.steps_until:,}{loss}{speed} (live, from the job's "
            "metrics.jsonl)")
    return len(rows)


def _requeued(rec: SlurmLink, state: JobState | None, markers: dict) -> bool:
    """Slurm put the job back into the queue after its session had started (a restart that found
    the session's marker ended at once, saying so)."""
    if markers.get("requeued"):
        return True
    if state is None or not markers.get("runner"):
        return False
    return state.state in REQUEUED or state.pending and state.restarts > rec.restarts


def _end_requeued(ctx: SlurmCtx, rec: SlurmLink, state: JobState | None) -> SlurmLink:
    if state is not None and not state.ended:
        cancel_job(ctx.login, rec.job)  # the requeued job never runs the run a second time
    ctx.say(f"link {ctx.n}: Slurm requeued job {rec.job} (preempted, requeued, or a node failed) after its session "
            "started; the lab ends the link with the checkpoint the session saved at Slurm's signal, and goes on "
            "in a new job")
    return note(ctx.run_id, ctx.n, preempted=_now(), pending=None, restarts=state.restarts if state else rec.restarts)


def _waiting(ctx: SlurmCtx, rec: SlurmLink, state: JobState) -> SlurmLink:
    """Says why the job waits when that changes; a reason that never clears ends the link."""
    en, ru, never = reason_words(state.reason)
    start = state.start if state.start and state.start > _now() else None
    if rec.pending and rec.pending.get("reason") == state.reason and rec.pending.get("start") == start:
        return rec
    when_en = f"; Slurm expects it to start at {start[:16].replace('T', ' ')} UTC" if start else ""
    when_ru = f"; Slurm ждёт её начала в {start[:16].replace('T', ' ')} UTC" if start else ""
    pending = {"reason": state.reason, "start": start, "never": never,
               "en": f"job {rec.job} waits in the queue on {ctx.cluster.where}: {en}{when_en}",
               "ru": f"задача {rec.job} ждёт в очереди на {ctx.cluster.where}: {ru}{when_ru}"}
    if never:
        cancel_job(ctx.login, rec.job)
        pending["en"] = f"job {rec.job} can never start on {ctx.cluster.where}: {en}"
        pending["ru"] = f"задача {rec.job} никогда не начнётся на {ctx.cluster.where}: {ru}"
    ctx.say(f"link {ctx.n}: {pending['en']}")
    return note(ctx.run_id, ctx.n, pending=pending)


def _ended(ctx: SlurmCtx, rec: SlurmLink, state: JobState | None, markers: dict) -> SlurmLink:
    final = final_state(ctx.login, rec.job, live=state) if state is not None and state.ended else state
    return note(ctx.run_id, ctx.n, phase="ended", state=final.to_dict() if final else None, last=markers)


def ask_to_stop(ctx: SlurmCtx, rec: SlurmLink, state: JobState | None) -> SlurmLink:
    """A cancel: a job still waiting is scancelled; a running one is asked to save and stop (its
    stop request, the notebook's stop button), once per link."""
    if rec.stop_sent or rec.job is None:
        return rec
    if state is None or state.pending:
        cancel_job(ctx.login, rec.job)
        ctx.say(f"link {ctx.n}: job {rec.job} was still waiting; scancelled")
    else:
        ctx.login.helper("stop", rec.remote, CANCEL_REASON)
        ctx.say(f"link {ctx.n}: asked job {rec.job} to save a checkpoint and stop; then Slurm ends it")
    return note(ctx.run_id, ctx.n, stop_sent=_now())


def pending_note(rec: SlurmLink) -> tuple[str, str] | None:
    """(English, Russian) of why the link's job waits, for the monitor; None when it does not."""
    return (rec.pending["en"], rec.pending["ru"]) if rec.pending else None

