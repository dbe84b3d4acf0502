"""The lab's boxes over SSH: a member's GPU box, or a group of boxes that trains one run across its hosts
with torchrun. The session lives on the box, detached: a dropped connection or a crashed control side is no
failed run. A box has no quota: it covers a whole run, and is free when no one's work runs on its GPUs.
"""
from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.corpus.manifests import data_id_of
from lab.kernel.metrics import read_metrics
from lab.machines.auto import FOREIGN, Machine
from lab.machines.base import Follow, env_seconds
from lab.machines.ending import Said
from lab.machines.handoff import SessionOutputs, read_marker
from lab.machines.lifecycle import LIVE, Away, LinkCtx, LinkRecord, Seen, Session, Unreachable, follow, plan
from lab.machines.needs import source_checkpoint
from lab.machines.remote.client import Address, SshError, ssh_command
from lab.machines.remote.host import OwnHost, fetch_from, params_of, peek, spec_there, stage_on, up_folder
from lab.machines.remote.store import check_problem, note_data, read_check
from lab.machines.ssh.boxes import Box, check_machine, shells
from lab.runs import Link, Run

POLL_ENV = "LAB_SSH_POLL_S"  # how often the lab looks at a box's session (the person's setting)
POLL_S = 5.0


@dataclass
class BoxRecord(LinkRecord):
    hosts: list = field(default_factory=list)
    endpoint: str | None = None


class BoxSession(Session):
    """One link's verbs on a box or a group of boxes."""
    def __init__(self, ctx: LinkCtx, box: Box):
        super().__init__(ctx, box.where)
        self.box, self.shells = box, shells(box)
        self.poll_s = env_seconds(POLL_ENV, POLL_S)

    def stage(self) -> None:
        fit_to_run(self.box, self.ctx.say)
        run, link = self.ctx.link()
        data_dir = Path(run.cfg.data_dir)
        with up_folder(self.ctx.folder, run.folder, Away.of(link).source, {}) as up:
            hosts = [stage_on(shell, self.box.workdir, data_dir, f"runs/{run.id}/{link.n:03d}-{i}", up,
                              lambda s: self.ctx.say(f"link {link.n}: {s}")) for i, shell in enumerate(self.shells)]
        for i in range(len(hosts)):
            note_data(self.box.name, i, data_id_of(data_dir))
        BoxRecord.update(run.id, link.n, hosts=hosts)

    def submit(self) -> None:
        run, link = self.ctx.link()
        rec = BoxRecord.of(link)
        endpoint = rec.endpoint
        if len(rec.hosts) > 1 and not endpoint:
            endpoint = f"{rendezvous_host(self.box.hosts[0])}:{self.shells[0].helper('port')['port']}"
            BoxRecord.update(run.id, link.n, endpoint=endpoint)
        for i, host in enumerate(rec.hosts):  # again: a host that has it already says so
            group = {"nnodes": len(rec.hosts), "node_rank": i, "rdzv_endpoint": endpoint} if len(rec.hosts) > 1 else {}
            spec = spec_there(run, link, host["link"], host["data"], **group)
            if i == 0:  # the first host's: its rank 0 writes the run's files
                Away.update(run.id, link.n, spec=spec.to_dict())
            encoded = base64.b64encode(json.dumps(params_of(spec)).encode("utf-8")).decode("ascii")
            self.shells[i].helper("launch", host["link"], encoded)
        where = ", ".join(self.box.hosts[i].host for i in range(len(rec.hosts)))
        self.ctx.say(f"link {link.n}: the training notebook runs on {where}, detached"
                     + (f" (torchrun over {len(rec.hosts)} hosts, rendezvous at {endpoint})" if endpoint else ""))

    def submitted(self) -> bool:
        return bool(BoxRecord.of(self.ctx.link()[1]).hosts) and Away.of(self.ctx.link()[1]).phase == "submitting"

    def poll(self) -> Seen:
        try:
            got = peek(self.shells[0], BoxRecord.of(self.ctx.link()[1]).hosts[0]["link"], self.ctx.folder)
        except SshError as e:
            if e.kind in ("host-key", "auth"):  # waiting does not mend these: the person must
                raise UserError(f"{e}. The session there goes on, detached; once that is fixed, `lab watch RUN` "
                                "follows it and collects its outputs") from None
            raise Unreachable(f"lost the connection to {e.address.host}") from None
        rows = read_metrics(self.ctx.folder / LIVE)
        row, phase = rows[-1] if rows else None, got.get("phase")  # running, ended, died (gone without a word), never
        if phase == "running":
            return Seen("running", row=row, activity=(got.get("offset"), got.get("log")))
        words = {"died": "the session's process is gone without a word (the box rebooted, or it was killed)",
                 "never": "the session never started there"}.get(phase, "")
        return Seen("ended", words=words, said=Said.EXITED if phase == "ended" else Said.GONE, row=row)

    def fetch(self, folder: Path) -> str | None:
        run, link = self.ctx.link()
        hosts = BoxRecord.of(link).hosts
        fetch_from(self.shells[0], hosts[0]["link"], folder, hosts[0]["rsync"], run.cfg)
        for i, host in enumerate(hosts[1:], start=1):  # their logs, for when something went wrong there
            self.shells[i].copy_down(host["link"], {"session.log": None}, folder / f"node-{i}", host["rsync"])

    def stop(self, reason: str) -> bool:
        for i, host in enumerate(BoxRecord.of(self.ctx.link()[1]).hosts):
            try:
                self.shells[i].helper("stop", host["link"], reason)
            except UserError as e:
                raise Unreachable(str(e)) from None
        return True

    def delete(self) -> str:
        killed = 0
        for i, host in enumerate(BoxRecord.of(self.ctx.link()[1]).hosts):
            try:
                killed += self.shells[i].helper("kill", host["link"], "the lab ended it")["killed"]
            except UserError as e:
                return f"it could not be reached to end it ({e}); the lab asks again at the next look"
        return f"{killed} of its processes were killed; what it saved stays"

    def facts(self, seen: dict, out: SessionOutputs) -> dict:
        exit_ = read_marker(self.ctx.folder / "exit.json") or {}
        return {"error": None if exit_.get("ok", True) else exit_.get("error")}

    def after(self, link: Link, out: SessionOutputs) -> None:
        if out.input_not_ready:  # the box holds other data than it was sent: copied again next time
            run, _ = self.ctx.link()
            for i in range(len(self.box.hosts)):
                note_data(self.box.name, i, data_id_of(Path(run.cfg.data_dir)), held=False)


def fit_to_run(box: Box, say: Callable[[str], None]) -> None:
    if read_check(box.name) is None:  # its first use: the check runs first, as `lab machines check`
        check_machine(box.name, say=say)
    problem = check_problem(box.name)
    if problem:
        raise UserError(f"{box.where}: {problem}")


def rendezvous_host(address: Address) -> str:
    """The first host's address as its ssh config resolves it (`ssh -G`): where the group's others meet it."""
    try:
        out = subprocess.run([*ssh_command(address), "-G", address.host], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    named = (line[len("hostname "):].strip() for line in out.splitlines() if line.startswith("hostname "))
    return next((name for name in named if name), address.host.rpartition("@")[2])


class SshHost(OwnHost):
    """One of the lab's SSH machines (lab.machines.ssh.boxes), by its name in the lab."""
    kind, stored = "ssh", Box

    @property
    def box(self) -> Box:
        return self.machine

    @property
    def holding(self) -> int:
        return len(self.box.hosts)

    def state(self, running: list[str], patient: bool = False) -> Machine:
        box = self.box
        m = self.checked(running, len(box.hosts))
        if m.error is None:
            try:
                states = [shell.helper("state", box.workdir, timeout_s=120 if patient else 30)
                          for shell in shells(box)]
            except UserError as e:  # one box's trouble does not hide the other machines
                m.error = str(e)
            else:
                m.running += sorted({r for s in states for r in s["ours"]} - set(running))
                if any(s["gpu_apps"] for s in states) and not running:
                    m.running.append(FOREIGN)  # someone's work on its GPUs
        m.free = not m.running and m.error is None
        return m

    def check(self, say: Callable[[str], None] = print) -> None:
        fit_to_run(self.box, say)
        for shell in shells(self.box):
            shell.helper("hello", self.box.workdir, timeout_s=60)

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        return plan(run.id, self.name, self.kind, source_checkpoint(run), why, run.cfg.limit_min)

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        # The session lives on the box: a driver that died left it running (`how.fresh` matters not).
        return follow(BoxSession(LinkCtx(run.id, link.n, how.say, how.cancelled), self.box))
