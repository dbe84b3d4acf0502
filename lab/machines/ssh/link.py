"""One link of a run on an SSH machine, up to its start: the data, the checkpoint and the
parameterized training notebook on every host, then the session started there, detached.

Each phase is recorded in the run registry (the link's `BoxLinkRecord`) before and after its side
effect, and each side effect on the box can be done again without harm (a whole data folder is
not copied again, a half-copied one is continued, a second launch finds the first), so the
control side may die anywhere and `lab watch RUN` picks up where it stopped:

1. stage: on each host, the run's prepared data folder in `WORKDIR/data/<key>/` (<key>: the
   sha256 of its manifest), copied once per host and sealed only when every file arrived whole;
   then the link's folder `WORKDIR/runs/<run>/<link>-<node>/` with the training notebook, the
   box's half of the kit (lab.machines.ssh.remote) and the checkpoint to continue from (with its
   sidecar and the curve up to it, sha256 checked on both sides);
2. launch: papermill runs the notebook there in a session of its own (setsid). On a group,
   torchrun runs on every host with `--nnodes N --node-rank I`, meeting at a port of the first
   host (the notebook's `nnodes`, `node_rank`, `rdzv_endpoint`).
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from lab.config import RunConfig, UserError
from lab.corpus.manifests import data_id_of
from lab.kernel.checkpoint import sha256_file
from lab.machines.handoff import stage_checkpoint
from lab.machines.links import get_link
from lab.machines.ssh import remote as ssh_remote
from lab.machines.ssh.boxes import ROOM_GB, Box, note_data
from lab.machines.ssh.client import Address, client, copy_up, options, remote_python
from lab.machines.ssh.record import BoxLinkRecord

REMOTE = Path(ssh_remote.__file__).read_text(encoding="utf-8")


@dataclass
class BoxLink:
    """What the phases of one link need: where, and how to tell the person."""
    run_id: str
    n: int
    box: Box
    say: Callable[[str], None]
    cancelled: Callable[[], bool]
    poll_s: float
    progress: bool = True

    @property
    def folder(self) -> Path:
        run, link = get_link(self.run_id, self.n)
        return run.folder / BoxLinkRecord.of(link).folder


def remote(box: Box, host: int, verb: str, *args: str, timeout_s: float = 120.0) -> dict:
    """One verb of the box's half (lab.machines.ssh.remote) on host `host`, its JSON answer."""
    address = box.hosts[host]
    proc = remote_python(address, box.python, REMOTE, [verb, *args], timeout_s)
    if proc.returncode in (126, 127):  # the shell found no such program
        raise UserError(f"{box.where}: there is no Python at {box.python} on {address.host} "
                        f"({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'not found'}): give the "
                        f"box's Python (`ssh {address.host} which python3` finds one) with `lab machines remove "
                        f"{box.name}` and `lab machines add {box.name} ... --python PATH`")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        if "No space left on device" in proc.stderr:
            raise UserError(f"{box.where}: the disk of {address.host} is full ({why}): free some space in "
                            f"{box.workdir} there, or give the machine another --workdir")
        raise UserError(f"{box.where}: `{verb}` failed on {address.host}: {why}")
    return json.loads(lines[-1])


def node_link(run_id: str, n: int, node: int) -> str:
    """The link's folder on a host, relative to the machine's workdir."""
    return f"runs/{run_id}/{n:03d}-{node}"


def data_key(data_dir: Path) -> tuple[str, str]:
    """(the folder name of the data on the boxes, the sha256 of its manifest)."""
    digest = sha256_file(data_dir / "manifest.json")
    return f"{data_dir.name}-{digest[:16]}", digest


# ---------------------------------------------------------------------------------------------
# 1. stage


def stage(ctx: BoxLink) -> list[dict]:
    """The data and the link's folder on every host; returns each host's record (its paths)."""
    run, link = get_link(ctx.run_id, ctx.n)
    if BoxLinkRecord.of(link).hosts:
        staged = BoxLinkRecord.of(link).hosts
        if all(h.get("staged") for h in staged):
            return staged
    data_dir = Path(run.cfg.data_dir)
    key, _ = data_key(data_dir)
    up = _up_folder(ctx, run.folder, BoxLinkRecord.of(link).source)
    try:
        hosts = [_stage_host(ctx, i, data_dir, key, up) for i in range(len(ctx.box.hosts))]
    finally:
        shutil.rmtree(up, ignore_errors=True)
    BoxLinkRecord.update(ctx.run_id, ctx.n, hosts=hosts, phase="staged")
    return hosts


def _up_folder(ctx: BoxLink, run_folder: Path, source: dict | None) -> Path:
    """What goes into the link's folder on each host: the notebook, the box's half, the checkpoint."""
    from lab.notebooks import TRAIN_NOTEBOOK  # nbformat, imported only for a link
    up = ctx.folder / ".up"
    shutil.rmtree(up, ignore_errors=True)
    up.mkdir(parents=True)
    shutil.copyfile(TRAIN_NOTEBOOK, up / "train.ipynb")
    (up / "box.py").write_text(REMOTE, encoding="utf-8")
    if source:  # the checkpoint, its sidecar and the curve up to it; sha256 checked as staged
        stage_checkpoint(source, run_folder, up / "resume")
    return up


def _stage_host(ctx: BoxLink, i: int, data_dir: Path, key: str, up: Path) -> dict:
    box, address = ctx.box, ctx.box.hosts[i]
    link_rel = node_link(ctx.run_id, ctx.n, i)
    st = remote(box, i, "stage", box.workdir, key, link_rel)
    sizes = _sizes(data_dir)
    missing = 0 if st["whole"] else sum(s for rel, s in sizes.items() if st["there"].get(rel) != s)
    need_gb = (missing + sum(_sizes(up).values())) / 1e9 + ROOM_GB
    if st["free_gb"] < need_gb:
        raise UserError(f"{box.where}: {address.host} has {st['free_gb'] * 1000:.1f} MB free in {st['workdir']}, "
                        f"and this link needs {need_gb * 1000:.1f} MB there (the data, the notebook and the "
                        f"checkpoint, and {ROOM_GB * 1000:.0f} MB for the session's own): free some space there, "
                        "or give the machine another --workdir. Nothing was copied; the run keeps its checkpoint.")
    if not st["whole"]:
        ctx.say(f"link {ctx.n}: copying the data ({missing / 1e6:.1f} MB) to {address.host}")
        copy_up(address, data_dir, st["partial"], st["rsync"], st["there"])
        sealed = remote(box, i, "seal", box.workdir, key, json.dumps(sizes))
        if not sealed["whole"]:
            raise UserError(f"{box.where}: the data did not arrive whole on {address.host} "
                            f"({', '.join(sealed['wrong'])}); `lab watch RUN` copies it again")
    note_data(box.name, i, data_id_of(data_dir))
    copy_up(address, up, st["link"], st["rsync"], {})
    return {"host": address.host, "workdir": st["workdir"], "link": st["link"], "data": st["data"],
            "rsync": st["rsync"], "staged": True}


def _sizes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


# ---------------------------------------------------------------------------------------------
# 2. launch


def launch(ctx: BoxLink, hosts: list[dict]) -> list[dict]:
    """Starts the session on every host (again: a host that has it already says so)."""
    run, link = get_link(ctx.run_id, ctx.n)
    endpoint = BoxLinkRecord.of(link).endpoint
    if len(hosts) > 1 and not endpoint:
        port = remote(ctx.box, 0, "port")["port"]
        endpoint = f"{rendezvous_host(ctx.box.hosts[0])}:{port}"
    BoxLinkRecord.update(ctx.run_id, ctx.n, phase="launching", endpoint=endpoint)
    for i, host in enumerate(hosts):
        params = node_params(run.cfg, BoxLinkRecord.of(link).source, host, i, len(hosts), endpoint)
        encoded = base64.b64encode(json.dumps(params).encode("utf-8")).decode("ascii")
        answer = remote(ctx.box, i, "launch", host["link"], encoded)
        host["pid"] = answer.get("pid")
    BoxLinkRecord.update(ctx.run_id, ctx.n, status="running", hosts=hosts, phase="launched")
    where = ", ".join(h["host"] for h in hosts)
    ctx.say(f"link {ctx.n}: the training notebook runs on {where}, detached"
            + (f" (torchrun over {len(hosts)} hosts, rendezvous at {endpoint})" if endpoint else ""))
    return hosts


def node_params(cfg: RunConfig, source: dict | None, host: dict, node: int, nodes: int,
                endpoint: str | None) -> dict:
    """The notebook's parameters on one host: its own paths, the sha256 of what it must find."""
    from lab.notebooks import parameterized  # nbformat: only where a link is staged
    resume = f"{host['link']}/resume/{source['name']}" if source else ""
    link_cfg = replace(cfg, data_dir=host["data"], resume_from=resume)  # where, on that host
    manifest = sha256_of_manifest(cfg)
    group = {"nnodes": nodes, "node_rank": node, "rdzv_endpoint": endpoint} if nodes > 1 else {}
    return parameterized(link_cfg, out_dir=f"{host['link']}/out", nproc=0, plot_every_s=30,
                         expect_data_sha256=manifest,
                         expect_ckpt_sha256=source["sha256"] if source else "", **group)


def sha256_of_manifest(cfg: RunConfig) -> str:
    return data_key(Path(cfg.data_dir))[1]


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
