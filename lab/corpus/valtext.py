"""The held-out split as text: its documents decoded from a data folder's val shards, and
their UTF-8 bytes.

The tokenizer gives any text back exactly (decode(encode(text)) == text), so the decoded
documents are the held-out text itself. That serves bits per byte on a constellation's val
split under any tokenizer (`lab eval --constellation`), and the val byte count of folders
prepared before their manifests recorded it (`val_bytes`).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lab.config import UserError
from lab.corpus.manifests import MANIFEST, read_manifest, shard_folder, stat_key
from lab.corpus.tokenizer import EOS_ID, load_tokenizer

_bytes_cache: dict[str, tuple[tuple, int]] = {}


def val_documents(folder: str | os.PathLike, constellation: str | None = None) -> list[str]:
    """The held-out documents of one constellation of the data folder (default: of all), in
    the order they were written. Each document in a shard is followed by the EOS id."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if constellation is not None and constellation not in manifest.get("constellations", {}):
        raise UserError(f"the data in {folder} holds no constellation {constellation!r} "
                        f"(it holds {', '.join(sorted(manifest.get('constellations', {})))})")
    entries = [e for e in manifest["val"] if constellation is None or e["path"].startswith(f"{shard_folder(constellation)}/")]
    sp = load_tokenizer(folder / manifest["tokenizer"]["file"])
    docs, carry = [], np.zeros(0, dtype="<u2")
    for entry in entries:  # a document may run on into the next shard
        ids = np.concatenate([carry, np.fromfile(folder / entry["path"], dtype="<u2")])
        ends = np.flatnonzero(ids == EOS_ID)
        for start, end in zip(np.concatenate([[0], ends[:-1] + 1]), ends):
            docs.append(sp.decode(ids[start:end].tolist()))
        carry = ids[ends[-1] + 1:] if len(ends) else ids
    return docs


def val_bytes(folder: str | os.PathLike) -> int:
    """The UTF-8 bytes of the data folder's held-out text: the manifest's count, or for a
    folder prepared before manifests kept it, counted from the decoded shards (once per
    process and manifest)."""
    manifest = read_manifest(folder)
    if isinstance(manifest.get("val_bytes"), int):
        return manifest["val_bytes"]
    key = stat_key(Path(folder) / MANIFEST)
    hit = _bytes_cache.get(str(folder))
    if hit is None or hit[0] != key:
        hit = _bytes_cache[str(folder)] = (key, sum(len(d.encode("utf-8")) for d in val_documents(folder)))
    return hit[1]
