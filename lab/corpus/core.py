"""Constellations, the tokenizer trained on them, and the token shards a run reads.

A *constellation* is a named group of text sources (files, folders, globs, built-in
texts), declared in `$LAB_HOME/constellations.ini`. `prepare(names)` turns a selection
of constellations into one self-contained data folder, `$LAB_HOME/data/<data_id>/`:

    manifest.json        what is here, with sizes and hashes (see `prepare`)
    tokenizer.model      the sentencepiece model that made the tokens
    <name>/train_0000.bin, <name>/val_0000.bin, ...
                         flat little-endian uint16 token arrays, each document
                         followed by the EOS id; readable with np.memmap alone

The folder is what gets uploaded as a Kaggle dataset; the training notebook needs only
numpy (and sentencepiece to print samples) to read it.

Everything is content-addressed: a constellation's content hash covers its text, a
tokenizer's id covers its model bytes, and `val_set` (the id of the held-out set) covers
the selected constellations' hashes and the tokenizer. Preparing unchanged data again
finds the existing folder and does nothing.
"""
from __future__ import annotations

import configparser
import contextlib
import glob
import hashlib
import io
import json
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import sentencepiece as spm
from tqdm.auto import tqdm

from lab import home
from lab.corpus.manifests import FORMAT, prepared_folders, read_manifest
from lab.corpus.builtin import BUILTINS, DEFAULT_CONSTELLATIONS_INI
from lab.config import UserError

DEFAULT_VOCAB = 4000
MAX_VOCAB = 65535  # token ids are stored as uint16
SHARD_TOKENS = 100_000_000  # at most this many tokens per .bin file
EOS_ID = 2  # sentencepiece ids: 0 unk, 1 bos, 2 eos, then the 256 byte pieces

# The held-out split: whole documents, chosen by a hash of their text, ~5% of the text,
# at least VAL_MIN_BYTES where that stays under VAL_MAX_FRACTION of the constellation.
VAL_FRACTION = 0.05
VAL_MIN_BYTES = 32_000  # ~5-8 thousand tokens at vocab 4000 (English ~4, Russian ~6 bytes a token)
VAL_MAX_FRACTION = 0.2
# Part of val_set: changing how val is chosen or how shards are laid out must change it.
SPLIT_RULE = "whole-docs-by-sha256/5%/eos-after-doc/v1"

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text", ".org", ".tex")
GLOB_MAGIC = re.compile(r"[*?[]")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
INI_KEYS = ("sources", "description", "licence", "license", "source")

# Tokenizer training. sentencepiece stores num_threads in the model file, so it is fixed
# (not the machine's core count) to keep the model bytes the same everywhere.
TRAIN_THREADS = 4
TRAIN_SEED = 1337
MAX_LINE_CHARS = 4096  # longer lines are cut for training (4096 chars <= 16384 UTF-8 bytes)
MAX_SENTENCE_BYTES = 16384
MAX_TRAINING_SENTENCES = 5_000_000  # above this sentencepiece samples (seeded, so deterministic)
ENCODE_BATCH_CHARS = 8_000_000


# --- constellations -----------------------------------------------------------------------

@dataclass(frozen=True)
class Document:
    name: str  # where it came from: a path, or builtin:NAME/part
    text: str


@dataclass
class Constellation:
    name: str
    sources: list[str]
    description: str = ""
    licence: str = ""
    source: str = ""

    def documents(self) -> Iterator[Document]:
        """Every non-empty document of every source, in a fixed order."""
        for spec in self.sources:
            yield from source_documents(spec, self.name)

    def provenance(self) -> str:
        """Where the text came from, for the manifest: the file's `source` key, plus the
        exact origin (with versions) of built-in texts."""
        parts = [self.source] if self.source else []
        for spec in self.sources:
            if spec.startswith("builtin:") and spec[8:] in BUILTINS:
                parts.append(BUILTINS[spec[8:]].provenance())
            elif not self.source:
                parts.append(f"local files: {spec}")
        return "; ".join(parts)


def load_constellations() -> dict[str, Constellation]:
    """The constellations declared in `$LAB_HOME/constellations.ini` (written with the
    built-in ones and explanatory comments on first use)."""
    path = home.constellations_file()
    if not path.exists():
        path.write_text(DEFAULT_CONSTELLATIONS_INI, encoding="utf-8")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as e:
        raise UserError(f"{path} cannot be read: {' '.join(str(e).split())}; fix the file") from None
    out = {}
    for name in parser.sections():
        section = parser[name]
        where = f"constellation [{name}] in {path}"
        _check_name(name, where)
        unknown = sorted(set(section) - set(INI_KEYS))
        if unknown:
            raise UserError(f"{where} has unknown key(s) {', '.join(unknown)}; "
                            f"the keys are sources, description, licence, source")
        sources = [line.strip() for line in section.get("sources", "").splitlines() if line.strip()]
        if not sources:
            raise UserError(f"{where} has no sources: add 'sources = PATH' (files, folders, globs or builtin:NAME)")
        out[name] = Constellation(name=name, sources=sources, description=section.get("description", ""),
                                  licence=section.get("licence", section.get("license", "")),
                                  source=section.get("source", ""))
    return out


def get_constellations(names: Iterable[str]) -> dict[str, Constellation]:
    """The named constellations; an unknown name is an error that lists the known ones."""
    known = load_constellations()
    missing = [n for n in names if n not in known]
    if missing:
        raise UserError(f"unknown constellation(s): {', '.join(missing)}; known: {', '.join(known) or '(none)'} "
                        f"(declare new ones in {home.constellations_file()})")
    return {n: known[n] for n in names}


def add_constellation(name: str, sources: list[str], description: str = "", licence: str = "",
                      source: str = "") -> Constellation:
    """Declares a new constellation in `constellations.ini` (appended, so the file's
    comments stay). Every source must already resolve to text; relative paths are taken
    from the lab home."""
    known = load_constellations()
    path = home.constellations_file()
    _check_name(name, f"constellation name {name!r}")
    if name in known:
        raise UserError(f"constellation {name!r} already exists in {path}: pick another name or edit it there")
    sources = [s.strip() for s in sources if s and s.strip()]
    if not sources:
        raise UserError(f"constellation {name!r} needs at least one source (a file, a folder, a glob or builtin:NAME)")
    for spec in sources:
        if "\n" in spec:
            raise UserError(f"source {spec!r} of constellation {name!r} holds a line break: give one path per source")
        if spec.startswith("builtin:"):
            _builtin(spec, name)
        else:
            source_files(spec, name)  # raises when it matches nothing
    lines = [f"\n[{name}]"]
    if description:
        lines.append(f"description = {' '.join(description.split())}")
    lines += ["sources ="] + [f"    {s}" for s in sources]
    for key, value in (("licence", licence), ("source", source)):
        if value:
            lines.append(f"{key} = {' '.join(value.split())}")
    text = path.read_text(encoding="utf-8")
    path.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return load_constellations()[name]


def _check_name(name: str, where: str) -> None:
    # Names become folder names and are joined with '+' in data ids.
    if not NAME_PATTERN.match(name):
        raise UserError(f"{where}: a name is letters, digits, '.', '_' and '-', starting with a letter or digit")


def _builtin(spec: str, constellation: str):
    name = spec[len("builtin:"):]
    if name not in BUILTINS:
        raise UserError(f"constellation {constellation!r}: unknown built-in text {spec!r}; built-in texts: "
                        f"{', '.join('builtin:' + b for b in BUILTINS)}")
    return BUILTINS[name]


def source_files(spec: str, constellation: str) -> list[Path]:
    """The files a path, folder or glob source stands for, sorted; an error when none."""
    lab_home = home.lab_home()
    expanded = os.path.expanduser(spec)
    pattern = expanded if os.path.isabs(expanded) else str(lab_home / expanded)
    if GLOB_MAGIC.search(expanded):
        # The lab home's own path may hold [ or *; only the source's part is a pattern.
        full = expanded if os.path.isabs(expanded) else os.path.join(glob.escape(str(lab_home)), expanded)
        matches = [Path(p) for p in sorted(glob.glob(full, recursive=True))]
        files = [f for p in matches for f in ([p] if p.is_file() else _folder_files(p) if p.is_dir() else [])]
    elif Path(pattern).is_dir():
        files = _folder_files(Path(pattern))
    elif Path(pattern).is_file():
        files = [Path(pattern)]
    else:
        files = []
    if not files:
        kinds = f"text files ({' '.join(TEXT_SUFFIXES)})" if Path(pattern).is_dir() else "files"
        raise UserError(f"constellation {constellation!r}: source {spec!r} matches no {kinds} (looked at {pattern}); "
                        f"fix it in {home.constellations_file()} (relative paths start at the lab home {lab_home})")
    return files


def _folder_files(folder: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names)
                  if not n.startswith(".") and n.lower().endswith(TEXT_SUFFIXES)]
    return sorted(files)


def source_documents(spec: str, constellation: str) -> Iterator[Document]:
    """The non-empty documents of one source: each file is one document."""
    if spec.startswith("builtin:"):
        for name, text in _builtin(spec, constellation).documents():
            if text:
                yield Document(name, text)
        return
    lab_home = home.lab_home()
    for path in source_files(spec, constellation):
        text = _read_text(path, constellation)
        if text:
            shown = path.relative_to(lab_home) if path.is_relative_to(lab_home) else path
            yield Document(str(shown), text)


def _read_text(path: Path, constellation: str) -> str:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a BOM is not text
    except UnicodeDecodeError as e:
        raise UserError(f"constellation {constellation!r}: {path} is not UTF-8 text (bad byte at {e.start}): "
                        f"convert it to UTF-8 or leave it out of the sources") from None
    return text.replace("\r\n", "\n")  # the same text from Windows and Unix gives the same tokens


# --- reading: content hashes --------------------------------------------------------------

@dataclass
class Scan:
    """What one reading of a constellation learned: sizes and hashes, no text."""
    name: str
    sources: list[dict]  # {"path", "bytes", "sha256"} per source
    bytes: int
    sha256: str  # the constellation's content hash
    doc_hashes: list[bytes] = field(repr=False)  # sha256 digest of each document's text
    doc_bytes: list[int] = field(repr=False)


def _hash_document(h: "hashlib._Hash", data: bytes) -> None:
    # Length-prefixed so that moving text between documents changes the hash.
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def scan(c: Constellation, progress: bool = False) -> Scan:
    """Reads a constellation once for its content hash, sizes and per-document hashes.
    The hash covers the documents' text and order, not file names or times."""
    sources, doc_hashes, doc_bytes = [], [], []
    whole = hashlib.sha256()
    with tqdm(desc=f"reading {c.name}", unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
              file=sys.stderr) as bar:
        for spec in c.sources:
            h, size = hashlib.sha256(), 0
            for doc in source_documents(spec, c.name):
                data = doc.text.encode("utf-8")
                _hash_document(h, data)
                doc_hashes.append(hashlib.sha256(data).digest())
                doc_bytes.append(len(data))
                size += len(data)
                bar.update(len(data))
            sources.append({"path": spec, "bytes": size, "sha256": h.hexdigest()})
            whole.update(h.digest())
    total = sum(doc_bytes)
    if not total:
        raise UserError(f"constellation {c.name!r} holds no text (sources: {', '.join(c.sources)}); "
                        f"add text files to it or leave it out")
    return Scan(c.name, sources, total, whole.hexdigest(), doc_hashes, doc_bytes)


# --- the tokenizer ------------------------------------------------------------------------

@dataclass
class TokenizerInfo:
    tok_id: str
    folder: Path
    sha256: str  # of tokenizer.model
    vocab: int
    trained_on: dict[str, str]  # constellation -> content sha256

    @property
    def model_file(self) -> Path:
        return self.folder / "tokenizer.model"


def _training_sentences(texts: Iterable[str]) -> Iterator[str]:
    """sentencepiece trains on lines and skips any over max_sentence_length, so lines are
    cut (at a space where there is one) rather than lost. Newlines are never inside a
    piece; they come out as the byte piece <0x0A>."""
    for text in texts:
        for line in text.split("\n"):
            while len(line) > MAX_LINE_CHARS:
                cut = line.rfind(" ", MAX_LINE_CHARS // 2, MAX_LINE_CHARS) + 1 or MAX_LINE_CHARS
                yield line[:cut]
                line = line[cut:]
            if line:
                yield line


def train_tokenizer(texts: Iterable[str], vocab: int = DEFAULT_VOCAB) -> bytes:
    """Trains a sentencepiece BPE model on the texts; returns the model file's bytes.

    The settings give back any text exactly, decode(encode(text)) == text: no
    normalization, whitespace kept as it is (runs of spaces become pieces), no dummy
    space in front, and characters outside the vocabulary fall back to their UTF-8 bytes.
    The same texts give the same bytes (fixed seed and thread count)."""
    _check_vocab(vocab)
    spm.set_random_generator_seed(TRAIN_SEED)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_training_sentences(texts), model_writer=model,
            vocab_size=vocab, model_type="bpe", byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            allow_whitespace_only_pieces=True, split_digits=True, character_coverage=0.9995,
            unk_id=0, bos_id=1, eos_id=EOS_ID, pad_id=-1,
            max_sentence_length=MAX_SENTENCE_BYTES, input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True, num_threads=TRAIN_THREADS, minloglevel=2)
    except RuntimeError as e:
        raise _vocab_error(str(e), vocab) from None
    return model.getvalue()


def _vocab_error(message: str, vocab: int) -> Exception:
    high = re.search(r"Vocabulary size too high \((\d+)\).*?<= (\d+)", message)
    if high:
        return UserError(f"vocab {vocab} is too large for this text: it allows at most {high.group(2)}; "
                         f"choose --vocab {high.group(2)} or less, or add text")
    low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message)
    if low:
        return UserError(f"vocab {vocab} is too small for this text's {low.group(2)} characters plus the 256 byte "
                         f"pieces: choose a larger --vocab")
    return RuntimeError(f"sentencepiece could not train the tokenizer: {message}")


def _check_vocab(vocab: int) -> None:
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise UserError(f"vocab must be a whole number (got {vocab!r})")
    if vocab > MAX_VOCAB:
        raise UserError(f"vocab {vocab} is above {MAX_VOCAB}: tokens are stored as uint16; choose a smaller vocab")
    if vocab < 300:
        raise UserError(f"vocab {vocab} is too small: 259 ids go to unk, bos, eos and the 256 byte pieces; "
                        f"choose at least 300 (the lab uses {DEFAULT_VOCAB})")


def list_tokenizers() -> list[TokenizerInfo]:
    """The tokenizers in `$LAB_HOME/tokenizers/`, skipping unfinished or damaged ones."""
    out = []
    root = home.tokenizers_dir()
    for meta_file in sorted(root.glob("*/tokenizer.json")) if root.is_dir() else []:
        folder = meta_file.parent
        if folder.name.startswith("."):
            continue
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            info = TokenizerInfo(meta["tok_id"], folder, meta["sha256"], int(meta["vocab"]), dict(meta["trained_on"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if info.model_file.is_file():
            out.append(info)
    return out


def reusable_tokenizer(content: dict[str, str], vocab: int) -> TokenizerInfo | None:
    """The reuse rule: a tokenizer of the same vocab whose training constellations are
    all in the selection with the same content hashes; the one trained on the most.
    Keeping the tokenizer when constellations are added keeps a checkpoint's embeddings
    meaningful on the larger data."""
    fits = [t for t in list_tokenizers()
            if t.vocab == vocab and t.trained_on and all(content.get(n) == h for n, h in t.trained_on.items())]
    fits.sort(key=lambda t: (-len(t.trained_on), t.tok_id))
    return fits[0] if fits else None


def _store_tokenizer(model: bytes, content: dict[str, str], vocab: int) -> TokenizerInfo:
    sha = hashlib.sha256(model).hexdigest()
    tok_id = f"{'+'.join(sorted(content))}-{vocab}-{sha[:8]}"
    root = home.tokenizers_dir()
    meta = {"tok_id": tok_id, "sha256": sha, "vocab": vocab, "trained_on": dict(sorted(content.items()))}
    if not (root / tok_id / "tokenizer.json").is_file():
        with _atomic_folder(root, tok_id) as tmp:
            (tmp / "tokenizer.model").write_bytes(model)
            (tmp / "tokenizer.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return TokenizerInfo(tok_id, root / tok_id, sha, vocab, meta["trained_on"])


def _tokenizer_for(chosen: dict[str, Constellation], scans: dict[str, Scan], vocab: int, tokenizer: str,
                   progress: bool) -> TokenizerInfo:
    """The tokenizer for a selection: pinned by id, reused by the reuse rule ("auto"), or
    trained on the selection ("new", or "auto" when nothing can be reused)."""
    content = {n: s.sha256 for n, s in scans.items()}
    if tokenizer not in ("auto", "new"):
        return _pinned_tokenizer(tokenizer)
    found = reusable_tokenizer(content, vocab) if tokenizer == "auto" else _own_tokenizer(content, vocab)
    if found:
        _say(progress, f"tokenizer: reusing {found.tok_id} (trained on {', '.join(found.trained_on)})")
        return found
    _say(progress, f"tokenizer: training a BPE tokenizer, vocab {vocab}, on {', '.join(chosen)}")
    with tqdm(desc="reading for the tokenizer", unit="B", unit_scale=True, unit_divisor=1024,
              total=sum(s.bytes for s in scans.values()), disable=not progress, file=sys.stderr) as bar:
        def texts() -> Iterator[str]:
            for c in chosen.values():
                for doc in c.documents():
                    bar.update(len(doc.text.encode("utf-8")))
                    yield doc.text
        model = train_tokenizer(texts(), vocab)
    return _store_tokenizer(model, content, vocab)


def _own_tokenizer(content: dict[str, str], vocab: int) -> TokenizerInfo | None:
    """A tokenizer trained on exactly this selection, if one was trained before."""
    return next((t for t in list_tokenizers() if t.vocab == vocab and t.trained_on == content), None)


def _pinned_tokenizer(tok_id: str) -> TokenizerInfo:
    tokenizers = list_tokenizers()
    for t in tokenizers:
        if t.tok_id == tok_id:
            return t
    raise UserError(f"no tokenizer {tok_id!r} in {home.tokenizers_dir()}; there are: "
                    f"{', '.join(t.tok_id for t in tokenizers) or '(none)'}; or use 'auto' or 'new'")


def load_tokenizer(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    """A sentencepiece processor from a data folder, a tokenizer folder or a .model file."""
    path = Path(path)
    model = path / "tokenizer.model" if path.is_dir() else path
    if not model.is_file():
        raise UserError(f"no tokenizer at {model}: prepare the data first (lab prepare -c NAME)")
    return spm.SentencePieceProcessor(model_file=str(model))


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


def _write_constellation(c: Constellation, s: Scan, sp: spm.SentencePieceProcessor, root: Path,
                         progress: bool) -> tuple[list[dict], list[dict]]:
    """Tokenizes one constellation into its train and val shards; returns their entries."""
    split = choose_val(s.doc_hashes, s.doc_bytes)
    train, val = ShardWriter(root, c.name, "train"), ShardWriter(root, c.name, "val")
    eos = np.array([EOS_ID], dtype="<u2")
    index = 0
    with tqdm(desc=f"tokenizing {c.name} into shards", total=s.bytes, unit="B", unit_scale=True,
              unit_divisor=1024, disable=not progress, file=sys.stderr) as bar:
        for batch in _batches(c.documents(), ENCODE_BATCH_CHARS):
            for doc, ids in zip(batch, _encode(sp, [d.text for d in batch])):
                data = doc.text.encode("utf-8")
                if index >= len(s.doc_hashes) or hashlib.sha256(data).digest() != s.doc_hashes[index]:
                    raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared "
                                    f"(at {doc.name}): run lab prepare again")
                if index == split.carve:
                    _write_carved(ids, split.carve_fraction, train, val, c.name)
                else:
                    (val if index in split.val_docs else train).write(np.concatenate([ids, eos]))
                index += 1
                bar.update(len(data))
    if index != len(s.doc_hashes):
        raise UserError(f"the text of constellation {c.name!r} changed while it was being prepared: run lab prepare again")
    return train.close(), val.close()


def _write_carved(ids: np.ndarray, fraction: float, train: ShardWriter, val: ShardWriter, name: str) -> None:
    if len(ids) < 2:
        raise UserError(f"constellation {name!r} is too small to hold out a val set: add text")
    k = min(len(ids) - 1, max(1, round(len(ids) * fraction)))
    eos = np.array([EOS_ID], dtype="<u2")
    train.write(np.concatenate([ids[:-k], eos]))
    val.write(np.concatenate([ids[-k:], eos]))


# --- prepared data folders ----------------------------------------------------------------

def val_set_id(content: dict[str, str], tokenizer_sha256: str) -> str:
    """16 hex chars that change exactly when the selected data changes: the set of
    constellations, their content, the tokenizer (or the split rule)."""
    key = json.dumps({"constellations": dict(sorted(content.items())), "tokenizer": tokenizer_sha256,
                      "split": SPLIT_RULE}, sort_keys=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _matching_folder(content: dict[str, str], vocab: int | None, tokenizer: str = "auto") -> Path | None:
    for folder, m in prepared_folders():
        have = {n: c.get("sha256") for n, c in m.get("constellations", {}).items()}
        tok = m.get("tokenizer", {})
        if have != content:
            continue
        if tokenizer == "new" and sorted(tok.get("trained_on", [])) != sorted(content):
            continue
        if tokenizer not in ("auto", "new"):
            if tok.get("tok_id") == tokenizer:
                return folder
            continue
        if vocab is None or tok.get("vocab") == vocab:
            return folder
    return None


def find_prepared(names: list[str], vocab: int | None = None) -> Path | None:
    """The data folder already prepared for exactly these constellations with their
    current content (and this vocab, if given), newest first; None when there is none."""
    names = _clean_names(names)
    chosen = get_constellations(names)
    content = {n: scan(c).sha256 for n, c in chosen.items()}
    return _matching_folder(content, vocab)


def prepare(names: list[str], vocab: int = DEFAULT_VOCAB, progress: bool = True, tokenizer: str = "auto") -> Path:
    """Prepares the selected constellations for training; returns the data folder.

    Reads the sources, picks or trains the tokenizer, holds
    out a val set per constellation (`choose_val`) and writes the shards and
    `manifest.json`. `tokenizer`: "auto" follows the reuse rule (`reusable_tokenizer`);
    "new" uses one trained on exactly this selection (training it if need be), which
    tokenizes best; a tok_id uses that tokenizer (e.g. a checkpoint's, to continue it on
    more data) and its vocab, whatever `vocab` says.
    Unchanged data is found and returned without writing anything. The
    folder is written under a temporary name and renamed into place, so an interrupted
    prepare leaves no half-written data folder."""
    names = _clean_names(names)
    _check_vocab(vocab)
    chosen = get_constellations(names)
    scans = {n: scan(c, progress) for n, c in chosen.items()}
    content = {n: s.sha256 for n, s in scans.items()}
    existing = _matching_folder(content, vocab, tokenizer)
    if existing:
        _say(progress, f"already prepared: {existing}")
        return existing
    tok = _tokenizer_for(chosen, scans, vocab, tokenizer, progress)
    val_set = val_set_id(content, tok.sha256)
    data_id = f"{'+'.join(names)}-{val_set[:8]}"
    final = home.data_dir() / data_id
    if (final / "manifest.json").is_file():
        return final
    if final.exists():
        raise UserError(f"{final} exists but holds no manifest.json (not written by lab prepare): "
                        f"move it away or delete it, then prepare again")
    sp = load_tokenizer(tok.model_file)
    with _atomic_folder(home.data_dir(), data_id) as tmp:
        shutil.copyfile(tok.model_file, tmp / "tokenizer.model")
        manifest = _write_shards(chosen, scans, sp, tmp, progress)
        manifest.update(data_id=data_id, val_set=val_set, tokenizer={
            "file": "tokenizer.model", "sha256": tok.sha256, "vocab": tok.vocab, "eos_id": EOS_ID,
            "tok_id": tok.tok_id, "trained_on": sorted(tok.trained_on)})
        _write_manifest(tmp, manifest)
    _say(progress, f"prepared: {final}")
    return final


def _write_shards(chosen: dict[str, Constellation], scans: dict[str, Scan], sp: spm.SentencePieceProcessor,
                  root: Path, progress: bool) -> dict:
    constellations, train, val = {}, [], []
    for name, c in chosen.items():
        s = scans[name]
        t_entries, v_entries = _write_constellation(c, s, sp, root, progress)
        train += t_entries
        val += v_entries
        constellations[name] = {
            "sources": s.sources, "bytes": s.bytes, "sha256": s.sha256, "documents": len(s.doc_bytes),
            "train_tokens": sum(e["tokens"] for e in t_entries), "val_tokens": sum(e["tokens"] for e in v_entries),
            "source": c.provenance(), "licence": c.licence or "unknown: set 'licence =' in constellations.ini"}
    return {"format": FORMAT, "data_id": "", "constellations": constellations, "tokenizer": {},
            "train": train, "val": val,
            "train_tokens": sum(e["tokens"] for e in train), "val_tokens": sum(e["tokens"] for e in val),
            "shortest_val_tokens": min(e["tokens"] for e in val), "val_set": "", "dtype": "uint16",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _atomic_folder(parent: Path, name: str) -> Iterator[Path]:
    """Yields a temporary folder beside `parent/name` and renames it into place when the
    block succeeds; on failure it is removed. If another process finished the same
    folder first, theirs is kept (same content, by construction)."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.rename(tmp, parent / name)
        except OSError:
            if not (parent / name).is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _clean_names(names: Iterable[str]) -> list[str]:
    """Sorted, without duplicates: the same selection always gives the same data id."""
    if isinstance(names, str):
        names = [names]
    out = sorted({n.strip() for n in names if n and n.strip()})
    if not out:
        raise UserError("choose at least one constellation (lab prepare --list shows them)")
    return out


def _say(progress: bool, message: str) -> None:
    if progress:
        tqdm.write(message, file=sys.stderr)
