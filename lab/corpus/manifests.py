"""Prepared data folders and their manifests, read without numpy or sentencepiece: the
calculator asks on every keystroke, the driver before every link.

A data folder (`$LAB_HOME/data/<id>/`, written by `lab prepare`) holds `manifest.json`: the
constellations with their sources' sha256, token counts per split, the UTF-8 bytes of the
held-out text (`val_bytes`; folders prepared before it was recorded lack it, see
`lab.corpus.valtext`), the tokenizer, the val-set id and `data_id`.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lab import home
from lab.config import UserError

FORMAT = 1
MANIFEST = "manifest.json"
# The split rule of folders prepared before manifests named theirs (`split_rule`).
FIRST_SPLIT_RULE = "whole-docs-by-sha256/5%/eos-after-doc/v1"

_cache: dict[str, tuple[tuple, Any]] = {}


def stat_key(path: str | os.PathLike) -> tuple | None:
    """What changes when a file is rewritten or replaced: mtime, size, inode (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def read_json_cached(file: str | os.PathLike) -> Any:
    """The parsed JSON file, re-read only when its mtime, size or inode changed; None if
    absent or bad. The calculator and the form read manifests and checkpoint sidecars
    through it on every keystroke."""
    key = stat_key(file)
    if key is None:
        _cache.pop(str(file), None)
        return None
    hit = _cache.get(str(file))
    if hit and hit[0] == key:
        return hit[1]
    try:
        value = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        value = None
    _cache[str(file)] = (key, value)
    return value


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a data folder (or the manifest file itself); a clear error when it is
    missing, unreadable or of another format."""
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"no manifest at {file}: prepare the data first (lab prepare -c NAME)")
    manifest = read_json_cached(file)
    if not isinstance(manifest, dict):
        raise UserError(f"{file} is not a readable manifest: prepare the data again (lab prepare)")
    if manifest.get("format") != FORMAT:
        raise UserError(f"{file} has format {manifest.get('format')!r}; this lab reads format {FORMAT}: "
                        f"prepare the data again with this version")
    return manifest


def prepared_folders() -> list[tuple[Path, dict]]:
    """Every finished data folder in `$LAB_HOME/data/` with its manifest, newest first. Folders
    being written (dot names) and unreadable manifests are skipped."""
    try:
        entries = [e for e in os.scandir(home.data_dir()) if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        return []
    out = []
    for entry in entries:
        try:
            out.append((Path(entry.path), read_manifest(entry.path)))
        except UserError:
            continue
    out.sort(key=lambda fm: (str(fm[1].get("created", "")), fm[0].name), reverse=True)
    return out


def data_id_of(data_dir: str | os.PathLike) -> str:
    """The id that names a prepared data set everywhere (its Kaggle dataset too)."""
    return str(read_manifest(data_dir).get("data_id") or Path(data_dir).name)


def val_text_id(manifest: dict) -> str:
    """16 hex chars naming the held-out text whatever tokenizer cut it: what `val_set` covers
    but the tokenizer (the constellations' content and the split rule). Val documents are
    chosen by their text's hash, so data of one val text holds out the same documents (a
    carved tail, in a constellation of one document, may end a few bytes apart)."""
    content = {n: c.get("sha256") for n, c in manifest.get("constellations", {}).items()}
    key = json.dumps({"constellations": dict(sorted(content.items())),
                      "split": manifest.get("split_rule", FIRST_SPLIT_RULE)}, sort_keys=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def write_manifest(folder: Path, manifest: dict) -> None:
    """Writes a data folder's manifest.json (the folder is renamed into place after, whole)."""
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def train_tokens_by_constellation() -> dict[str, int]:
    """Train tokens per constellation, from the newest data folder prepared with it."""
    out: dict[str, int] = {}
    for _, manifest in prepared_folders():
        for name, part in manifest.get("constellations", {}).items():
            if isinstance(part, dict) and isinstance(part.get("train_tokens"), int):
                out.setdefault(name, part["train_tokens"])
    return out
