"""What the lab's own machines share as the driver's hosts, boxes and Slurm clusters alike: a state built
on their last check; the data once per host (continued where a copy stopped, sealed only when whole) and the
link's folder going up; the live curve and the outputs coming back, with only the checkpoints the run needs.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from lab.config import UserError
from lab.kernel.checkpoint import sha256_file
from lab.machines.auto import Machine
from lab.machines.base import Host
from lab.machines.control import spawn_driver, tail
from lab.machines.handoff import stage_checkpoint, wanted
from lab.machines.lifecycle import LIVE, Away, live
from lab.machines.remote.client import HALF, Shell
from lab.machines.remote.store import ROOM_GB, Stored, check_problem, holds_data, read_check
from lab.runs import Link, Run
from lab.spec import LinkSpec


def data_key(data_dir: Path) -> tuple[str, str]:
    """(the folder name of the data on the lab's machines, the sha256 of its manifest)."""
    digest = sha256_file(data_dir / "manifest.json")
    return f"{data_dir.name}-{digest[:16]}", digest


@contextmanager
def up_folder(folder: Path, run_folder: Path, source: dict | None, extra: dict[str, str]) -> Iterator[Path]:
    from lab.notebooks import TRAIN_NOTEBOOK  # nbformat, imported only for a link
    up = folder / ".up"
    shutil.rmtree(up, ignore_errors=True)
    up.mkdir(parents=True)
    shutil.copyfile(TRAIN_NOTEBOOK, up / "train.ipynb")
    (up / "box.py").write_text(HALF, encoding="utf-8")
    for name, text in extra.items():
        (up / name).write_text(text, encoding="utf-8")
    if source:  # the checkpoint, its sidecar and the curve up to it; sha256 checked as staged
        stage_checkpoint(source, run_folder, up / "resume")
    try:
        yield up
    finally:  # removed here once copied, or once the copy failed
        shutil.rmtree(up, ignore_errors=True)


def stage_on(shell: Shell, workdir: str, data_dir: Path, link: str, up: Path, say: Callable[[str], None]) -> dict:
    """The data (once) and the link's folder on one host; where they lie: {"workdir", "link", "data", "rsync"}."""
    key, _ = data_key(data_dir)
    st = shell.helper("stage", workdir, key, link)
    sizes = _sizes(data_dir)
    missing = 0 if st["whole"] else sum(s for rel, s in sizes.items() if st["there"].get(rel) != s)
    need_gb = (missing + sum(_sizes(up).values())) / 1e9 + ROOM_GB
    if st["free_gb"] < need_gb:
        raise UserError(f"{shell.owner}: {shell.label} has {st['free_gb'] * 1000:.1f} MB free in {st['workdir']}, "
                        f"and this link needs {need_gb * 1000:.1f} MB there (the data, the notebook and the "
                        f"checkpoint, and {ROOM_GB * 1000:.0f} MB for the session's own): free some space there, or "
                        "give the machine another --workdir. Nothing was copied; the run keeps its checkpoint.")
    if not st["whole"]:
        say(f"copying the data ({missing / 1e6:.1f} MB) to {shell.label}")
        shell.copy_up(data_dir, st["partial"], bool(st["rsync"]), st["there"])
        sealed = shell.helper("seal", workdir, key, json.dumps(sizes))
        if not sealed["whole"]:
            raise UserError(f"{shell.owner}: the data did not arrive whole on {shell.label} "
                            f"({', '.join(sealed['wrong'])}); `lab watch RUN` copies it again")
    shell.copy_up(up, st["link"], bool(st["rsync"]), {})
    return {"workdir": st["workdir"], "link": st["link"], "data": st["data"], "rsync": bool(st["rsync"])}


def fetch_from(shell: Shell, link: str, folder: Path, rsync: bool, cfg) -> None:
    """The session's outputs into `folder` (but the checkpoints the run does not need), its log beside them."""
    listing = shell.helper("outputs", link)
    for rel in list(listing["out"]):  # a checkpoint copied incompletely before is fetched whole
        here = folder / rel
        if rel.startswith("checkpoints/") and here.is_file() and here.stat().st_size != listing["out"][rel]:
            here.unlink()
    shell.copy_down(f"{link}/out", wanted(listing["out"], listing["checkpoint"], cfg), folder, rsync)
    shell.copy_down(link, listing["link"], folder, rsync)  # the session's own, beside its outputs


def spec_there(run: Run, link: Link, folder: str, data: str, **group) -> LinkSpec:
    source = Away.of(link).source
    return LinkSpec.of(run.cfg, limit_min=link.limit_min or 0.0, data_dir=data, out_dir=f"{folder}/out",
                       resume_from=f"{folder}/resume/{source['name']}" if source else "",
                       expect_data_sha256=data_key(Path(run.cfg.data_dir))[1],
                       expect_ckpt_sha256=source["sha256"] if source else "", **group)


def params_of(spec: LinkSpec) -> dict:
    from lab.notebooks import parameterized  # nbformat: only for a link
    return parameterized(spec)


def peek(shell: Shell, link: str, folder: Path, *job: str, timeout_s: float = 60.0) -> dict:
    """One look at the session there: its new metrics appended to the live curve in `folder`; the answer."""
    live_file = folder / LIVE
    live_file.parent.mkdir(parents=True, exist_ok=True)
    while True:
        here = live_file.stat().st_size if live_file.is_file() else 0
        got = shell.helper("peek", link, str(here), *job, timeout_s=timeout_s)
        text = got.get("metrics") or ""
        if text and got.get("from") == here:  # a repeat is not appended twice
            with open(live_file, "a", encoding="utf-8") as f:
                f.write(text)
        if len(text.encode("utf-8")) < 200 * 1024:
            (folder / "live.log").write_text(got.get("log") or "", encoding="utf-8")
            return got


def _sizes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


class OwnHost(Host):
    """One of the lab's own machines, stored here as its kind's `stored` record (a box, a cluster)."""
    stored: type[Stored]
    holding = 1  # how many of its hosts must hold the data (a cluster's shared file system is one)

    @property
    def machine(self):
        return self.stored.get(self.name)

    @property
    def where(self) -> str:
        return self.machine.where

    @classmethod
    def names(cls) -> list[str]:
        return [m.name for m in cls.stored.all()]

    def checked(self, running: list[str], hosts: int) -> Machine:
        record = read_check(self.name) or {}
        return Machine(self.name, self.kind, record.get("gpu") or "unchecked", running=list(running),
                       cards=list(record.get("cards") or []), checked=record.get("at"), hosts=hosts,
                       error=check_problem(self.name))

    def cards(self) -> str | None:
        return (read_check(self.name) or {}).get("gpu")

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        return {"data"} if data_id and all(holds_data(self.name, i, data_id) for i in range(self.holding)) else set()

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid is None:
            spawn_driver(run.id)  # someone must end the link and bring back what the session saves
        if Away.of(link).phase in ("planned", "staged"):
            return f"run {run.id}: cancelled before its session started on {self.where}; none starts"
        return (f"run {run.id}: the session on {self.where} saves a checkpoint and stops; its outputs come back when "
                "it has")

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        folder = run.folder / Away.of(link).folder
        return tail(folder / "session.log", lines) or tail(folder / "live.log", lines)

    def live(self, run: Run, link: Link) -> dict | None:
        return live(run, link, self.waiting(link))

    def waiting(self, link: Link) -> tuple[str, str] | None:  # (English, Russian) of why its session waits
        return None
