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
from lab.corpus.manifests import shard_folder

SHARD_TOKENS = 100_000_000  # at most this many tokens per .bin file
ENCODE_BATCH_CHARS = 8_000_000

# The held-out split: a share of each source, ~5% of the text (at least VAL_MIN_BYTES where that
# stays under VAL_MAX_FRACTION of the constellation). A source's documents go to val whole (by a
# hash of their text) only where that share holds many of them; a document too large for that, or
# a source of few documents, gives the tail of each of its documents, cut at a line.
VAL_FRACTION = 0.05
VAL_MIN_BYTES = 32_000  # ~5-8 thousand tokens at vocab 4000 (English ~4, Russian ~6 bytes a token)
VAL_MAX_FRACTION = 0.2
# Whole documents only where a source's val share holds at least this many of its largest: fewer,
# and which ones land in val is luck (six tales, one large file: the tales whole, or none of them).
WHOLE_DOCS_PER_SHARE = 4
# Part of val_set: changing how val is chosen or how shards are laid out must change it.
SPLIT_RULE = "share-of-each-source/small-docs-whole-by-sha256/tails-cut-at-a-line/eos-after-part/v2"


@dataclass(frozen=True)
class Split:
    """Which documents give what to val: `whole` ones entirely, `tails` ones the last `fraction`
    of their bytes (cut at a line, `tail_start`); the rest train whole."""
    fraction: float
    whole: frozenset[int] = frozenset()
    tails: frozenset[int] = frozenset()


def val_fraction(total_bytes: int) -> float:
    """The share of a constellation's text held out."""
    target = max(VAL_FRACTION * total_bytes, min(VAL_MIN_BYTES, VAL_MAX_FRACTION * total_bytes))
    return target / max(1, total_bytes)


def choose_val(doc_hashes: list[bytes], doc_bytes: list[int], doc_sources: list[int] | None = None) -> Split:
    """The held-out split of a constellation: the same share (`val_fraction`) of every source
    (`doc_sources`: the source of each document; none: one source). Within a source, the
    documents small against its share (`_whole_pool`) go whole, in the order of their text's
    hash, until the share; the others give their tails. Identical documents share one fate,
    wherever they stand, so no text is on both sides. Deterministic: the same text, the same split."""
    fraction = val_fraction(sum(doc_bytes))
    sources = doc_sources or [0] * len(doc_bytes)
    whole: set[int] = set()
    tails: set[int] = set()
    for source in sorted(set(sources)):
        docs = [i for i, s in enumerate(sources) if s == source]
        pool = _whole_pool(docs, doc_bytes, fraction)
        chosen = _whole_docs(pool, doc_hashes, doc_bytes, fraction)
        if chosen is None:  # the pool's documents cannot make its share whole: their tails instead
            chosen, pool = set(), []
        whole |= chosen
        tails |= set(docs) - set(pool)
    fate: dict[bytes, int] = {}  # a text's fate where its copies differ: whole (0) over tail (1) over train (2)
    for i, h in enumerate(doc_hashes):
        fate[h] = min(fate.get(h, 2), 0 if i in whole else 1 if i in tails else 2)
    return Split(fraction, frozenset(i for i, h in enumerate(doc_hashes) if fate[h] == 0),
                 frozenset(i for i, h in enumerate(doc_hashes) if fate[h] == 1))


def _whole_pool(docs: list[int], doc_bytes: list[int], fraction: float) -> list[int]:
    """The documents of one source that may go to val whole: its largest leave the pool until
    the pool's share holds WHOLE_DOCS_PER_SHARE of the largest left."""
    pool = sorted(docs, key=lambda i: doc_bytes[i])
    size = sum(doc_bytes[i] for i in pool)
    while pool and doc_bytes[pool[-1]] * WHOLE_DOCS_PER_SHARE > fraction * size:
        size -= doc_bytes[pool.pop()]
    return pool


def _whole_docs(pool: list[int], doc_hashes: list[bytes], doc_bytes: list[int], fraction: float) -> set[int] | None:
    """Whole documents of the pool, by their hash, until the pool's share (within half of it
    either way); None where they do not reach half of it."""
    target = fraction * sum(doc_bytes[i] for i in pool)
    groups: dict[bytes, list[int]] = {}
    for i in pool:
        groups.setdefault(doc_hashes[i], []).append(i)
    chosen, size = set(), 0
    for h in sorted(groups):
        group_bytes = sum(doc_bytes[i] for i in groups[h])
        if size + group_bytes <= 1.5 * target:
            chosen.update(groups[h])
            size += group_bytes
            if size >= target:
                break
    return chosen if pool and size >= 0.5 * target else None


def tail_start(data: bytes, fraction: float) -> int:
    """Where a document's held-out tail begins (a byte offset inside the UTF-8 text, never 0 nor
    the end): the last `fraction` of it, moved to the nearest line start within a quarter of the
    tail's length (8 bytes at least), else the nearest word start, else a character boundary.
    From the text alone, so every tokenizer holds out the same tail. 0 for a document of one
    character."""
    want = max(1, round(fraction * len(data)))
    at, reach = len(data) - want, max(8, want // 4)
    for sep in (b"\n", b" "):
        before, after = data.rfind(sep, max(1, at - reach), at + 1), data.find(sep, at, at + reach)
        near = [p + 1 for p in (before, after) if p >= 0 and 0 < p + 1 < len(data)]
        if near:
            return min(near, key=lambda p: (abs(p - at), p))
    at = min(max(at, 1), len(data) - 1) if len(data) > 1 else 0
    while 0 < at < len(data) and data[at] & 0xC0 == 0x80:  # inside a character: back to its first byte
        at -= 1
    return at


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


@dataclass
class SourceCounts:
    """What one source gave each side: UTF-8 bytes, tokens (each part's EOS counted), and how its
    documents were held out."""
    train_bytes: int = 0
    val_bytes: int = 0
    train_tokens: int = 0
    val_tokens: int = 0
    documents: int = 0
    val_whole: int = 0  # documents held out whole
    val_tails: int = 0  # documents whose tail is held out

    def record(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _parts(index: int, data: bytes, split: Split, counts: SourceCounts) -> list[tuple[str, str]]:
    """The (side, text) parts one document gives, in order; counts what went where."""
    counts.documents += 1
    cut = tail_start(data, split.fraction) if index in split.tails else 0
    if cut:
        counts.val_tails += 1
        counts.train_bytes += cut
        counts.val_bytes += len(data) - cut
        return [("train", data[:cut].decode("utf-8")), ("val", data[cut:].decode("utf-8"))]
    side = "val" if index in split.whole else "train"
    counts.val_whole += side == "val"
    setattr(counts, f"{side}_bytes", getattr(counts, f"{side}_bytes") + len(data))
    return [(side, data.decode("utf-8"))]


def write_constellation(c: Constellation, s: Scan, sp: spm.SentencePieceProcessor, root: Path,
                        progress: Progress) -> tuple[list[dict], list[dict], list[SourceCounts]]:
    """Tokenizes one constellation into its train and val shards (`choose_val`); returns their
    entries and what each source gave each side."""
    split = choose_val(s.doc_hashes, s.doc_bytes, s.doc_sources)
    folder = shard_folder(c.name)
    writers = {"train": ShardWriter(root, folder, "train"), "val": ShardWriter(root, folder, "val")}
    counts = [SourceCounts() for _ in s.sources]
    eos = np.array([EOS_ID], dtype="<u2")
    index = 0
    with progress_bar(progress, f"tokenizing {c.name} into shards", s.bytes) as bar:
        for batch in _batches(c.documents(), ENCODE_BATCH_CHARS):
            parts = []  # (source, side, text) of the batch's documents, in order
            for doc in batch:
                data = doc.text.encode("utf-8")
                if index >= len(s.doc_hashes) or hashlib.sha256(data).digest() != s.doc_hashes[index]:
                    raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared "
                                    f"(at {doc.name}): run lab prepare again")
                source = s.doc_sources[index]
                parts += [(source, side, text) for side, text in _parts(index, data, split, counts[source])]
                index += 1
                bar.update(len(data))
            for (source, side, _), ids in zip(parts, _encode(sp, [text for _, _, text in parts])):
                writers[side].write(np.concatenate([ids, eos]))
                setattr(counts[source], f"{side}_tokens", getattr(counts[source], f"{side}_tokens") + len(ids) + 1)
    if index != len(s.doc_hashes):
        raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared: run lab prepare again")
    train, val = writers["train"].close(), writers["val"].close()
    if not val:
        raise UserError(f"constellation {c.name!r} is too small to hold out a val set: add text",
                        ru=f"созвездие {c.name!r} слишком мало, чтобы отложить из него выборку val: добавьте текста")
    return train, val, counts

