"""What moves between a link's machine and the run folder, for every kind: the checkpoint a link starts
from, staged with its sidecar and the curve so far; what a session leaves, read once and checked, then
merged into the run folder, so the curve reads as one line across links and the newest checkpoints are kept.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar

from lab.config import UserError
from lab.kernel.checkpoint import (INPUT_NOT_READY, checkpoint_meta, checkpoint_step, list_checkpoints,
                                   place_checkpoint, sha256_file, verify_checkpoint)
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.kernel.saver import kept_steps
from lab.kernel.plots import save_loss_plot
from lab.kernel.preflight import NO_GPU, TIMELINE

T = TypeVar("T")


def put(src: Path, dst: Path) -> None:
    """A hard link where the filesystem allows (no copy of gigabytes), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def stage_checkpoint(source: dict, run_folder: Path, dest: Path) -> str:
    """A flat folder with the checkpoint, its sidecar and the metrics up to its step; the sha256 as staged."""
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
    # The curve up to it: the run's own, else that of the run folder holding it.
    owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    metrics = next((f / "metrics.jsonl" for f in (run_folder, owner) if (f / "metrics.jsonl").is_file()), None)
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


@dataclass(frozen=True)
class SessionOutputs:
    """What a session left in its outputs, read once (`read_outputs`), the same for every machine."""
    result: dict | None = None
    checkpoint: dict | None = None  # the newest whole one: {"name", "step", "sha256"} (sha256 recomputed here)
    input_not_ready: dict | None = None  # markers of a session that stopped before training
    no_gpu: dict | None = None
    timeline: dict | None = None
    problem: str | None = None  # what is wrong with what came back

    @property
    def saved(self) -> bool:
        """The session wrote its own result of a stop that saved: its limit, a signal, done."""
        return bool(self.result) and not self.result.get("failed") and not self.problem

    @property
    def failure(self) -> str | None:
        return str(self.result.get("reason")) if self.result and self.result.get("failed") else None

    def went_on(self, from_step: int) -> bool:
        """A whole checkpoint past the link's start came back: the run goes on from it."""
        return bool(self.checkpoint) and self.checkpoint["step"] > from_step

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def from_known(cls: type[T], d: dict | None) -> T:
    """`cls` from a record the lab kept as JSON, the keys it does not know (an older or newer record's) left out."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in (d or {}).items() if k in names})


def read_outputs(folder: Path) -> SessionOutputs:
    """What the session left in `folder`, checked: its result, its newest whole checkpoint, its markers."""
    found: dict = {key: read_marker(folder / name) for key, name in (
        ("input_not_ready", INPUT_NOT_READY), ("no_gpu", NO_GPU), ("timeline", TIMELINE))}
    result_path = folder / "result.json"
    if result_path.is_file():
        try:
            found["result"] = json.loads(result_path.read_text(encoding="utf-8"))
        except ValueError:
            found["problem"] = "result.json is unreadable"
    for path in reversed(list_checkpoints(folder / "checkpoints")):
        problem = verify_checkpoint(path)
        if problem is None:
            meta = checkpoint_meta(path)
            found["checkpoint"] = {"name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
            break
        found["problem"] = f"checkpoint {path.name}: {problem}"
    named = (found.get("result") or {}).get("checkpoint")
    if named and (found.get("checkpoint") or {}).get("name") != Path(named).name:
        found["problem"] = f"the session's checkpoint {Path(named).name} is missing or corrupt in its output"
    return SessionOutputs(**found)


def wanted(listed: dict[str, int], named: str | None, cfg) -> dict[str, int]:
    """Of a session's output files (relative path -> size), what comes back: all but the checkpoints, then
    the one the run goes on from (`named`, else the newest committed) and those the run keeps (its stable
    phase's marks, where a cooldown branch or more steps start: lab.kernel.saver.kept_steps)."""
    ckpts = sorted(rel.split("/", 1)[1] for rel in listed if rel.startswith("checkpoints/ckpt_")
                   and rel.endswith(".pt") and rel[:-3] + ".json" in listed)
    newest = named if named in ckpts else (ckpts[-1] if ckpts else None)
    kept = kept_steps([checkpoint_step(c) for c in ckpts], cfg)
    keep = {c for c in ckpts if checkpoint_step(c) in kept} | ({newest} if newest else set())
    return {rel: size for rel, size in listed.items() if not rel.startswith("checkpoints/")
            or any(rel in (f"checkpoints/{c}", f"checkpoints/{c[:-3]}.json") for c in keep)}


def merge_checkpoint(ckpt: Path, run_folder: Path) -> Path:
    """A verified checkpoint into the run's `checkpoints/` (hard-linked), with the session's others the run keeps."""
    sessions = [p for p in list_checkpoints(ckpt.parent) if checkpoint_step(p) < checkpoint_step(ckpt)]
    cfg = checkpoint_meta(ckpt).get("config")  # (a sidecar without it keeps only the newest)
    kept = kept_steps([checkpoint_step(p) for p in sessions], SimpleNamespace(**cfg) if cfg else None)
    for path in sessions:
        if checkpoint_step(path) in kept and verify_checkpoint(path) is None:
            place_checkpoint(path, run_folder / "checkpoints", put=put)
    return place_checkpoint(ckpt, run_folder / "checkpoints", put=put)


def merge_metrics(run_folder: Path, link_metrics: Path, from_step: int) -> None:
    if not link_metrics.is_file():
        return
    mine = run_folder / "metrics.jsonl"
    early = metrics_lines(mine, upto=from_step) or metrics_lines(link_metrics, upto=from_step)
    write_metrics_lines(mine, early + metrics_lines(link_metrics, after=from_step))


def merge_link_outputs(run_folder: Path, run_id: str, folder: Path, from_step: int, ckpt: dict | None) -> None:
    """A finished link's outputs in `folder` into the run folder, and the run's loss plot drawn again."""
    if ckpt and ckpt["step"] >= from_step:
        merge_checkpoint(folder / "checkpoints" / ckpt["name"], run_folder)
    merge_metrics(run_folder, folder / "metrics.jsonl", from_step)
    for name in ("result.json", "config.json", "device.json"):  # a link's files the run folder takes as they are
        if (folder / name).is_file():
            shutil.copyfile(folder / name, run_folder / name)
    if (run_folder / "metrics.jsonl").is_file():
        save_loss_plot(run_folder, title=run_id)
