"""The live curve of a Kaggle link while its session runs, as the watch sees it at each poll.

The watch hands each polled status to `LiveWatch.poll`: the session's log is followed
(lab.kaggle.logs.LiveLog) into the link's folder, new metrics rows are said as progress lines
(`lab watch RUN` prints them; the monitor draws them), and when Kaggle turns out to keep the log
until the session ends (or the account's probe found so), that is said once instead of a curve
that does not move. The rows are
only a preview: the session's own `metrics.jsonl` replaces them when its outputs come back.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from lab.kaggle.client import AccountClient
from lab.kaggle.logs import LiveLog
from lab.machines.live import at_end_note
from lab.probe.record import read_probe


def progress_line(n: int, row: dict, steps_until: int) -> str:
    """One progress line of link `n` from a live metrics row."""
    loss = f" loss {row['loss']:.4f}" if isinstance(row.get("loss"), (int, float)) else ""
    val = f" val {row['val_loss']:.4f}" if isinstance(row.get("val_loss"), (int, float)) else ""
    speed = f" {row['tok_s']:,.0f} tok/s" if isinstance(row.get("tok_s"), (int, float)) else ""
    return f"link {n}: step {row['step']:,}/{steps_until:,}{loss}{val}{speed} (live, from the session's log)"


class LiveWatch:
    """One link's live curve during the watch; `close()` when the watch ends."""

    def __init__(self, c: AccountClient, kernel: dict, folder: Path, n: int, steps_until: int,
                 say: Callable[[str], None], grace_s: float, retry_s: float):
        self.n, self.steps_until, self.say = n, steps_until, say
        if (read_probe(c.account.name) or {}).get("log_while_running") is False:
            grace_s = 0.0  # the account's probe found the log kept until the end: said at the first RUNNING
        self.log = LiveLog(c, kernel["slug"], kernel.get("version"), folder, grace_s=grace_s, retry_s=retry_s)
        self.told_at_end = False
        self.said = len(self.log.rows())  # rows a driver before this one already said
        self.log.start()

    def poll(self, status: str, asked_at: float | None = None) -> None:
        """`asked_at`: time.monotonic() before the status was asked."""
        mode = self.log.seen_status(status, asked_at)
        rows = self.log.rows()
        if len(rows) > self.said:
            last = max(rows[self.said:], key=lambda r: r["step"])
            self.say(progress_line(self.n, last, self.steps_until))
            self.said = len(rows)
        if mode == "at_end" and not self.told_at_end:
            self.say(f"link {self.n}: " + at_end_note(self.log.grace_s))
            self.told_at_end = True

    def close(self) -> None:
        self.log.stop()
