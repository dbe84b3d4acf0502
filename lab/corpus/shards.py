"""The held-out split and the token shards: each constellation's documents tokenized into
flat little-endian uint16 `train_NNNN.bin` / `val_NNNN.bin` files, each document followed
by the EOS id."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import sentencepiece as spm

from lab.config import UserError
from lab.corpus.constellations import Constellation, Document, Scan
from lab.corpus.tokenizer import EOS_ID
from lab.corpus.folders import Progress, bar as progress_bar

SHARD_TOKENS = 100_000_000  # at most this many tokens per .bin file
ENCODE_BATCH_CHARS = 8_000_000

# The held-out split: whole documents, chosen by a hash of their text, ~5% of the text,
# at least VAL_MIN_BYTES where that stays under VAL_MAX_FRACTION of the constellation.
VAL_FRACTION = 0.05
VAL_MIN_BYTES = 32_000  # ~5-8 thousand tokens at vocab 4000 (English ~4, Russian ~6 bytes a token)
VAL_MAX_FRACTION = 0.2
# Part of val_set: changing how val is chosen or how shards are laid out must change it.
SPLIT_RULE = "whole-docs-by-sha256/5%/eos-after-doc/v1"

# --- the held-out split -------------------------------------------------------------------

@dataclass(frozen=True)
class Split:
    val_docs: frozenset[int]  # whole documents held out
    carve: int | None = None  # or: the document whose tail is held out ...
    carve_fraction: float = 0.0  # ... and how much of it


def choose_val(doc_hashes: list[bytes], doc_bytes: list[int]) -> Split:
    """Chooses the held-out documents: whole documents in the order of their text's hash,
    until ~5% of the text (at least VAL_MIN_BYTES where the data allows), skipping any
    that would overshoot. Identical documents go together, so none is on both sides.
    When whole documents cannot make a fair val set (one document, or a few large
    ones), the tail of the largest document is held out instead. Never empty."""
    total = sum(doc_bytes)
    target = max(VAL_FRACTION * total, min(VAL_MIN_BYTES, VAL_MAX_FRACTION * total))
    groups: dict[bytes, list[int]] = {}
    for i, h in enumerate(doc_hashes):
        groups.setdefault(h, []).append(i)
    chosen, size = [], 0
    for h in sorted(groups):
        group_bytes = sum(doc_bytes[i] for i in groups[h])
        if size + group_bytes <= 1.5 * target:
            chosen += groups[h]
            size += group_bytes
            if size >= target:
                break
    if size >= 0.5 * target and len(chosen) < len(doc_bytes):
        return Split(frozenset(chosen))
    largest = max(range(len(doc_bytes)), key=lambda i: (doc_bytes[i], doc_hashes[i]))
    return Split(frozenset(), largest, min(0.5, target / doc_bytes[largest]))


# --- shards -------------------------------------------------------------------------------

class ShardWriter:
    """Appends tokens to <dir>/<kind>_0000.bin, _0001.bin, ... of at most `max_tokens`
    each, hashing as it writes."""

    def __init__(self, root: Path, rel_dir: str, kind: str, max_tokens: int | None = None):
        self.root, self.rel_dir, self.kind = root, rel_dir, kind
        self.max_tokens = max_tokens or SHARD_TOKENS
        self.entries: list[dict] = []
        self._file = None
        self._hash = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype="<u2")
        while len(ids):
            if self._file is None or self.entries[-1]["tokens"] >= self.max_tokens:
                self._open_next()
            room = self.max_tokens - self.entries[-1]["tokens"]
            part, ids = ids[:room], ids[room:]
            data = part.tobytes()
            self._file.write(data)
            self._hash.update(data)
            self.entries[-1]["tokens"] += len(part)

    def _open_next(self) -> None:
        self._finish()
        rel = f"{self.rel_dir}/{self.kind}_{len(self.entries):04d}.bin"
        (self.root / self.rel_dir).mkdir(parents=True, exist_ok=True)
        self._file = open(self.root / rel, "wb")
        self._hash = hashlib.sha256()
        self.entries.append({"path": rel, "tokens": 0, "sha256": ""})

    def _finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self.entries[-1]["sha256"] = self._hash.hexdigest()
            self._file = None

    def close(self) -> list[dict]:
        self._finish()
        return self.entries


def _encode(sp: spm.SentencePieceProcessor, texts: list[str]) -> list[np.ndarray]:
    """Token ids of each text. Very long texts are encoded in pieces cut after a newline:
    no piece holds a newline, so the cut changes nothing and memory stays bounded."""
    pieces, owner = [], []
    for i, text in enumerate(texts):
        for part in _cut_after_newlines(text, ENCODE_BATCH_CHARS):
            pieces.append(part)
            owner.append(i)
    ids = sp.encode(pieces, num_threads=min(8, os.cpu_count() or 1)) if pieces else []
    out: list[list[np.ndarray]] = [[] for _ in texts]
    for i, part_ids in zip(owner, ids):
        out[i].append(np.asarray(part_ids, dtype="<u2"))
    return [np.concatenate(parts) if parts else np.zeros(0, "<u2") for parts in out]


def _cut_after_newlines(text: str, limit: int) -> Iterator[str]:
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit) + 1
        if cut <= 0:
            break  # one enormous line: encode it whole
        yield text[:cut]
        text = text[cut:]
    yield text


def _batches(docs: Iterable[Document], chars: int) -> Iterator[list[Document]]:
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc.text)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def write_constellation(c: Constellation, s: Scan, sp: spm.SentencePieceProcessor, root: Path,
                         progress: Progress) -> tuple[list[dict], list[dict], int]:
    """Tokenizes one constellation into its train and val shards; returns their entries and
    the UTF-8 bytes of the held-out text (bits per byte on val need them)."""
    split = choose_val(s.doc_hashes, s.doc_bytes)
    train, val = ShardWriter(root, c.name, "train"), ShardWriter(root, c.name, "val")
    eos = np.array([EOS_ID], dtype="<u2")
    index, val_bytes = 0, 0
    with progress_bar(progress, f"tokenizing {c.name} into shards", s.bytes) as bar:
        for batch in _batches(c.documents(), ENCODE_BATCH_CHARS):
            for doc, ids in zip(batch, _encode(sp, [d.text for d in batch])):
                data = doc.text.encode("utf-8")
                if index >= len(s.doc_hashes) or hashlib.sha256(data).digest() != s.doc_hashes[index]:
                    raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared "
                                    f"(at {doc.name}): run lab prepare again")
                if index == split.carve:
                    val_bytes += _write_carved(ids, split.carve_fraction, train, val, c.name, sp)
                elif index in split.val_docs:
                    val.write(np.concatenate([ids, eos]))
                    val_bytes += len(data)
                else:
                    train.write(np.concatenate([ids, eos]))
                index += 1
                bar.update(len(data))
    if index != len(s.doc_hashes):
        raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared: run lab prepare again")
    return train.close(), val.close(), val_bytes


def _write_carved(ids: np.ndarray, fraction: float, train: ShardWriter, val: ShardWriter, name: str,
                  sp: spm.SentencePieceProcessor) -> int:
    """Holds out the document's tail; returns the bytes of the text it decodes to."""
    if len(ids) < 2:
        raise UserError(f"constellation {name!r} is too small to hold out a val set: add text")
    k = min(len(ids) - 1, max(1, round(len(ids) * fraction)))
    eos = np.array([EOS_ID], dtype="<u2")
    train.write(np.concatenate([ids[:-k], eos]))
    val.write(np.concatenate([ids[-k:], eos]))
    return len(sp.decode(ids[-k:].tolist()).encode("utf-8"))
