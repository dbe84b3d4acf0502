"""Constellations: named groups of text sources (files, folders, globs, built-in texts)
declared in `$LAB_HOME/constellations.ini`, their documents and their content hashes."""
from __future__ import annotations

import configparser
import glob
import hashlib
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from lab import home
from lab.config import UserError
from lab.corpus.builtin import BUILTINS, DEFAULT_CONSTELLATIONS_INI
from lab.corpus.folders import Progress, bar as progress_bar

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text", ".org", ".tex")
GLOB_MAGIC = re.compile(r"[*?[]")
NAME_PUNCTUATION = "._-"
# Names that Windows keeps for devices, with any extension: no folder may be called so there.
WINDOWS_DEVICES = re.compile(r"^(con|prn|aux|nul|com[0-9]|lpt[0-9])(\.|$)", re.IGNORECASE)
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
                        f"(declare new ones in {home.constellations_file()})",
                        ru=f"неизвестные созвездия: {', '.join(missing)}; известные: {', '.join(known) or '(нет)'}")
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
        raise UserError(f"constellation {name!r} already exists in {path}: pick another name or edit it there",
                        ru=f"созвездие {name!r} уже есть: выберите другое имя или измените то")
    entries = _entries(name, _checked_sources(name, sources), description, licence, source)
    lines = [f"\n[{name}]"] + [line for key in INI_KEYS if key in entries for line in entries[key]]
    text = path.read_text(encoding="utf-8")
    path.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return load_constellations()[name]


def update_constellation(name: str, sources: list[str], description: str = "", licence: str = "",
                         source: str = "") -> Constellation:
    """Rewrites a constellation's keys in `constellations.ini` where they stand; its comments and
    every other section stay as they are (the file is the one place constellations live)."""
    path = home.constellations_file()
    get_constellations([name])  # an unknown name says which there are
    entries = _entries(name, _checked_sources(name, sources), description, licence, source)
    lines = path.read_text(encoding="utf-8").splitlines()
    start, end = _section_span(lines, name)
    body, placed = [], set()
    for key, chunk in _items(lines[start + 1:end]):
        key = "licence" if key == "license" else key
        if key is None or key not in INI_KEYS:
            body += chunk  # comments, blank lines and anything else stay where they are
        elif key not in placed:
            body += entries.get(key, [])
            placed.add(key)
    last = max((i for i, line in enumerate(body) if line.strip() and not line.lstrip().startswith(("#", ";"))),
               default=-1)
    body[last + 1:last + 1] = [line for key in INI_KEYS if key in entries and key not in placed for line in entries[key]]
    path.write_text("\n".join(lines[:start + 1] + body + lines[end:]) + "\n", encoding="utf-8")
    return load_constellations()[name]


def remove_constellation(name: str) -> None:
    """Takes a constellation out of `constellations.ini`, with the comments inside its section;
    the comments above the next section (which describe that one) and every other line stay.
    Its prepared data, if any, stays in `$LAB_HOME/data/` (runs may train on it)."""
    path = home.constellations_file()
    get_constellations([name])
    lines = path.read_text(encoding="utf-8").splitlines()
    start, end = _section_span(lines, name)
    path.write_text("\n".join(lines[:start] + lines[end:]).rstrip("\n") + "\n", encoding="utf-8")


def _checked_sources(name: str, sources: list[str]) -> list[str]:
    """The sources, each resolving to files (or a built-in text), else an error naming it."""
    sources = [s.strip() for s in sources if s and s.strip()]
    if not sources:
        raise UserError(f"constellation {name!r} needs at least one source (a file, a folder, a glob or builtin:NAME)",
                        ru=f"созвездию {name!r} нужен хотя бы один источник (файл, папка, шаблон или builtin:ИМЯ)")
    for spec in sources:
        if "\n" in spec:
            raise UserError(f"source {spec!r} of constellation {name!r} holds a line break: give one path per source",
                            ru=f"в источнике {spec!r} созвездия {name!r} перевод строки: по одному пути на источник")
        if spec.startswith("builtin:"):
            _builtin(spec, name)
        elif not any(f.stat().st_size > 3 for f in source_files(spec, name)):  # raises when it matches nothing
            raise UserError(f"constellation {name!r}: source {spec!r} holds only empty files: add text to them",
                            ru=f"созвездие {name!r}: в источнике {spec!r} только пустые файлы: добавьте в них текст")
    return sources


def _entries(name: str, sources: list[str], description: str, licence: str, source: str) -> dict[str, list[str]]:
    """The section's key lines, by key (an empty value: no line)."""
    out = {"sources": ["sources ="] + [f"    {s}" for s in sources]}
    for key, value in (("description", description), ("licence", licence), ("source", source)):
        if value and value.strip():
            out[key] = [f"{key} = {' '.join(value.split())}"]
    return out


_HEADER = re.compile(r"^\[([^\]]+)\]\s*$")
_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*[=:]")


def _section_span(lines: list[str], name: str) -> tuple[int, int]:
    """[start, end) of the section's lines: its header up to the next header, less the comments
    and blank lines just above that header (they belong to what follows)."""
    start = next(i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(1).strip() == name)
    end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
    if end < len(lines):
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith(("#", ";"))):
            end -= 1
    return start, end


def _items(body: list[str]) -> list[tuple[str | None, list[str]]]:
    """A section's body as (key, its lines with their continuations) and (None, [a comment or
    blank line]), in order."""
    out: list[tuple[str | None, list[str]]] = []
    for line in body:
        m = _KEY.match(line)
        if m:
            out.append((m.group(1).lower(), [line]))
        elif line.strip() and line[:1].isspace() and out and out[-1][0] is not None \
                and not line.lstrip().startswith(("#", ";")):
            out[-1][1].append(line)  # a continuation line of the key above
        else:
            out.append((None, [line]))
    return out


def _check_name(name: str, where: str) -> None:
    """A name becomes a folder name (texts, tokenizers, data) and is joined with '+' in data ids:
    letters and digits of any script (Cyrillic too: `сказки-ёлка`), '.', '_' and '-', starting
    with a letter or digit; nothing a file system reads otherwise (separators, spaces, a dot at
    either end, a device name of Windows)."""
    def letter_or_digit(ch: str) -> bool:
        return unicodedata.category(ch)[0] == "L" or unicodedata.category(ch) == "Nd"

    fine = bool(name) and letter_or_digit(name[0]) and not name.endswith(".") and not WINDOWS_DEVICES.match(name) \
        and all(letter_or_digit(ch) or ch in NAME_PUNCTUATION or unicodedata.category(ch)[0] == "M" for ch in name)
    if not fine:
        raise UserError(f"{where}: a name is letters, digits, '.', '_' and '-' (no spaces), starting with a letter "
                        f"or digit, e.g. my-books or сказки-ёлка",
                        ru=f"имя созвездия {name!r}: это буквы, цифры, '.', '_' и '-' (без пробелов), в начале буква или цифра, "
                           f"например my-books или сказки-ёлка")


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
        kinds_ru = f"текстовых файлов ({' '.join(TEXT_SUFFIXES)})" if Path(pattern).is_dir() else "файлов"
        raise UserError(f"constellation {constellation!r}: source {spec!r} matches no {kinds} (looked at {pattern}); "
                        f"fix it in {home.constellations_file()} (relative paths start at the lab home {lab_home})",
                        ru=f"созвездие {constellation!r}: под источник {spec!r} не подходит ни одного из {kinds_ru} "
                           f"(искали в {pattern}); исправьте его (относительные пути идут от дома лабы {lab_home})")
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
                        f"convert it to UTF-8 or leave it out of the sources",
                        ru=f"созвездие {constellation!r}: {path} — не текст в UTF-8 (плохой байт на месте {e.start}): "
                           f"переведите его в UTF-8 или уберите из источников") from None
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
    doc_sources: list[int] = field(repr=False, default_factory=list)  # the source (its index) of each document


def _hash_document(h: "hashlib._Hash", data: bytes) -> None:
    # Length-prefixed so that moving text between documents changes the hash.
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def scan(c: Constellation, progress: "Progress" = False) -> Scan:
    """Reads a constellation once for its content hash, sizes and per-document hashes.
    The hash covers the documents' text and order, not file names or times."""
    sources, doc_hashes, doc_bytes, doc_sources = [], [], [], []
    whole = hashlib.sha256()
    with progress_bar(progress, f"reading {c.name}") as bar:
        for index, spec in enumerate(c.sources):
            h, size = hashlib.sha256(), 0
            for doc in source_documents(spec, c.name):
                data = doc.text.encode("utf-8")
                _hash_document(h, data)
                doc_hashes.append(hashlib.sha256(data).digest())
                doc_bytes.append(len(data))
                doc_sources.append(index)
                size += len(data)
                bar.update(len(data))
            sources.append({"path": spec, "bytes": size, "sha256": h.hexdigest()})
            whole.update(h.digest())
    total = sum(doc_bytes)
    if not total:
        raise UserError(f"constellation {c.name!r} holds no text (sources: {', '.join(c.sources)}); "
                        f"add text files to it or leave it out",
                        ru=f"в созвездии {c.name!r} нет текста (источники: {', '.join(c.sources)}); добавьте в него "
                           f"текстовые файлы или не берите его")
    return Scan(c.name, sources, total, whole.hexdigest(), doc_hashes, doc_bytes, doc_sources)


