"""Prepared data folders and their manifests, read without numpy or sentencepiece: the
calculator asks on every keystroke, the driver before every link.

A data folder (`$LAB_HOME/data/<id>/`, written by `lab prepare`) holds `manifest.json`: the
constellations with their sources' sha256 and what each source gave train and val (bytes, tokens,
documents held out whole or by their tails: `source_splits`), token counts per split, the UTF-8
bytes of the held-out text (`val_bytes`; folders prepared before it was recorded lack it, see
`lab.corpus.valtext`), the tokenizer (with `asked_vocab` where a small text got a smaller one:
`vocab_note`), the val-set id and `data_id`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
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
    chosen by their text, never by the tokens, so data of one val text holds out the same text."""
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


def shard_folder(name: str) -> str:
    """The folder of a constellation's shards inside a data folder: its name, or for a name
    beyond ASCII (`сказки-ёлка`) its punycode (`xn---7sbb0afjcci7c6k`): the shards' paths
    become the file names of a Kaggle dataset, which keep to ASCII here."""
    return name if name.isascii() else "xn--" + name.encode("punycode").decode("ascii")


@dataclass(frozen=True)
class SourceSplit:
    """What one source of a prepared constellation gave train and val. Counts are None for a
    folder prepared before manifests kept them per source."""
    constellation: str
    source: str  # the source as constellations.ini names it: a path, a folder, a glob, builtin:NAME
    bytes: int
    train_bytes: int | None = None
    val_bytes: int | None = None
    train_tokens: int | None = None
    val_tokens: int | None = None
    documents: int | None = None
    val_whole: int | None = None  # documents held out whole
    val_tails: int | None = None  # documents whose last part is held out

    @property
    def val_share(self) -> float | None:
        """The share of the source's bytes held out."""
        return None if self.val_bytes is None or not self.bytes else self.val_bytes / self.bytes

    def words(self, lang: str = "en") -> str:
        """One line on where the source's text went, in English or Russian."""
        if self.val_bytes is None:
            return (f"{self.source}: {self.bytes:,} bytes (prepared before the split was kept per source: prepare again)"
                    if lang == "en" else f"{self.source}: {_ru(self.bytes)} байт (подготовлено до того, как разбиение "
                    f"стали хранить по источникам: подготовьте заново)")
        share = f"{100 * (self.val_share or 0):.1f}"
        how = _how(self, lang)
        if lang == "en":
            return (f"{self.source}: train {self.train_bytes:,} bytes ({self.train_tokens:,} tokens), val "
                    f"{self.val_bytes:,} bytes ({self.val_tokens:,} tokens, {share}%){how}")
        return (f"{self.source}: обучение {_ru(self.train_bytes)} байт ({_ru(self.train_tokens)} токенов), val "
                f"{_ru(self.val_bytes)} байт ({_ru(self.val_tokens)} токенов, {share.replace('.', ',')}%){how}")


def _ru(n: int) -> str:
    return f"{n:,}".replace(",", "\u00a0")  # Russian groups thousands with a (no-break) space


def _how(s: SourceSplit, lang: str) -> str:
    """How the source's documents were held out, said briefly."""
    if lang == "en":
        parts = ([f"{s.val_tails:,} of {s.documents:,} documents give their last part"] if s.val_tails else []) + \
                ([f"{s.val_whole:,} of {s.documents:,} documents whole"] if s.val_whole else [])
    else:
        parts = ([f"у {_ru(s.val_tails)} из {_ru(s.documents)} документов отложен конец"] if s.val_tails else []) + \
                ([f"{_ru(s.val_whole)} из {_ru(s.documents)} документов отложены целиком"] if s.val_whole else [])
    return f"; {', '.join(parts)}" if parts else ""


def source_splits(manifest: dict | str | os.PathLike) -> list[SourceSplit]:
    """Where each source's text went in a prepared data folder (or its manifest): bytes and
    tokens to train and to val, constellation by constellation, in the manifest's order. For the
    control notebook's Data panel and `lab prepare`."""
    if not isinstance(manifest, dict):
        manifest = read_manifest(manifest)
    out = []
    for name, c in (manifest.get("constellations") or {}).items():
        for src in c.get("sources") or []:
            counts = {k: src.get(k) for k in ("train_bytes", "val_bytes", "train_tokens", "val_tokens", "documents",
                                              "val_whole", "val_tails")}
            out.append(SourceSplit(name, str(src.get("path", "")), int(src.get("bytes") or 0), **counts))
    return out


def source_splits_by_constellation() -> dict[str, list[SourceSplit]]:
    """Each constellation's per-source split (`source_splits`) in the newest data folder prepared
    with it: what the Data panel shows beside its train tokens."""
    out: dict[str, list[SourceSplit]] = {}
    for _, manifest in prepared_folders():  # newest first
        splits = source_splits(manifest)
        for name in manifest.get("constellations") or {}:
            out.setdefault(name, [s for s in splits if s.constellation == name])
    return out


def vocab_note(manifest: dict) -> tuple[str, str] | None:
    """(English, Russian) words on a vocabulary lowered to fit a small text, or None."""
    tok = manifest.get("tokenizer") or {}
    asked, vocab = tok.get("asked_vocab"), tok.get("vocab")
    if not asked or asked == vocab:
        return None
    return (f"vocab {vocab}, not {asked}: the text is too small for {asked} pieces, so the tokenizer took "
            f"the vocab it fits",
            f"словарь {vocab}, а не {asked}: для {asked} кусочков текста слишком мало, и токенизатор взял словарь "
            f"по тексту")
