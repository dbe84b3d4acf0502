"""The run's curve: `metrics.jsonl`, one JSON object per logged step (and per evaluation).

Read by the plot, the calculator's measured speeds, the monitor and the driver that merges a
Kaggle session's curve into the run's. Stdlib only: the control side reads curves without torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from lab.kernel.checkpoint import atomic_write

METRICS = "metrics.jsonl"


def metrics_path(path: str | os.PathLike) -> Path:
    """A metrics file, or the one inside a run folder."""
    p = Path(path)
    return p / METRICS if p.is_dir() else p


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics.jsonl (or of a run folder's); a half-written last line (a run still
    writing) and anything that is not a row are skipped. A missing file has no rows."""
    return [row for _, row in _rows(metrics_path(path))]


def _rows(path: Path) -> list[tuple[str, dict]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            out.append((line, row))
    return out


def metrics_lines(path: str | os.PathLike, upto: int | None = None, after: int | None = None) -> list[str]:
    """The rows' lines as written, those with `after < step <= upto` (either bound optional):
    cutting a curve at a checkpoint keeps every byte of what was logged before it."""
    return [line for line, row in _rows(metrics_path(path))
            if (upto is None or row["step"] <= upto) and (after is None or row["step"] > after)]


def write_metrics_lines(path: str | os.PathLike, lines: list[str]) -> None:
    atomic_write(Path(path), lambda f: f.write("".join(line + "\n" for line in lines).encode("utf-8")))
