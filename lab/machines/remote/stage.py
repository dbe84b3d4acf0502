"""What goes up to the lab's own machines for a link, and what comes back, boxes and clusters alike.

Up: the run's prepared data folder once per host (`WORKDIR/data/<name>-<sha256 of its manifest>/`,
continued where a copy stopped, sealed only when every file arrived whole), then the link's folder:
the training notebook, the kit's half, the checkpoint to go on from (sha256 checked as staged), and what
the kind adds. Back: the live curve while it runs, then the session's outputs with only the checkpoints
the run needs (lab.machines.handoff.wanted), its executed notebook and its log.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.kernel.checkpoint import sha256_file
from lab.machines.handoff import stage_checkpoint, wanted
from lab.machines.lifecycle import LIVE, Away
from lab.machines.remote.shell import HALF, Shell
from lab.machines.remote.store import ROOM_GB
from lab.runs import Link, Run
from lab.spec import LinkSpec

LINK_FILES = ("executed.ipynb", "session.log", "exit.json")  # the session's own, beside its outputs


def data_key(data_dir: Path) -> tuple[str, str]:
    """(the folder name of the data on the lab's machines, the sha256 of its manifest)."""
    digest = sha256_file(data_dir / "manifest.json")
    return f"{data_dir.name}-{digest[:16]}", digest


def up_folder(folder: Path, run_folder: Path, source: dict | None, extra: dict[str, str]) -> Path:
    """What goes into the link's folder there, gathered here first: the training notebook, the
    kit's half, the checkpoint, and `extra` (name -> text)."""
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
    return up


def stage_on(shell: Shell, workdir: str, data_dir: Path, link: str, up: Path, say: Callable[[str], None]) -> dict:
    """The data (once) and the link's folder `link` (relative to the workdir) on one host; returns
    where they lie there: {"workdir", "link", "data", "rsync"}."""
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
    """The session's outputs (from `link`/out there) into `folder`: every file but the checkpoints
    the run does not need; its executed notebook, log and exit beside them."""
    listing = shell.helper("outputs", link)
    for rel in list(listing["out"]):  # a checkpoint copied incompletely before is fetched whole
        here = folder / rel
        if rel.startswith("checkpoints/") and here.is_file() and here.stat().st_size != listing["out"][rel]:
            here.unlink()
    shell.copy_down(f"{link}/out", wanted(listing["out"], listing["checkpoint"], cfg), folder, rsync)
    shell.copy_down(link, {k: v for k, v in listing["link"].items() if k in LINK_FILES}, folder, rsync)


def spec_there(run: Run, link: Link, folder: str, data: str, **group) -> LinkSpec:
    """The link's spec on one of the lab's machines: its folder and data there, the sha256 of what it must find."""
    source = Away.of(link).source
    return LinkSpec.of(run.cfg, limit_min=link.limit_min or 0.0, data_dir=data, out_dir=f"{folder}/out",
                       resume_from=f"{folder}/resume/{source['name']}" if source else "",
                       expect_data_sha256=data_key(Path(run.cfg.data_dir))[1],
                       expect_ckpt_sha256=source["sha256"] if source else "", **group)


def params_of(spec: LinkSpec) -> dict:
    from lab.notebooks import parameterized  # nbformat: only for a link
    return parameterized(spec)


def peek(shell: Shell, link: str, folder: Path, *job: str, timeout_s: float = 60.0) -> dict:
    """One look at the session there (the half's `peek`): its new metrics appended to the live curve in
    `folder` (a long history comes in pieces: the rest at once), its log's tail beside it; the answer."""
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
