"""The texts a model is measured on: a file, a folder of text files, or a constellation's
held-out split. Each file is one document, read as the lab reads its sources (UTF-8, a BOM
dropped, Windows line ends made Unix ones), so a text measures as it would train."""
from __future__ import annotations

import os
from pathlib import Path

from lab.config import RunConfig, UserError
from lab.corpus.constellations import TEXT_SUFFIXES
from lab.corpus.manifests import prepared_folders, read_manifest
from lab.models.bpb import data_folder_of


def read_text_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (bad byte at {e.start}): convert it to UTF-8 "
                        f"(e.g. iconv -f cp1251 -t utf-8) or leave it out") from None
    return text.replace("\r\n", "\n")


def text_documents(target: str | os.PathLike) -> list[tuple[str, str]]:
    """(name, text) of a file, or of every text file under a folder (sorted; hidden ones and
    other suffixes skipped); empty files are left out. An error when nothing is left."""
    path = Path(target).expanduser()
    if path.is_dir():
        files = sorted(Path(root) / name for root, dirs, names in os.walk(path)
                       if not any(part.startswith(".") for part in Path(root).relative_to(path).parts)
                       for name in names if not name.startswith(".") and name.lower().endswith(TEXT_SUFFIXES))
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"no file or folder {path}: give a text file or a folder of them")
    docs = [(str(f), text) for f in files if (text := read_text_file(f))]
    if not docs:
        kinds = f"text files ({' '.join(TEXT_SUFFIXES)})" if path.is_dir() else "text"
        raise UserError(f"{path} holds no {kinds} to measure")
    return docs


def constellation_val(name: str, cfg: RunConfig | None = None, val_set: str | None = None) -> tuple[Path, list[str]]:
    """(the data folder, the held-out documents) of a constellation. Its val documents are
    chosen by their own text's hash, whatever else a folder holds, so any folder prepared with
    the same text of it gives the same ones; the run's own data folder is preferred."""
    from lab.corpus.valtext import val_documents  # numpy, sentencepiece: only where the data is at hand
    own = data_folder_of(val_set, cfg) if cfg is not None else None
    folders = ([own] if own is not None else []) + [f for f, _ in prepared_folders()]
    for folder in folders:
        if name in read_manifest(folder).get("constellations", {}):
            return folder, val_documents(folder, name)
    raise UserError(f"constellation {name!r} has no prepared data in this lab home: prepare it first "
                    f"(lab prepare -c {name})")
