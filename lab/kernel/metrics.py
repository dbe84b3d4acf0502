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
    return _parsed(text)


def _parsed(text: str) -> list[tuple[str, dict]]:
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


def continue_metrics(out: Path, ckpt_path: Path, step: int) -> None:
    """Makes the run folder's metrics end at the checkpoint's step, so the curve reads as one
    line: rows a killed session logged after its last checkpoint are dropped, and a fresh folder
    (a new Kaggle session) starts with the earlier links' rows, from the checkpoint's run folder."""
    run_dir = ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else ckpt_path.parent
    mine, theirs = out / METRICS, run_dir / METRICS
    source = mine if mine.exists() else theirs
    if not source.exists():
        return
    rows = metrics_lines(source, upto=step)
    out.mkdir(parents=True, exist_ok=True)
    write_metrics_lines(mine, rows)


class MetricsTail:
    """The rows appended to a metrics.jsonl since the last read, for a live plot that must not
    parse a 12-hour curve at every redraw. A half-written last line waits for the next read. A
    file replaced meanwhile (a resumed session cuts its curve at the checkpoint) is read again
    from its start, and `read` says so."""

    def __init__(self, path: str | os.PathLike):
        self.path, self.offset, self.inode = Path(path), 0, None

    def read(self) -> tuple[list[dict], bool]:
        """(the new rows, whether they start the file over)."""
        try:
            st = os.stat(self.path)
            with open(self.path, "rb") as f:
                anew = st.st_ino != self.inode or st.st_size < self.offset
                f.seek(0 if anew else self.offset)
                data = f.read()
        except OSError:
            return [], False
        if anew:
            self.offset, self.inode = 0, st.st_ino
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        return [row for _, row in _parsed(whole.decode("utf-8", errors="replace"))], anew


# ---------------------------------------------------------------------------------------------
# Metrics lines in the session's log: the live curve of a session still running elsewhere
#
# A Kaggle session's files come back only when it ends, but its log can be read while it runs.
# So the loop also prints rows into the log, in one stable form the control side parses:
#     @lab-metrics {"step": 120, "loss": 5.31, ...}
# Every row would flood a 12-hour log (a row per step), so a training row is echoed at most
# every ECHO_EVERY_S seconds of the session's clock; evaluation rows always are.

METRICS_MARK = "@lab-metrics "
ECHO_EVERY_S = 10.0
_ECHO_KEYS = ("step", "tokens", "loss", "val_loss", "val_set", "lr", "tok_s", "elapsed_s", "session")
_echoed: dict = {}  # session -> elapsed_s of the last echoed row (one training process per session)


def metrics_line(row: dict) -> str:
    """A metrics row as one log line (without the sample text, which may be long)."""
    return METRICS_MARK + json.dumps({k: row[k] for k in _ECHO_KEYS if k in row}, ensure_ascii=False,
                                     separators=(",", ":"))


def parse_metrics_line(line: str) -> dict | None:
    """The row in a log line written by `metrics_line`, or None for any other line."""
    at = line.find(METRICS_MARK)
    if at < 0:
        return None
    try:
        row = json.loads(line[at + len(METRICS_MARK):].strip())
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def echo_metrics(row: dict, every_s: float = ECHO_EVERY_S) -> bool:
    """Prints the row as a metrics line when it is due (an evaluation, or `every_s` after the
    last echoed row of its session); returns whether it printed."""
    elapsed, session = row.get("elapsed_s"), row.get("session")
    last = _echoed.get(session)
    due = ("val_loss" in row or last is None or not isinstance(elapsed, (int, float))
           or not 0 <= elapsed - last < every_s)  # a clock that went back: another run in this process
    if not due:
        return False
    if isinstance(elapsed, (int, float)):
        _echoed[session] = elapsed
    print(metrics_line(row), flush=True)
    return True
