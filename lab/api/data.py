"""The lab's data: constellations declared (with the person's uploaded files), edited, removed,
prepared; what is prepared and how many tokens each holds.

    constellations()                  each declared constellation with its sources, licence, tokens
    tokens()                          train tokens per prepared constellation (the form's list)
    save_uploads(name, files)         uploaded text files kept as a folder source
    add / update / remove             a constellation in `constellations.ini`, its comments kept
    check_vocab(vocab)                a vocabulary size the tokenizer can have, or why not
    prepare(names, progress, vocab)   `lab prepare -c NAME ... [--vocab N]` (None: the corpus's choice)
    manifest(folder), splits(m)       what a prepare wrote: its manifest, each source's train and val
    prepared_state(name)              where a constellation is prepared with its current text (`lab prepare --list`)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.corpus.constellations import TEXT_SUFFIXES, add_constellation, load_constellations, remove_constellation
from lab.corpus.constellations import _check_name as check_name
from lab.corpus.constellations import scan, update_constellation
from lab.corpus.manifests import SourceSplit, prepared_folders, read_manifest, source_splits
from lab.corpus.manifests import source_splits_by_constellation, train_tokens_by_constellation, vocab_note
from lab.corpus.prepared import prepare as prepare_data
from lab.corpus.tokenizer import DEFAULT_VOCAB, MAX_VOCAB  # `lab prepare --help` says both
from lab.corpus.tokenizer import check_vocab as corpus_check_vocab
from lab.config import UserError
from lab.home import lab_home


@dataclass(frozen=True)
class Constellation:
    name: str
    description: str = ""
    sources: list[str] = field(default_factory=list)
    licence: str = ""
    source: str = ""
    tokens: int | None = None  # train tokens where prepared
    splits: list[SourceSplit] = field(default_factory=list)  # what each source gave train and val, where prepared


def tokens() -> dict[str, int]:
    """Train tokens per constellation, where prepared."""
    return train_tokens_by_constellation()


def constellations() -> list[Constellation]:
    have, splits = tokens(), source_splits_by_constellation()
    return [Constellation(c.name, c.description, list(c.sources), c.licence, c.source, have.get(c.name),
                          splits.get(c.name, [])) for c in load_constellations().values()]


def prepared_note(folder: Path) -> tuple[str, str] | None:
    """(English, Russian) words on what a prepare chose for the person: a vocabulary lowered to fit
    a small text; None when it took what was asked."""
    return vocab_note(read_manifest(folder))


def save_uploads(name: str, files: list[tuple[str, bytes]]) -> tuple[str, list[str]]:
    """Uploaded text files kept in `$LAB_HOME/texts/<name>/`: (that folder as a source, relative to
    the lab home; the names skipped as not text files)."""
    check_name(name, f"constellation name {name!r}")
    folder = lab_home() / "texts" / name
    skipped = []
    for filename, data in files:
        base = Path(filename).name
        if not base or base.startswith(".") or not base.lower().endswith(TEXT_SUFFIXES):
            skipped.append(filename)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / base).write_bytes(data)
    return f"texts/{name}", skipped


def add(name: str, sources: list[str], description: str = "", licence: str = "", source: str = ""):
    return add_constellation(name, sources, description, licence, source)


def update(name: str, sources: list[str], description: str = "", licence: str = "", source: str = ""):
    return update_constellation(name, sources, description, licence, source)


def remove(name: str) -> None:
    remove_constellation(name)


def check_vocab(vocab: int) -> None:
    """Raises UserError, in English and Russian, when the tokenizer cannot have `vocab` tokens
    (lab.corpus decides; this adds the Russian words)."""
    try:
        corpus_check_vocab(vocab)
    except UserError as e:
        ru = (f"словарь {vocab} больше {MAX_VOCAB}: номера токенов хранятся в 16 битах; возьмите словарь поменьше"
              if vocab > MAX_VOCAB else f"словарь {vocab} слишком мал: 259 номеров заняты служебными токенами и "
                                        f"256 байтами; возьмите не меньше 300")
        raise UserError(str(e), ru=ru) from None


def prepare(names: list[str], progress: Callable | bool = False, vocab: int | None = None, **kw) -> Path:
    """`lab prepare -c NAME ... [--vocab N]`; `progress(stage, done, total)` is told as it goes
    (True: bars). `vocab` None: the corpus's own choice (lab.corpus.prepare's default)."""
    if vocab is not None:
        kw["vocab"] = vocab
    return prepare_data(names, progress=progress, **kw)


def manifest(folder: Path) -> dict:
    """A prepared data folder's manifest: its tokens, tokenizer, val set, constellations."""
    return read_manifest(folder)


def splits(prepared: dict) -> list[SourceSplit]:
    """What each source of a prepared folder's manifest gave train and val."""
    return source_splits(prepared)


def prepared_state(name: str) -> tuple[str, dict | None]:
    """Where the constellation is prepared with its current text, in words ("no", "no (its text
    changed since it was prepared)", the folders with their vocab and tokens), and the newest such
    folder's manifest."""
    c = load_constellations()[name]
    mentions = [(f, m) for f, m in prepared_folders() if c.name in m["constellations"]]
    if not mentions:
        return "no", None
    try:
        sha = scan(c).sha256
    except UserError as e:
        return f"unavailable now ({e})", None
    current = [(f, m) for f, m in mentions if m["constellations"][c.name]["sha256"] == sha]
    if not current:
        return "no (its text changed since it was prepared)", None
    return ", ".join(f"{f.name} (vocab {m['tokenizer']['vocab']}, {m['train_tokens'] + m['val_tokens']:,} tokens)"
                     for f, m in current), current[0][1]
