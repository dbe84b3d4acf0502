"""The lab's own machines over SSH: a member's GPU box, or a group of boxes that trains one run
across its hosts with torchrun (`--nnodes N --node-rank I`, meeting on the first host).

A link on one goes through the one lifecycle every kind shares (lab.machines.lifecycle); a box
supplies its verbs: stage the data and the link's folder on every host (lab.machines.remote.stage),
launch the session there detached, look at it (the first host's rank 0 writes the run's files), ask
it to save and stop, kill it, bring its outputs back. The session lives on the box, not in the
driver: a dropped connection or a crashed control side is no failed run.

A box has no quota and no session limit of its own: for the Auto rule it covers the whole run, and
it is free when no run of ours is on it and no one's work runs on its GPUs (nvidia-smi).
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.corpus.manifests import data_id_of
from lab.kernel.metrics import read_metrics
from lab.machines.auto import FOREIGN, Machine
from lab.machines.base import Follow, env_seconds
from lab.machines.handoff import SessionOutputs
from lab.machines.lifecycle import LIVE, Away, LinkCtx, LinkRecord, Seen, Session, Unreachable, follow, plan
from lab.machines.needs import source_checkpoint
from lab.machines.remote.client import Address, SshError, client, options
from lab.machines.remote.stage import data_key, fetch_from, stage_on, up_folder
from lab.machines.remote.host import OwnHost
from lab.machines.remote.store import check_problem, note_data, read_check
from lab.machines.ending import Said
from lab.machines.ssh.boxes import Box, check_machine, shells
from lab.runs import Link, Run
from lab.spec import LinkSpec

POLL_ENV = "LAB_SSH_POLL_S"  # how often the lab looks at a box's session (the person's setting)
POLL_S = 5.0


@dataclass
class BoxRecord(LinkRecord):
    """A box's own record of a link: each host's paths there, the group's rendezvous, how far the
    live curve has read the first host's metrics."""
    hosts: list = field(default_factory=list)
    endpoint: str | None = None


class BoxSession(Session):
    """One link's verbs on a box or a group of boxes."""

    def __init__(self, ctx: LinkCtx, box: Box):
        super().__init__(ctx, box.where)
        self.box, self.shells = box, shells(box)
        self.poll_s = env_seconds(POLL_ENV, POLL_S)

    def stage(self) -> None:
        if read_check(self.box.name) is None:  # its first use: the check runs first, as `lab machines check`
            check_machine(self.box.name, say=self.ctx.say)
        problem = check_problem(self.box.name)
        if problem:
            raise UserError(f"{self.box.where}: {problem}")
        run, link = self.ctx.link()
        data_dir = Path(run.cfg.data_dir)
        up = up_folder(self.ctx.folder, run.folder, Away.of(link).source, {})
        try:
            hosts = [stage_on(shell, self.box.workdir, data_dir, f"runs/{run.id}/{link.n:03d}-{i}", up,
                              lambda s: self.ctx.say(f"link {link.n}: {s}")) for i, shell in enumerate(self.shells)]
        finally:
            shutil.rmtree(up, ignore_errors=True)
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
            spec = self.spec(run, link, host, i, len(rec.hosts), endpoint)
            if i == 0:  # the first host's: its rank 0 writes the run's files
                Away.update(run.id, link.n, spec=spec.to_dict())
            encoded = base64.b64encode(json.dumps(params_of(spec)).encode("utf-8")).decode("ascii")
            self.shells[i].helper("launch", host["link"], encoded)
        where = ", ".join(self.box.hosts[i].host for i in range(len(rec.hosts)))
        self.ctx.say(f"link {link.n}: the training notebook runs on {where}, detached"
                     + (f" (torchrun over {len(rec.hosts)} hosts, rendezvous at {endpoint})" if endpoint else ""))

    def spec(self, run: Run, link: Link, host: dict, node: int, nodes: int, endpoint: str | None) -> LinkSpec:
        """The link's spec on one host: its own paths there, the sha256 of what it must find."""
        source = Away.of(link).source
        group = {"nnodes": nodes, "node_rank": node, "rdzv_endpoint": endpoint} if nodes > 1 else {}
        return LinkSpec.of(run.cfg, limit_min=link.limit_min or 0.0, data_dir=host["data"],
                           resume_from=f"{host['link']}/resume/{source['name']}" if source else "",
                           out_dir=f"{host['link']}/out", expect_data_sha256=data_key(Path(run.cfg.data_dir))[1],
                           expect_ckpt_sha256=source["sha256"] if source else "", **group)

    def submitted(self) -> bool:
        return bool(BoxRecord.of(self.ctx.link()[1]).hosts) and Away.of(self.ctx.link()[1]).phase == "submitting"

    def poll(self) -> Seen:
        live_file = self.ctx.folder / LIVE
        live_file.parent.mkdir(parents=True, exist_ok=True)
        first = BoxRecord.of(self.ctx.link()[1]).hosts[0]
        while True:
            offset = live_file.stat().st_size if live_file.is_file() else 0
            try:
                got = self.shells[0].helper("peek", first["link"], str(offset), timeout_s=60)
            except SshError as e:
                if e.kind in ("host-key", "auth"):  # waiting does not mend these: the person must
                    raise UserError(f"{e}. The session there goes on, detached; once that is fixed, `lab watch RUN` "
                                    "follows it and collects its outputs") from None
                raise Unreachable(f"lost the connection to {e.address.host}") from None
            append_live(live_file, got)
            if len(got.get("metrics") or "") < 200 * 1024:  # a long history comes in pieces: the rest at once
                break
        (self.ctx.folder / "live.log").write_text(got.get("log") or "", encoding="utf-8")
        return seen_of(got, live_file)

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
        exit_ = _exit_of(self.ctx.folder)
        return {"error": None if exit_.get("ok", True) else exit_.get("error")}

    def after(self, link: Link, out: SessionOutputs) -> None:
        if out.input_not_ready:  # the box holds other data than it was sent: copied again next time
            run, _ = self.ctx.link()
            for i in range(len(self.box.hosts)):
                note_data(self.box.name, i, data_id_of(Path(run.cfg.data_dir)), held=False)


def params_of(spec: LinkSpec) -> dict:
    """papermill's parameters for a spec (lab.notebooks.parameterized: nbformat, only for a link)."""
    from lab.notebooks import parameterized  # nbformat: only for a link
    return parameterized(spec)


def append_live(live_file: Path, got: dict) -> None:
    """The host's new metrics bytes, appended where they belong (a repeat is not appended twice)."""
    text = got.get("metrics") or ""
    here = live_file.stat().st_size if live_file.is_file() else 0
    if text and got.get("from") == here:
        with open(live_file, "a", encoding="utf-8") as f:
            f.write(text)


def seen_of(got: dict, live_file: Path) -> Seen:
    """A look at a box's session: its phase there (running, ended, died: gone without a word, never)."""
    rows = read_metrics(live_file)
    row = rows[-1] if rows else None
    phase = got.get("phase")
    if phase == "running":
        return Seen("running", row=row, activity=(got.get("offset"), got.get("log")))
    said = {"ended": Said.EXITED, "died": Said.GONE, "never": Said.GONE}.get(phase, Said.GONE)
    words = {"died": "the session's process is gone without a word (the box rebooted, or it was killed)",
             "never": "the session never started there"}.get(phase, "")
    return Seen("ended", words=words, said=said, row=row)


def _exit_of(folder: Path) -> dict:
    try:
        return json.loads((folder / "exit.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def rendezvous_host(address: Address) -> str:
    """The first host's address as its ssh config resolves it (`ssh -G`): where the group's
    other hosts reach its rendezvous."""
    port = ["-p", str(address.port)] if address.port else []
    try:
        out = subprocess.run([client("ssh"), "-G", *options(), *port, address.host], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return address.host.rpartition("@")[2]


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
        """The machine answers, and its check (run now when it never ran: its first use) says
        it can run the lab's sessions."""
        box = self.box
        if read_check(self.name) is None:
            check_machine(self.name, say=say)
        problem = check_problem(self.name)
        if problem:
            raise UserError(f"{box.where}: {problem}")
        for shell in shells(box):
            shell.helper("hello", box.workdir, timeout_s=60)

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        return plan(run.id, self.name, self.kind, source_checkpoint(run), why, run.cfg.limit_min)

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        # The session lives on the box: a driver that died left it running (`how.fresh` matters not).
        return follow(BoxSession(LinkCtx(run.id, link.n, how.say, how.cancelled, how.progress), self.box))
