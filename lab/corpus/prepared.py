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

import hashlib
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import sentencepiece as spm

from lab import home
from lab.config import UserError
from lab.corpus.constellations import Constellation, Scan, get_constellations, scan
from lab.corpus.folders import Progress, atomic_folder, say
from lab.corpus.manifests import FIRST_SPLIT_RULE, FORMAT, prepared_folders, write_manifest
from lab.corpus.shards import SPLIT_RULE, write_constellation
from lab.corpus.tokenizer import DEFAULT_VOCAB, EOS_ID, check_vocab, load_tokenizer, tokenizer_for

# --- prepared data folders ----------------------------------------------------------------

def val_set_id(content: dict[str, str], tokenizer_sha256: str) -> str:
    """16 hex chars that change exactly when the selected data changes: the set of
    constellations, their content, the tokenizer (or the split rule)."""
    key = json.dumps({"constellations": dict(sorted(content.items())), "tokenizer": tokenizer_sha256,
                      "split": SPLIT_RULE}, sort_keys=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _matching_folder(content: dict[str, str], vocab: int | None, tokenizer: str = "auto", fit: bool = False) -> Path | None:
    """The newest data folder of exactly this content, held out by this kit's split rule, with a
    tokenizer that answers the request (with `fit`, one fitted to the text from `vocab` counts)."""
    for folder, m in prepared_folders():
        have = {n: c.get("sha256") for n, c in m.get("constellations", {}).items()}
        tok = m.get("tokenizer", {})
        if have != content or m.get("split_rule", FIRST_SPLIT_RULE) != SPLIT_RULE:
            continue
        if tokenizer == "new" and sorted(tok.get("trained_on", [])) != sorted(content):
            continue
        if tokenizer not in ("auto", "new"):
            if tok.get("tok_id") == tokenizer:
                return folder
            continue
        if vocab is None or vocab == tok.get("vocab") or (fit and vocab == tok.get("asked_vocab")):
            return folder
    return None


def find_prepared(names: list[str], vocab: int | None = None) -> Path | None:
    """The data folder already prepared for exactly these constellations with their
    current content (and this vocab, if given), newest first; None when there is none."""
    names = _clean_names(names)
    chosen = get_constellations(names)
    content = {n: scan(c).sha256 for n, c in chosen.items()}
    return _matching_folder(content, vocab)


def prepare(names: list[str], vocab: int | None = None, progress: Progress = True, tokenizer: str = "auto") -> Path:
    """Prepares the selected constellations for training; returns the data folder.

    Reads the sources, picks or trains the tokenizer, holds out a share of each source as the
    val set (`choose_val`) and writes the shards and `manifest.json`, which says per source how
    much went to each side.
    `vocab`: None is the lab's (DEFAULT_VOCAB), lowered to what a small text allows
    (`fitted_vocab`; the manifest's `asked_vocab` keeps what was asked); a number is taken as
    asked. `progress`: bars on stderr, or told to a callable (lab.corpus.folders).
    `tokenizer`: "auto" follows the reuse rule (`reusable_tokenizer`); "new" uses one trained
    on exactly this selection (training it if need be), which tokenizes best; a tok_id uses
    that tokenizer (e.g. a checkpoint's, to continue it on more data) and its vocab, whatever
    `vocab` says.
    Unchanged data is found and returned without writing anything. The folder is written
    under a temporary name and renamed into place, so an interrupted prepare leaves no
    half-written data folder."""
    names = _clean_names(names)
    fit, vocab = vocab is None, DEFAULT_VOCAB if vocab is None else vocab
    check_vocab(vocab)
    chosen = get_constellations(names)
    scans = {n: scan(c, progress) for n, c in chosen.items()}
    content = {n: s.sha256 for n, s in scans.items()}
    existing = _matching_folder(content, vocab, tokenizer, fit)
    if existing:
        say(progress, f"already prepared: {existing}")
        return existing
    tok = tokenizer_for(chosen, scans, vocab, tokenizer, progress, fit=fit)
    val_set = val_set_id(content, tok.sha256)
    data_id = f"{'+'.join(names)}-{val_set[:8]}"
    final = home.data_dir() / data_id
    if (final / "manifest.json").is_file():
        return final
    if final.exists():
        raise UserError(f"{final} exists but holds no manifest.json (not written by lab prepare): "
                        f"move it away or delete it, then prepare again")
    sp = load_tokenizer(tok.model_file)
    with atomic_folder(home.data_dir(), data_id) as tmp:
        shutil.copyfile(tok.model_file, tmp / "tokenizer.model")
        manifest = _write_shards(chosen, scans, sp, tmp, progress)
        manifest.update(data_id=data_id, val_set=val_set, tokenizer={
            "file": "tokenizer.model", "sha256": tok.sha256, "vocab": tok.vocab, "eos_id": EOS_ID,
            "tok_id": tok.tok_id, "trained_on": sorted(tok.trained_on),
            **({"asked_vocab": tok.asked} if tok.asked else {})})
        write_manifest(tmp, manifest)
    say(progress, f"prepared: {final}")
    return final


def _write_shards(chosen: dict[str, Constellation], scans: dict[str, Scan], sp: spm.SentencePieceProcessor,
                  root: Path, progress: Progress) -> dict:
    constellations, train, val = {}, [], []
    for name, c in chosen.items():
        s = scans[name]
        t_entries, v_entries, counts = write_constellation(c, s, sp, root, progress)
        train += t_entries
        val += v_entries
        constellations[name] = {
            "sources": [{**source, **n.record()} for source, n in zip(s.sources, counts)],
            "bytes": s.bytes, "sha256": s.sha256, "documents": len(s.doc_bytes),
            "train_tokens": sum(e["tokens"] for e in t_entries), "val_tokens": sum(e["tokens"] for e in v_entries),
            "val_bytes": sum(n.val_bytes for n in counts), "source": c.provenance(),
            "licence": c.licence or "unknown: set 'licence =' in constellations.ini"}
    return {"format": FORMAT, "data_id": "", "constellations": constellations, "tokenizer": {},
            "train": train, "val": val,
            "train_tokens": sum(e["tokens"] for e in train), "val_tokens": sum(e["tokens"] for e in val),
            "val_bytes": sum(c["val_bytes"] for c in constellations.values()),
            "shortest_val_tokens": min(e["tokens"] for e in val), "val_set": "", "split_rule": SPLIT_RULE,
            "dtype": "uint16",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _clean_names(names: Iterable[str]) -> list[str]:
    """Sorted, without duplicates: the same selection always gives the same data id."""
    if isinstance(names, str):
        names = [names]
    out = sorted({n.strip() for n in names if n and n.strip()})
    if not out:
        raise UserError("choose at least one constellation (lab prepare --list shows them)")
    return out


