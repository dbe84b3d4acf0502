"""A Slurm cluster as the driver sees it (lab.machines.base.Host): one of the lab's machines, with
no quota, whose links are jobs.

For the Auto rule a cluster covers the whole run, as a box does, and it is free while its login
node answers and its check passed: the queue, not the lab, decides when a job runs, so the
machine's state carries when Slurm would start the run's next job if it were sent now
(`sbatch --test-only`), and Auto counts that wait in the whole run's time. A link goes through
its phases (lab.machines.slurm.job.PHASES) in the run registry, so a control side that died
anywhere is picked up by `lab watch RUN`: the job lives on the cluster, not in the driver.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from lab.config import RunConfig, UserError
from lab.machines.auto import Machine
from lab.machines.base import Follow, Host, env_seconds
from lab.machines.control import spawn_driver, tail
from lab.machines.needs import source_checkpoint
from lab.runs import End, Outcome
from lab.machines.slurm.check import quick_check
from lab.machines.slurm.cluster import Cluster, get_cluster, job_time, list_clusters
from lab.machines.slurm.follow import POLL_ENV, POLL_S, ask_to_stop, follow, pending_note
from lab.machines.slurm.job import BEFORE_SUBMIT, SlurmLink, record, shape_options
from lab.machines.slurm.outputs import collect, finish
from lab.machines.slurm.query import expected_start, job_state, partition_facts
from lab.machines.slurm.stage import SlurmCtx, login_of, stage, submit_job
from lab.machines.ssh.boxes import check_problem, holds_data, read_check
from lab.machines.ssh.watch import LIVE, read_rows
from lab.runs import Link, Run, now, updating


class SlurmHost(Host):
    """One of the lab's Slurm clusters (lab.machines.slurm.cluster), by its name in the lab."""

    kind = "slurm"

    @property
    def cluster(self) -> Cluster:
        return get_cluster(self.name)

    @classmethod
    def names(cls) -> list[str]:
        return [c.name for c in list_clusters()]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        cluster, record_ = self.cluster, read_check(self.name) or {}
        m = Machine(self.name, "slurm", record_.get("gpu") or "unchecked", running=list(running),
                    cards=list(record_.get("cards") or []), checked=record_.get("at"), hosts=cluster.nodes)
        m.error = check_problem(self.name)
        if m.error is None:
            facts = record_.get("partition") or {}  # the job a run would send: its time as a link's (job_time)
            minutes = job_time(cluster.time_min, facts.get("default_time_s", 0), facts.get("max_time_s", 0),
                               RunConfig().limit_min).minutes
            try:
                start, refused = expected_start(login_of(cluster), shape_options(cluster) + [f"--time={minutes}"])
            except UserError as e:  # one cluster's trouble does not hide the other machines
                m.error = str(e)
            else:
                m.error = f"Slurm refuses such a job: {refused}" if refused else None
                m.wait_h = _hours_until(start)
        m.free = m.error is None
        return m

    def check(self, say: Callable[[str], None] = print) -> None:
        """The login node answers, the partition is there, and the cluster's last check (if any)
        says it can run the lab's sessions."""
        cluster = self.cluster
        problem = check_problem(self.name)
        if problem:
            raise UserError(f"{cluster.where}: {problem}")
        quick_check(cluster)

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        return {"data"} if data_id and holds_data(self.name, 0, data_id) else set()

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        cluster, source = self.cluster, source_checkpoint(run)
        # The partition's limits as its check read them (sbatch refuses a time above them anyway).
        facts = (read_check(self.name) or {}).get("partition") or partition_facts(login_of(cluster), cluster.partition)
        time = job_time(cluster.time_min, facts["default_time_s"], facts["max_time_s"], run.cfg.limit_min)
        with updating(run.id) as r:
            n = len(r.links) + 1
            link = Link(n=n, machine=self.name, kind=self.kind, status="starting", limit_min=time.limit_min,
                        from_step=source["step"] if source else r.step)
            link.detail = SlurmLink(f"links/{n:03d}-{self.name}", why, source, minutes=time.minutes,
                                    signal_s=time.signal_s).to_dict()
            r.links.append(link)
            r.status = "running"
        return link

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        # The job lives on the cluster: a driver that died left it there (`how.fresh` matters not).
        ctx = SlurmCtx(run.id, link.n, self.cluster, login_of(self.cluster), how.say, how.cancelled,
                       env_seconds(POLL_ENV, POLL_S), how.progress)
        return drive_link(ctx)

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        cluster = self.cluster
        if driver_pid is None:
            spawn_driver(run.id)  # someone must end the link and bring back what the job saves
        rec = SlurmLink.from_dict(link.detail)
        if rec.phase in BEFORE_SUBMIT and rec.job is None:
            return f"run {run.id}: cancelled before its job was sent to {cluster.where}; none will be"
        ctx = SlurmCtx(run.id, link.n, cluster, login_of(cluster), lambda s: None, lambda: True, POLL_S)
        state = job_state(ctx.login, rec.job) if rec.job else None
        if state is not None and state.ended:
            return f"run {run.id}: job {rec.job} has ended; no further link will start"
        ask_to_stop(ctx, rec, state)
        if state is None or state.pending:
            return f"run {run.id}: job {rec.job} was still waiting in the queue on {cluster.where}; scancelled"
        return (f"run {run.id}: job {rec.job} on {cluster.where} saves a checkpoint and stops, then Slurm ends it; "
                "its outputs come back when it has")

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        folder = run.folder / SlurmLink.from_dict(link.detail).folder
        return tail(folder / "session.log", lines) or tail(folder / "live.log", lines)

    def live(self, run: Run, link: Link) -> dict | None:
        rec = SlurmLink.from_dict(link.detail)
        if rec.phase in ("planned", "staged"):
            return None
        rows = [r for r in read_rows(run.folder / rec.folder / LIVE) if r["step"] > link.from_step]
        waiting = pending_note(rec)
        return {"link": link.n, "mode": "live", "rows": rows, "last_step": rows[-1]["step"] if rows else None,
                "note_en": waiting[0] if waiting else None, "note_ru": waiting[1] if waiting else None}


def _hours_until(start: str | None) -> float | None:
    if not start:
        return None
    left = (datetime.fromisoformat(start) - datetime.now(timezone.utc)).total_seconds()
    return round(max(0.0, left) / 3600, 3)


def drive_link(ctx: SlurmCtx) -> Link:
    """Takes the link from wherever its record says it is to its end; returns the ended link."""
    run, link, rec = record(ctx.run_id, ctx.n)
    if rec.phase in ("planned", "staged"):
        if ctx.cancelled():
            return _end_before(ctx, "cancelled", "cancelled before its job was sent", End.CANCELLED)
        try:
            if read_check(ctx.cluster.name) is None:  # never checked: at least the login node and the partition
                quick_check(ctx.cluster)
            stage(ctx, link.limit_min or run.cfg.limit_min)
            if ctx.cancelled():
                return _end_before(ctx, "cancelled", "cancelled before its job was sent", End.CANCELLED)
            rec = submit_job(ctx)
        except UserError as e:  # nothing runs on the cluster: the link ends here and says why
            return _end_before(ctx, "failed", str(e), End.FAILED)
    elif rec.phase == "submitting":
        rec = submit_job(ctx)
    if rec.phase == "submitted":
        rec = follow(ctx)
    if rec.phase == "ended":
        collect(ctx)
        rec = record(ctx.run_id, ctx.n)[2]
    if rec.phase == "collected":
        return finish(ctx, rec.output)
    return record(ctx.run_id, ctx.n)[1]


def _end_before(ctx: SlurmCtx, status: str, reason: str, kind: End) -> Link:
    with updating(ctx.run_id) as r:
        link = r.links[ctx.n - 1]
        link.status, link.ended, link.reason = status, now(), reason
        link.outcome = Outcome(kind, reason, session=False)
    ctx.say(f"link {ctx.n}: {reason}")
    return link

