"""Checkpoints on disk: one commit point per save, integrity, finding one to resume from.

A checkpoint is `ckpt_<step>.pt` plus its sidecar `ckpt_<step>.json` (step, sha256, bytes,
the run's config). A save writes the .pt to a temporary name while hashing it, fsyncs it and
renames it into place; then it writes the sidecar the same way, and **the sidecar's rename is
the commit point**: a .pt without a sidecar is no checkpoint (the listing ignores it), only
the leftover of a save that was interrupted, removed by the next save. So a kill at any moment
leaves the previous checkpoint whole and nothing that looks like a newer one. Which are kept is
the saver's rule (`saver.kept_steps`: the newest two and a WSD run's stable-phase marks, the
pre-decay one among them). The .pt holds tensors and plain Python values only, so it loads with
`torch.load(weights_only=True)`: a checkpoint downloaded from another account's output is
data, never code. Stdlib at the top: the control side uses these file helpers without torch.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

from lab.kernel.saver import KEEP, kept_steps
from lab.kernel.schedule import decay_start_for_config

FORMAT = 2  # 1: RNG states as NumPy objects (loaded through an allow-list); 2: tensors and plain values
# The marker a session leaves in its outputs when its inputs (data, checkpoint) are not the ones sent.
INPUT_NOT_READY = "input-not-ready.json"
_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")
_LEFTOVER = re.compile(r"^(\.ckpt_\d{8}\.(pt|json)\.tmp|ckpt_\d{8}\.(pt|json))$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated or corrupt; the message says what to do."""


class CheckpointSaveError(CheckpointError):
    """A save that failed (a full disk): the previous checkpoint is kept, and the message names it."""


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
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temp file behind


class _Hashing:
    """A write-only file that hashes and counts what passes through it: the sha256 of a save
    comes from the bytes written, with no second read of a file that may be gigabytes."""

    def __init__(self, f):
        self.f, self.sha256, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(state: dict, folder: str | os.PathLike, keep: int = KEEP) -> Path:
    """Saves the checkpoint of `state["step"]` with one commit point (its sidecar's rename) and
    prunes all but the newest `keep`. A failed save (a full disk) raises CheckpointSaveError,
    leaving the previous checkpoints as they were."""
    import torch  # here, not at the top: the control side uses this module's file helpers without torch
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt_{state['step']:08d}.pt"
    sidecar = path.with_suffix(".json")
    remove_leftovers(folder)
    tmp = folder / f".{path.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            hashing = _Hashing(f)
            torch.save(state, hashing)
            f.flush()
            os.fsync(f.fileno())
        sidecar.unlink(missing_ok=True)  # the same step saved again: uncommit the old one first
        os.replace(tmp, path)  # in place, but not a checkpoint until its sidecar is
        meta = {"step": state["step"], "tokens": state.get("tokens"), "sha256": hashing.sha256.hexdigest(),
                "bytes": hashing.bytes, "format": state.get("format"), "val_set": state.get("val_set"),
                "tokenizer_sha256": state.get("tokenizer_sha256"), "config": state.get("config")}
        atomic_write(sidecar, lambda f: f.write(json.dumps(meta, indent=1).encode()))  # the commit point
        _fsync_dir(folder)
    except (OSError, RuntimeError) as e:
        cause = _os_error(e)
        if cause is None:
            raise
        tmp.unlink(missing_ok=True)
        if not sidecar.is_file():
            path.unlink(missing_ok=True)
        raise CheckpointSaveError(_save_failed(path, folder, cause)) from e
    prune_checkpoints(folder, keep)
    return path


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind `e`: torch.save reports a failed write as a RuntimeError raised while
    handling it."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def _save_failed(path: Path, folder: Path, e: OSError) -> str:
    kept = list_checkpoints(folder)
    why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else (e.strerror or str(e))
    return (f"could not save checkpoint {path.name} in {folder}: {why}. "
            + (f"The previous checkpoint {kept[-1].name} (step {checkpoint_step(kept[-1]):,}) is kept and whole; "
               if kept else "There is no earlier checkpoint; ")
            + "free some space there, then resume from the run folder.")


def remove_leftovers(folder: str | os.PathLike) -> list[Path]:
    """Removes what interrupted saves left in `folder`: temp files, a .pt without its sidecar
    (never committed) and a sidecar without its .pt. Returns what it removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.iterdir():
        if not _LEFTOVER.match(p.name):
            continue
        if p.name.endswith(".tmp") or not p.with_suffix(".json" if p.suffix == ".pt" else ".pt").is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def prune_checkpoints(folder: str | os.PathLike, keep: int = KEEP) -> None:
    """Removes the checkpoints the saver does not keep (`saver.kept_steps`: the newest `keep`, and
    the newest at or before each of the run's stable-phase marks, as the newest one's config
    says), and leftovers."""
    found = list_checkpoints(folder)
    spared = kept_steps([checkpoint_step(p) for p in found], _schedule_of(found[-1]) if found else None, keep)
    for old in found:
        if checkpoint_step(old) not in spared:
            old.with_suffix(".json").unlink(missing_ok=True)  # uncommit first: never a sidecar without its .pt
            old.unlink(missing_ok=True)
    remove_leftovers(folder)


def _schedule_of(path: Path) -> SimpleNamespace | None:
    """The run's schedule fields as a checkpoint's sidecar recorded them (RunConfig.to_dict, whole or
    in part); None for a sidecar without them."""
    try:
        config = checkpoint_meta(path)["config"]
        whole = config.get("schedule") and "steps_until" in config
        return SimpleNamespace(**{"decay_start": 0, "decay_frac": 0.2, **config}) if whole else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def pre_decay_checkpoint(found: list[Path]) -> Path | None:
    """Of checkpoints oldest first, the newest at or before the decay's start (the newest one's
    config says where): where a finished run grows from (lab.settle.grow)."""
    schedule = _schedule_of(found[-1]) if found else None
    start = decay_start_for_config(schedule) if schedule is not None else None
    before = [p for p in found if start is not None and checkpoint_step(p) <= start]
    return before[-1] if before else None


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
    for part in (src, src.with_suffix(".json")):  # the .pt first: the sidecar commits it
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
    """Checkpoint files in `folder` whose save was committed (their sidecar exists), oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name) and p.with_suffix(".json").is_file())


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
    """The checkpoint's state, loaded as data (`weights_only=True`): tensors and plain values.
    A format-1 checkpoint (NumPy RNG state inside) loads with NumPy's array reconstruction
    allowed and nothing else; anything else that is not plain data is refused."""
    import torch  # torch: only to load (the control side reads sidecars without it)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        pass
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"checkpoint {path} holds objects other than tensors and plain values, which the "
                              f"lab never writes, so it is not loaded (it could run code): "
                              f"{str(e).splitlines()[0][:200]}. Continue from a checkpoint this kit saved") from None


def _numpy_array_globals() -> list:
    """What unpickling a NumPy array needs (format 1 kept NumPy's RNG state): data, not code."""
    import numpy as np  # numpy: only for a format-1 checkpoint
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
