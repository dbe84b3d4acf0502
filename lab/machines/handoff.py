"""What moves between a link's machine and the run folder, the same for every kind of machine:
the checkpoint a link starts from, staged as a flat folder with its sidecar and the curve so far;
and what a session leaves, checked (its result, its newest whole checkpoint, the markers of a
session that stopped before training) and merged into the run folder, so the curve reads as one
line across links and the newest checkpoints are kept.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from lab.config import UserError
from lab.kernel.checkpoint import (INPUT_NOT_READY, checkpoint_meta, checkpoint_step, list_checkpoints,
                                   place_checkpoint, pre_decay_checkpoint, sha256_file, verify_checkpoint)
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.kernel.plots import save_loss_plot
from lab.kernel.preflight import NO_GPU


def put(src: Path, dst: Path) -> None:
    """A hard link where the filesystem allows (no copy of gigabytes), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _metrics_beside(ckpt: Path, run_folder: Path) -> Path | None:
    """The curve up to a checkpoint: the run's own, else that of the run folder holding it."""
    if (run_folder / "metrics.jsonl").is_file():
        return run_folder / "metrics.jsonl"
    owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return owner / "metrics.jsonl" if (owner / "metrics.jsonl").is_file() else None


def stage_checkpoint(source: dict, run_folder: Path, dest: Path) -> str:
    """A flat folder with the checkpoint, its sidecar and the metrics up to its step; returns the
    sha256 of the checkpoint as staged, which must equal its sidecar's."""
    ckpt = Path(source["path"])
    sidecar = checkpoint_meta(ckpt)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    put(ckpt, dest / ckpt.name)
    digest = sha256_file(dest / ckpt.name)
    if not digest == sidecar["sha256"] == source["sha256"]:
        raise UserError(f"checkpoint {ckpt} changed or is corrupt (sha256 {digest[:12]}…, its sidecar says "
                        f"{sidecar['sha256'][:12]}…): the hand-off stops here rather than spread it")
    shutil.copyfile(ckpt.with_suffix(".json"), dest / ckpt.with_suffix(".json").name)
    metrics = _metrics_beside(ckpt, run_folder)
    if metrics is not None:
        write_metrics_lines(dest / "metrics.jsonl", metrics_lines(metrics, upto=source["step"]))
    return digest


def read_marker(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {"found": "unreadable marker"}
    return got if isinstance(got, dict) else {"found": "unreadable marker"}


def check_output(folder: Path) -> dict:
    """The session's result and its newest whole checkpoint (sha256 recomputed here); the
    markers of a session that stopped before training (its inputs, its cards)."""
    out: dict = {}
    for key, name in (("input_not_ready", INPUT_NOT_READY), ("no_gpu", NO_GPU)):
        marker = read_marker(folder / name)
        if marker is not None:
            out[key] = marker
    result_path = folder / "result.json"
    if result_path.is_file():
        try:
            out["result"] = json.loads(result_path.read_text(encoding="utf-8"))
        except ValueError:
            out["problem"] = "result.json is unreadable"
    for path in reversed(list_checkpoints(folder / "checkpoints")):
        problem = verify_checkpoint(path)
        if problem is not None:
            out["problem"] = f"checkpoint {path.name}: {problem}"
            continue
        meta = checkpoint_meta(path)
        out["checkpoint"] = {"name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
        break
    named = (out.get("result") or {}).get("checkpoint")
    if named and (out.get("checkpoint") or {}).get("name") != Path(named).name:
        out["problem"] = f"the session's checkpoint {Path(named).name} is missing or corrupt in its output"
    return out



def merge_checkpoint(ckpt: Path, run_folder: Path) -> Path:
    """Puts a verified checkpoint into the run's `checkpoints/`, hard-linked where it can be, with
    the session's checkpoint where the run's decay began when it saved one (a finished run grows
    from there: lab.settle.grow)."""
    sessions = [p for p in list_checkpoints(ckpt.parent) if checkpoint_step(p) <= checkpoint_step(ckpt)]
    before = pre_decay_checkpoint(sessions)
    if before is not None and before != ckpt and verify_checkpoint(before) is None:
        place_checkpoint(before, run_folder / "checkpoints", put=put)
    return place_checkpoint(ckpt, run_folder / "checkpoints", put=put)


def merge_metrics(run_folder: Path, link_metrics: Path, from_step: int) -> None:
    """The run's rows up to the link's start, then the link's rows after it. Each link carries
    the earlier rows itself; taking the run's own keeps what an earlier link wrote exactly."""
    if not link_metrics.is_file():
        return
    mine = run_folder / "metrics.jsonl"
    early = metrics_lines(mine, upto=from_step) or metrics_lines(link_metrics, upto=from_step)
    write_metrics_lines(mine, early + metrics_lines(link_metrics, after=from_step))


KEPT = ("result.json", "config.json", "device.json")  # a link's files the run folder takes as they are


def merge_link_outputs(run_folder: Path, run_id: str, folder: Path, from_step: int, ckpt: dict | None) -> None:
    """A finished link's outputs in `folder` into the run folder, whatever the machine: its
    checkpoint (`ckpt`: {"name", "step"}, when it reached past the link's start), its metrics from
    `from_step` on, its result, config and device files, and the run's loss plot drawn again."""
    if ckpt and ckpt["step"] >= from_step:
        merge_checkpoint(folder / "checkpoints" / ckpt["name"], run_folder)
    merge_metrics(run_folder, folder / "metrics.jsonl", from_step)
    for name in KEPT:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, run_folder / name)
    if (run_folder / "metrics.jsonl").is_file():
        save_loss_plot(run_folder, title=run_id)
