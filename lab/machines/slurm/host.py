"""A Slurm cluster as the driver sees it: one of the lab's machines, with no quota, whose links are jobs.
It covers a whole run, as a box does; the queue decides when a job runs, so its state carries when Slurm
would start the run's next job (`sbatch --test-only`), and Auto counts that wait. While a job waits the lab
says why; a reason that never clears ends the link. A job Slurm requeues after its session started ends the
link (the session saved at Slurm's SIGTERM; the requeued job is scancelled so the run never trains twice).
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from lab.config import Problem, RunConfig, UserError
from lab.corpus.manifests import data_id_of
from lab.kernel.metrics import read_metrics
from lab.machines.auto import Machine
from lab.machines.base import Follow, env_seconds
from lab.machines.control import tail
from lab.machines.ending import Said
from lab.machines.handoff import SessionOutputs
from lab.machines.lifecycle import LIVE, Away, LinkCtx, Seen, Session, Unreachable, age_s, follow, plan
from lab.machines.needs import source_checkpoint
from lab.machines.remote.client import SshError
from lab.machines.remote.host import OwnHost, data_key, fetch_from, params_of, peek, spec_there, stage_on, up_folder
from lab.machines.remote.store import check_problem, note_data, read_check
from lab.machines.slurm.check import quick_check
from lab.machines.slurm.cluster import Cluster, JobTime, job_time
from lab.machines.slurm.job import SlurmLink, cancel_job, find_submitted, job_script, shape_options, submit
from lab.machines.slurm.query import (POLL_ENV, POLL_S, REQUEUED, JobState, SlurmUnreachable, expected_start,
                                      final_state, job_state, partition_facts, reason_words)
from lab.runs import Link, Run, now

CANCEL_GRACE_S = 120.0  # a job asked to stop that still runs this long after is scancelled
REQUEUE_GRACE_S = 120.0  # after a requeue, how long the lab waits for the session's save to be written
LOG_LINES = 4  # of the job's log in a failure's reason
# How Slurm's final states end a session, in the lab's words (lab.machines.ending).
ENDINGS = {"COMPLETED": Said.EXITED, "FAILED": Said.EXITED, "OUT_OF_MEMORY": Said.EXITED, "TIMEOUT": Said.CUT,
           "PREEMPTED": Said.CUT, "NODE_FAIL": Said.CUT, "BOOT_FAIL": Said.CUT, "DEADLINE": Said.CUT}


class SlurmSession(Session):
    """One link's verbs on a cluster: one `sbatch` job."""
    def __init__(self, ctx: LinkCtx, cluster: Cluster):
        super().__init__(ctx, cluster.where)
        self.cluster, self.login = cluster, cluster.shell
        self.poll_s = env_seconds(POLL_ENV, POLL_S)

    def rec(self) -> SlurmLink:
        return SlurmLink.of(self.ctx.link()[1])

    def _note(self, **changes) -> SlurmLink:
        return SlurmLink.of(SlurmLink.update(self.ctx.run_id, self.ctx.n, **changes))

    def stage(self) -> None:
        if read_check(self.cluster.name) is None:  # never checked: at least the login node and the partition
            quick_check(self.cluster)
        run, link = self.ctx.link()
        data_dir, name = Path(run.cfg.data_dir), f"lab-{run.id}-{link.n}"
        remote = f"runs/{run.id}/{link.n:03d}"
        workdir = self.login.helper("hello", self.cluster.workdir)["workdir"]
        # Each node adds its place in the group itself (lab.machines.remote.half).
        spec = spec_there(run, link, f"{workdir}/{remote}", f"{workdir}/data/{data_key(data_dir)[0]}")
        rec = replace(SlurmLink.of(link), job_name=name, remote=f"{workdir}/{remote}")
        script = job_script(self.cluster, rec, f"run {run.id}, link {link.n}")
        with up_folder(self.ctx.folder, run.folder, Away.of(link).source,
                       {"params.json": json.dumps(params_of(spec)), "job.sh": script}) as up:
            st = stage_on(self.login, self.cluster.workdir, data_dir, remote, up,
                          lambda s: self.ctx.say(f"link {link.n}: {s}"))
        note_data(self.cluster.name, 0, data_id_of(data_dir))
        Away.update(run.id, link.n, spec=spec.to_dict())
        SlurmLink.update(run.id, link.n, remote=st["link"], rsync=st["rsync"], job_name=name)

    def submit(self) -> None:
        rec = self.rec()
        job = rec.job or find_submitted(self.login, rec.job_name)  # an answer the control side did not record
        if job is None:
            job = submit(self.login, f"{rec.remote}/job.sh", self.cluster.where)
        SlurmLink.update(self.ctx.run_id, self.ctx.n, job=job)
        self.ctx.say(f"link {self.ctx.n}: job {job} sent to {self.cluster.where}: {rec.minutes} min, Slurm's signal "
                     f"{rec.signal_s} s before its end")

    def submitted(self) -> bool:
        return self.rec().job is not None

    def poll(self) -> Seen:
        try:
            return self._look()
        except (SshError, SlurmUnreachable) as e:
            if getattr(e, "kind", None) in ("host-key", "auth"):  # waiting does not mend these: the person must
                raise UserError(f"{e}. The job runs on; once that is fixed, `lab watch RUN` follows it") from None
            raise Unreachable(str(e)) from None

    def _look(self) -> Seen:
        rec = self.rec()
        got = peek(self.login, rec.remote, self.ctx.folder, rec.job, timeout_s=120)
        markers = got["markers"]
        activity = (got.get("offset"), got.get("log"))
        state = job_state(self.login, rec.job, scontrol=got.get("scontrol"))
        rows = read_metrics(self.ctx.folder / LIVE)
        row = rows[-1] if rows else None
        if Away.of(self.ctx.link()[1]).stop_sent and state is not None and state.state == "RUNNING" \
                and not rec.scancelled and age_s(Away.of(self.ctx.link()[1]).stop_sent) > CANCEL_GRACE_S:
            cancel_job(self.login, rec.job)  # given its time to save: Slurm ends what is left of it
            rec = self._note(scancelled=now())
        requeued = markers.get("requeued") or state is not None and markers.get("runner") and (  # after it started
            state.state in REQUEUED or state.pending and state.restarts > rec.restarts)
        if not rec.preempted and requeued:
            rec = self._end_requeued(rec, state)
        elif state is not None and state.pending and state.reason and not rec.preempted:
            rec = self._waiting(rec, state)  # (no reason yet: the scheduler has not looked at it)
        elif state is not None and state.state == "RUNNING" and (rec.pending or state.restarts != rec.restarts):
            if rec.pending:
                self.ctx.say(f"link {self.ctx.n}: job {rec.job} runs on {state.nodes or self.cluster.where}")
            rec = self._note(pending=None, restarts=state.restarts)
        if rec.pending and rec.pending.get("never"):
            return self._ended(rec, state, markers, row)
        if rec.preempted:  # ended once the session's save is written (Slurm gave it KillWait seconds) or given up
            if markers.get("exit") is not None or age_s(rec.preempted) > REQUEUE_GRACE_S:
                return self._ended(rec, state, markers, row)
            return Seen("running", row=row, activity=activity)
        if state is None or state.ended:
            return self._ended(rec, state, markers, row)
        note = (rec.pending["en"], rec.pending["ru"]) if rec.pending else None
        return Seen("queued" if state.pending else "running", words=state.state, row=row, activity=activity, note=note)

    def _end_requeued(self, rec: SlurmLink, state: JobState | None) -> SlurmLink:
        if state is not None and not state.ended:
            cancel_job(self.login, rec.job)  # the requeued job never runs the run a second time
        self.ctx.say(f"link {self.ctx.n}: Slurm requeued job {rec.job} (preempted, requeued, or a node failed) after "
                     "its session started; the lab ends the link with the checkpoint the session saved at Slurm's "
                     "signal, and goes on in a new job")
        return self._note(preempted=now(), pending=None, restarts=state.restarts if state else rec.restarts)

    def _waiting(self, rec: SlurmLink, state: JobState) -> SlurmLink:
        en, ru, never = reason_words(state.reason)
        start = state.start if state.start and state.start > now() else None
        if rec.pending and rec.pending.get("reason") == state.reason and rec.pending.get("start") == start:
            return rec
        when_en = f"; Slurm expects it to start at {start[:16].replace('T', ' ')} UTC" if start else ""
        when_ru = f"; Slurm ждёт её начала в {start[:16].replace('T', ' ')} UTC" if start else ""
        pending = {"reason": state.reason, "start": start, "never": never,
                   "en": f"job {rec.job} waits in the queue on {self.cluster.where}: {en}{when_en}",
                   "ru": f"задача {rec.job} ждёт в очереди на {self.cluster.where}: {ru}{when_ru}"}
        if never:
            cancel_job(self.login, rec.job)
            pending["en"] = f"job {rec.job} can never start on {self.cluster.where}: {en}; it was scancelled"
            pending["ru"] = f"задача {rec.job} никогда не начнётся на {self.cluster.where}: {ru}; она снята"
        return self._note(pending=pending)

    def _ended(self, rec: SlurmLink, state: JobState | None, markers: dict, row: dict | None) -> Seen:
        final = final_state(self.login, rec.job, live=state) if state is not None and state.ended else state
        link = SlurmLink.update(self.ctx.run_id, self.ctx.n, state=asdict(final) if final else None, last=markers)
        said, words = said_of(SlurmLink.of(link), bool(Away.of(link).stop_sent))
        return Seen("ended", words=words, said=said, row=row)

    def fetch(self, folder: Path) -> str | None:
        rec = self.rec()
        fetch_from(self.login, rec.remote, folder, rec.rsync, self.ctx.link()[0].cfg)

    def stop(self, reason: str) -> bool:
        rec = self.rec()
        state = job_state(self.login, rec.job) if rec.job else None
        if state is None or state.pending:  # still waiting: it never starts
            cancel_job(self.login, rec.job)
            self._note(scancelled=now())
        else:
            self.login.helper("stop", rec.remote, reason)
        return True

    def delete(self) -> str:
        cancel_job(self.login, self.rec().job)
        return f"job {self._note(scancelled=now()).job} was scancelled; what it saved stays"

    def facts(self, seen: dict, out: SessionOutputs) -> dict:
        return job_facts(self.rec(), out, tail(self.ctx.folder / "session.log", 100))

    def after(self, link: Link, out: SessionOutputs) -> None:
        run, _ = self.ctx.link()
        if out.input_not_ready:  # the cluster holds other data than sent: copied again next time
            note_data(self.cluster.name, 0, data_id_of(Path(run.cfg.data_dir)), held=False)
        rec, mine = self.rec(), f"/runs/{run.id}/{link.n:03d}"
        if not out.saved and not out.went_on(link.from_step) or not rec.remote or not rec.remote.endswith(mine):
            return  # a job that failed or was lost keeps its folder there, for a look
        try:  # nothing there is needed any more (the next link stages its own); the data stays
            self.login.remove(rec.remote, rec.remote[:-len(mine)])
        except UserError as e:  # SshError too: the run's outputs are here already
            self.ctx.say(f"link {link.n}: could not remove {rec.remote} on {self.cluster.where} ({e}); it is no "
                         "longer needed")
            return
        SlurmLink.update(run.id, link.n, cleaned=True)


def said_of(rec: SlurmLink, stop_asked: bool) -> tuple[Said, str]:
    """How Slurm says the link's job ended (its final state, the lab's requeue or never-start), in the lab's."""
    job = f"job {rec.job}"
    if rec.pending and rec.pending.get("never"):
        return Said.NEVER, rec.pending["en"]
    name = "PREEMPTED" if rec.preempted else (rec.state or {}).get("state") or "UNKNOWN"
    words = {"TIMEOUT": f"{job} reached its time limit ({rec.minutes} min)",
             "PREEMPTED": f"{job} was preempted (Slurm requeued it)",
             "NODE_FAIL": f"{job} lost its node (NODE_FAIL)", "BOOT_FAIL": f"{job}'s node failed to boot (BOOT_FAIL)",
             "OUT_OF_MEMORY": f"{job} ran out of memory (OUT_OF_MEMORY): give it a smaller batch_per_card, or ask the "
                              "cluster for more memory",
             "UNKNOWN": f"Slurm no longer knows {job} (it ended more than its MinJobAge ago, and the cluster keeps no "
                        "accounting), and it left no result",
             "CANCELLED": f"{job} was cancelled"}.get(name, f"{job} ended {name}")
    if name == "CANCELLED":
        return (Said.CANCELLED if stop_asked or rec.scancelled else Said.OTHERS), words
    return ENDINGS.get(name, Said.GONE), words


def job_facts(rec: SlurmLink, out: SessionOutputs, log: str) -> dict:
    error = ((rec.last or {}).get("exit") or {}).get("error")
    hint = ("(the cluster's Python lacks it: `lab machines check` on the cluster lists what to install)"
            if error and "ModuleNotFoundError" in error else "")
    lines = [x.strip() for x in log.splitlines() if x.strip() and not x.startswith("Executing")]
    if lines and not out.saved:
        hint = f"{hint} Its log ends: {' | '.join(lines[-LOG_LINES:])}.".strip()
    own = (rec.state or {}).get("state") == "OUT_OF_MEMORY" and not rec.preempted
    return {"error": error, "own_cause": own, "hint": hint,
            "signalled_by": f"Slurm (job {rec.job}, before its time limit of {rec.minutes} min, or a preemption)"}


class SlurmHost(OwnHost):
    """One of the lab's Slurm clusters (lab.machines.slurm.cluster), by its name in the lab."""
    kind, stored = "slurm", Cluster

    @property
    def cluster(self) -> Cluster:
        return self.machine

    def job_time(self, limit_min: float, facts: dict | None = None) -> JobTime:
        """A link's job for a run of `limit_min`, within the partition's limits as its check read them."""
        facts = facts or (read_check(self.name) or {}).get("partition") or {}
        return job_time(self.cluster.time_min, facts.get("default_time_s", 0), facts.get("max_time_s", 0), limit_min)

    def state(self, running: list[str], patient: bool = False) -> Machine:
        cluster = self.cluster
        m = self.checked(running, cluster.nodes)
        if m.error is None:
            minutes = self.job_time(RunConfig().limit_min).minutes  # the job a run would send: a link's time
            try:
                start, refused = expected_start(cluster.shell, shape_options(cluster) + [f"--time={minutes}"])
            except UserError as e:  # one cluster's trouble does not hide the other machines
                m.error = str(e)
            else:
                m.error = f"Slurm refuses such a job: {refused}" if refused else None
                m.wait_h = round(max(0.0, -age_s(start)) / 3600, 3) if start else None
        m.free = m.error is None
        return m

    def check(self, say: Callable[[str], None] = print) -> None:
        problem = check_problem(self.name)
        if problem:
            raise UserError(f"{self.cluster.where}: {problem}")
        quick_check(self.cluster)

    def limits(self, cfg: RunConfig) -> list[Problem]:
        cluster, time = self.cluster, self.job_time(cfg.limit_min)
        if cfg.limit_min <= 0 or time.limit_min >= cfg.limit_min:
            return []
        return [Problem("limit_min", f"a job on {cluster.where} runs at most {time.minutes} min (its partition's time "
                                     f"limit, less {time.minutes - time.limit_min:g} for its start and final save): the "
                                     f"run goes on there in links of {time.limit_min:g} min",
                        f"задача на {cluster.where} идёт не дольше {time.minutes} мин (лимит раздела, без "
                        f"{time.minutes - time.limit_min:g} на запуск и последнее сохранение): прогон пойдёт там звеньями "
                        f"по {time.limit_min:g} мин", severity="note")]

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        # Never checked: the partition's limits read now (sbatch refuses a time above them anyway).
        checked = (read_check(self.name) or {}).get("partition")
        time = self.job_time(run.cfg.limit_min, checked or partition_facts(self.cluster.shell, self.cluster.partition))
        return plan(run.id, self.name, self.kind, source_checkpoint(run), why, time.limit_min,
                    **asdict(SlurmLink(minutes=time.minutes, signal_s=time.signal_s)))

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        # The job lives on the cluster: a driver that died left it there (`how.fresh` matters not).
        return follow(SlurmSession(LinkCtx(run.id, link.n, how.say, how.cancelled), self.cluster))

    def waiting(self, link: Link) -> tuple[str, str] | None:
        pending = SlurmLink.of(link).pending
        return (pending["en"], pending["ru"]) if pending else None
