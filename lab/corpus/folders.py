"""Folders written whole or not at all, and the progress of `lab prepare`: its bars and lines.

`progress` is True (tqdm's bars and lines on stderr, as `lab prepare` shows them), False
(nothing), or a callable `progress(stage, done, total)` told each step (the control notebook's
bar): `stage` is what is being done, `done` and `total` bytes (`total` None when not known;
a line said is a stage with neither)."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Callable, Iterator, Union

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



Progress = Union[bool, Callable[[str, int, "int | None"], None]]


def say(progress: Progress, message: str) -> None:
    if callable(progress):
        progress(message, 0, None)
    elif progress:
        tqdm.write(message, file=sys.stderr)


class _Told:
    """A tqdm-like bar that tells `progress(stage, done, total)` as it goes."""

    def __init__(self, progress: Callable, stage: str, total: int | None):
        self.progress, self.stage, self.total, self.done = progress, stage, total, 0
        progress(stage, 0, total)

    def update(self, n: int) -> None:
        self.done += n
        self.progress(self.stage, self.done, self.total)

    def __enter__(self) -> "_Told":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def bar(progress: Progress, stage: str, total: int | None = None):
    """A bar of bytes done for one stage: tqdm on stderr, nothing, or told to `progress`."""
    if callable(progress):
        return _Told(progress, stage, total)
    return tqdm(desc=stage, total=total, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                file=sys.stderr)
