"""Constellations: named groups of text sources (files, folders, globs, built-in texts)
declared in `$LAB_HOME/constellations.ini`, their documents and their content hashes."""
from __future__ import annotations

import configparser
import glob
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from tqdm.auto import tqdm

from lab import home
from lab.config import UserError
from lab.corpus.builtin import BUILTINS, DEFAULT_CONSTELLATIONS_INI

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text", ".org", ".tex")
GLOB_MAGIC = re.compile(r"[*?[]")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
INI_KEYS = ("sources", "description", "licence", "license", "source")


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


