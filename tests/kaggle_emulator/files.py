"""The emulated Kaggle: processes and files (kill a session's tree, list outputs, write uploads)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import BinaryIO

from lab.procs import descendants, signal_quietly
from kaggle_emulator.model import _CHUNK


def _kill_tree(proc: subprocess.Popen, sig: int) -> None:
    for pid in descendants(proc.pid):
        signal_quietly(pid, sig)
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    else:
        proc.kill()


def _list_files(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _read_chunks(body: BinaryIO, length: int | None, chunked: bool):
    """Yields a request body: Content-Length bytes, or a chunked transfer; stops at a short read."""
    if chunked:
        for _ in range(10_000_000):
            line = body.readline(1024)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                body.readline(1024)
                return
            yield from _read_exactly(body, size)
            body.readline(16)
        return
    yield from _read_exactly(body, length or 0)


def _read_exactly(body: BinaryIO, left: int):
    """Up to `left` bytes in chunks; stops early if the peer closes."""
    while left > 0:
        data = body.read(min(left, _CHUNK))
        if not data:
            return
        left -= len(data)
        yield data


def _drain(body: BinaryIO, length: int | None, chunked: bool) -> None:
    for _ in _read_chunks(body, length, chunked):
        pass


def _write_at(path: Path, start: int, body: BinaryIO, length: int | None, chunked: bool) -> int:
    """Writes the body at `start` (dropping anything after it); returns the bytes received,
    which may be fewer than sent when the connection breaks: a resume picks up from there."""
    written = 0
    with open(path, "r+b") as f:
        f.truncate(start)
        f.seek(start)
        try:
            for data in _read_chunks(body, length, chunked):
                f.write(data)
                written += len(data)
        except (OSError, ValueError):
            pass
    return written

