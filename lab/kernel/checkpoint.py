"""Checkpoints: atomic writes, integrity, and the time-limit saver.

A checkpoint is `ckpt_<step>.pt` plus a sidecar `ckpt_<step>.json` holding its sha256.
The .pt file is written to a temporary name, fsynced and renamed into place; the sidecar
follows the same way, so a checkpoint without a sidecar is one whose save never finished.
The newest two are kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

KEEP = 2
# The marker a session leaves in its outputs when its inputs (data, checkpoint) are not the ones sent.
INPUT_NOT_READY = "input-not-ready.json"
_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated or corrupt; the message says what to do."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(state: dict, folder: str | os.PathLike, keep: int = KEEP) -> Path:
    """Writes the checkpoint of `state["step"]` atomically and prunes all but the newest `keep`."""
    import torch  # here, not at the top: the control side uses this module's file helpers without torch
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt_{state['step']:08d}.pt"
    atomic_write(path, lambda f: torch.save(state, f))
    meta = {"step": state["step"], "tokens": state.get("tokens"), "sha256": sha256_file(path),
            "bytes": path.stat().st_size, "val_set": state.get("val_set"),
            "tokenizer_sha256": state.get("tokenizer_sha256"), "config": state.get("config")}
    atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(meta, indent=1).encode()))
    _fsync_dir(folder)
    prune_checkpoints(folder, keep)
    return path


def prune_checkpoints(folder: str | os.PathLike, keep: int = KEEP) -> None:
    """Removes all but the newest `keep` checkpoints of `folder`."""
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)


def checkpoint_meta(path: str | os.PathLike) -> dict:
    """What a checkpoint's save recorded beside it, without loading it (no torch): step, tokens,
    sha256, bytes, val_set, tokenizer_sha256 and the run's config."""
    return json.loads(Path(path).with_suffix(".json").read_text(encoding="utf-8"))


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a checkpoint file holds, from its name."""
    return int(_NAME.match(Path(path).name).group(1))


def newest_whole_checkpoint(folder: str | os.PathLike) -> tuple[Path, dict] | None:
    """The newest checkpoint of `folder` that verifies, with its meta; None when there is none.
    For collecting a finished session's outputs, where an older whole one is still worth having."""
    for path in reversed(list_checkpoints(folder)):
        if verify_checkpoint(path) is None:
            return path, checkpoint_meta(path)
    return None


def place_checkpoint(src: Path, folder: str | os.PathLike, keep: int = KEEP, put=None) -> Path:
    """Puts a verified checkpoint into `folder` (a run's `checkpoints/`) so that it counts there
    only once whole, then keeps the newest `keep`. `put(src, dst)` copies a file (default: copy)."""
    put = put or shutil.copyfile
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for part in (src, src.with_suffix(".json")):  # the .pt first: a sidecar means a whole checkpoint
        target = folder / part.name
        if target.exists() and target.stat().st_size == part.stat().st_size and sha256_file(target) == sha256_file(part):
            continue
        tmp = folder / f".{part.name}.tmp"
        tmp.unlink(missing_ok=True)
        put(part, tmp)
        os.replace(tmp, target)
    _fsync_dir(folder)
    prune_checkpoints(folder, keep)
    return folder / src.name


def list_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """Checkpoint files in `folder`, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def verify_checkpoint(path: Path) -> str | None:
    """None when the checkpoint is whole, else what is wrong with it."""
    if not path.with_suffix(".json").is_file():
        return "its save never finished (no sidecar .json)"
    try:
        meta = checkpoint_meta(path)
    except ValueError:
        return "its sidecar .json is unreadable"
    size = path.stat().st_size
    if size != meta["bytes"]:
        return f"it is truncated ({size} of {meta['bytes']} bytes)"
    if sha256_file(path) != meta["sha256"]:
        return "its sha256 does not match (corrupt)"
    return None


def resolve_checkpoint(target: str | os.PathLike, allow_fallback: bool = False) -> Path:
    """The checkpoint to resume from: a file, or the newest good one in a run folder.

    A bad newest checkpoint is an error unless `allow_fallback`: silently training on from
    an older state would repeat steps the person thinks are done.
    """
    target = Path(target)
    if target.is_file():
        problem = verify_checkpoint(target)
        if problem is None:
            return target
        if not allow_fallback:
            raise CheckpointError(f"checkpoint {target} is unusable: {problem}. "
                                  f"Pass --allow-fallback to continue from the previous good one.")
        target = target.parent
    candidates = list_checkpoints(target) or list_checkpoints(target / "checkpoints")
    if not candidates:
        raise CheckpointError(f"no checkpoint in {target}: give a ckpt_*.pt file or a run folder that has one")
    bad = []
    for path in reversed(candidates):
        problem = verify_checkpoint(path)
        if problem is None:
            if bad and not allow_fallback:
                raise CheckpointError(f"newest checkpoint {bad[0][0].name} is unusable: {bad[0][1]}. "
                                      f"Pass --allow-fallback to continue from {path.name}.")
            return path
        bad.append((path, problem))
    raise CheckpointError("no usable checkpoint in " + str(target) + ": "
                          + "; ".join(f"{p.name}: {why}" for p, why in bad))


def load_checkpoint(path: str | os.PathLike) -> dict:
    import torch
    # weights_only=False: the state holds Python and NumPy RNG states. These are the lab's
    # own files, verified against their sha256 by `resolve_checkpoint`.
    return torch.load(path, map_location="cpu", weights_only=False)


class StopGuard:
    """Decides when training must stop: at the time limit, or when SIGTERM or SIGINT arrive.

    The handlers only set a flag; the loop saves at the next step boundary. Stopping at
    the limit leaves room for one more step and the save, with a margin.
    """

    def __init__(self, limit_min: float, started: float | None = None, margin_s: float = 5.0):
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + limit_min * 60
        self.margin_s = margin_s
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self) -> "StopGuard":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:
                pass  # not the main thread: the launcher handles signals
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def reason(self, step_s: float, save_s: float) -> str | None:
        if self.signal_name:
            return f"{self.signal_name} received"
        if time.monotonic() + 1.5 * step_s + 1.5 * save_s + self.margin_s >= self.deadline:
            return "time limit"
        return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started
