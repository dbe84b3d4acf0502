"""Folders written whole or not at all, and the progress lines of `lab prepare`."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Iterator

from tqdm.auto import tqdm


@contextlib.contextmanager
def atomic_folder(parent: Path, name: str) -> Iterator[Path]:
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



def say(progress: bool, message: str) -> None:
    if progress:
        tqdm.write(message, file=sys.stderr)
