"""The lab's own machines over SSH: a member's GPU box, or a group of boxes that trains one run
across its hosts with torchrun (`--nnodes N --node-rank I`, meeting on the first host).

A link on one goes through phases recorded in the run registry (lab.machines.ssh.link: the
data and the link's folder staged on every host, the session launched there detached;
lab.machines.ssh.watch: followed from the run's own metrics over a connection made again when
it drops; lab.machines.ssh.outputs: outputs brought back, checked, merged, the outcome), so the
control side may die anywhere and `lab watch RUN` picks up where it stopped. The session lives
on the box, not in the driver: a dropped connection or a crashed control side is no failed run.
A cancel asks the box's session to save a checkpoint and stop (its stop request, which the
box's runner turns into the notebook's stop button).

A box has no quota: for the Auto rule it covers the whole run, and it is free when no run of
ours is on it and no one's work runs on its GPUs (nvidia-smi).
"""
from __future__ import annotations

from typing import Callable

from lab.config import UserError
from lab.machines.auto import FOREIGN, Machine
from lab.machines.base import Follow, Host, env_seconds
from lab.machines.control import spawn_driver, tail
from lab.machines.links import get_link
from lab.machines.needs import source_checkpoint
from lab.machines.ssh.boxes import Box, check_problem, get_box, holds_data, list_boxes, read_check
from lab.machines.ssh.link import BoxLink, launch, remote, stage
from lab.machines.ssh.outputs import collect, finish
from lab.machines.ssh.record import BoxLinkRecord
from lab.machines.ssh.watch import LIVE, POLL_ENV, POLL_S, ask_to_stop, read_rows, watch
from lab.runs import End, Link, Outcome, Run, now, updating

BEFORE_LAUNCH = ("planned", "staged")


class SshHost(Host):
    """One of the lab's SSH machines (lab.machines.ssh.boxes), by its name in the lab."""

    kind = "ssh"

    def __init__(self, name: str):
        super().__init__(name)

    @property
    def box(self) -> Box:
        return get_box(self.name)

    @classmethod
    def names(cls) -> list[str]:
        return [b.name for b in list_boxes()]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        box, record = self.box, read_check(self.name) or {}
        m = Machine(self.name, "ssh", record.get("gpu") or "unchecked", running=list(running),
                    cards=list(record.get("cards") or []), checked=record.get("at"), hosts=len(box.hosts))
        m.error = check_problem(self.name)
        if m.error is None:
            try:
                states = [remote(box, i, "state", box.workdir, timeout_s=120 if patient else 30)
                          for i in range(len(box.hosts))]
            except UserError as e:  # one box's trouble does not hide the other machines
                m.error = str(e)
            else:
                m.running += sorted({r for s in states for r in s["ours"]} - set(running))
                if any(s["gpu_apps"] for s in states) and not running:
                    m.running.append(FOREIGN)  # someone's work on its GPUs
        m.free = not m.running and m.error is None
        return m

    def check(self, say: Callable[[str], None] = print) -> None:
        """The machine answers, and its check (run now when it never ran: its first use) says
        it can run the lab's sessions."""
        box = self.box
        if read_check(self.name) is None:
            from lab.machines.ssh.check import check_machine  # nbformat: only for a first check
            check_machine(self.name, say=say)
        problem = check_problem(self.name)
        if problem:
            raise UserError(f"{box.where}: {problem}")
        for i in range(len(box.hosts)):
            remote(box, i, "hello", box.workdir, timeout_s=60)

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        if data_id and all(holds_data(self.name, i, data_id) for i in range(len(self.box.hosts))):
            return {"data"}
        return set()

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        source = source_checkpoint(run)
        with updating(run.id) as r:
            n = len(r.links) + 1
            link = Link(n=n, machine=self.name, kind=self.kind, status="starting",
                        from_step=source["step"] if source else r.step)
            link.detail = BoxLinkRecord(folder=f"links/{n:03d}-{self.name}", why=why, source=source).as_detail()
            r.links.append(link)
            r.status = "running"
        return link

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        # The session lives on the box: a driver that died left it running (`how.fresh` matters not).
        ctx = BoxLink(run.id, link.n, self.box, how.say, how.cancelled, env_seconds(POLL_ENV, POLL_S), how.progress)
        return drive_link(ctx)

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        box = self.box
        if driver_pid is None:
            spawn_driver(run.id)  # someone must end the link and bring back what the session saves
        if BoxLinkRecord.of(link).phase in BEFORE_LAUNCH:
            return f"run {run.id}: cancelled before its session started on {box.where}; none starts"
        missed = ask_to_stop(BoxLink(run.id, link.n, box, lambda s: None, lambda: True, POLL_S), "cancelled with "
                                                                                                  "lab cancel")
        if missed:
            return (f"run {run.id}: no further link will start; {', '.join(missed)} could not be reached now: the "
                    f"lab asks again while it follows the run (`lab watch {run.id}`)")
        return (f"run {run.id}: the session on {box.where} saves a checkpoint and stops; its outputs come back "
                "when it has")

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        folder = run.folder / BoxLinkRecord.of(link).folder
        return tail(folder / "session.log", lines) or tail(folder / "live.log", lines)

    def live(self, run: Run, link: Link) -> dict | None:
        folder = BoxLinkRecord.of(link).folder
        if not folder or BoxLinkRecord.of(link).phase in BEFORE_LAUNCH:
            return None
        rows = [r for r in read_rows(run.folder / folder / LIVE) if r["step"] > link.from_step]
        return {"link": link.n, "mode": "live", "rows": rows, "last_step": rows[-1]["step"] if rows else None,
                "note_en": None, "note_ru": None}


def drive_link(ctx: BoxLink) -> Link:
    """Takes the link from wherever its record says it is to its end; returns the ended link."""
    _, link = get_link(ctx.run_id, ctx.n)
    phase = BoxLinkRecord.of(link).phase
    if phase in BEFORE_LAUNCH:
        if read_check(ctx.box.name) is None:  # its first use: the check runs first, as `lab machines check`
            from lab.machines.ssh.check import check_machine  # nbformat: only for a first check
            check_machine(ctx.box.name, say=ctx.say)
        try:
            problem = check_problem(ctx.box.name)
            if problem:
                raise UserError(f"{ctx.box.where}: {problem}")
            if ctx.cancelled():
                return _end_before(ctx, "cancelled", "cancelled before its session started", End.CANCELLED)
            hosts = stage(ctx)
            if ctx.cancelled():
                return _end_before(ctx, "cancelled", "cancelled before its session started", End.CANCELLED)
        except UserError as e:  # nothing runs on the box: the link ends here and says why
            return _end_before(ctx, "failed", str(e), End.FAILED)
        phase = "launching"
    if phase == "launching":
        launch(ctx, BoxLinkRecord.of(get_link(ctx.run_id, ctx.n)[1]).hosts)
        phase = "launched"
    hosts = BoxLinkRecord.of(get_link(ctx.run_id, ctx.n)[1]).hosts
    if phase == "launched":
        last = watch(ctx, hosts[0])
        BoxLinkRecord.update(ctx.run_id, ctx.n, last={k: last.get(k) for k in ("phase", "exit")}, phase="ended")
    last = BoxLinkRecord.of(get_link(ctx.run_id, ctx.n)[1]).last
    return finish(ctx, last, collect(ctx, hosts))


def _end_before(ctx: BoxLink, status: str, reason: str, kind: End) -> Link:
    with updating(ctx.run_id) as r:
        link = r.links[ctx.n - 1]
        link.status, link.ended, link.reason = status, now(), reason
        link.outcome = Outcome(kind, reason, session=False)
    ctx.say(f"link {ctx.n}: {reason}")
    return link
