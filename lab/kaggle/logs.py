"""A running session's log, read while it runs: its metrics lines and whether Kaggle shows it.

The real client's `kernels_logs_stream` (kaggle 2.2.5) answers server-sent events while the
session runs and the stored log after it; every connection replays the log from its first
line. How often Kaggle flushes a running kernel's output into that stream is not known, so
this reader finds out: `LiveLog` follows the stream in a background thread (reconnecting,
skipping what it has seen), appends the metrics lines the training loop prints
(`lab.kernel.metrics.metrics_line`) to `live-metrics.jsonl`, and tells the watch, which hands
it each status it polls, what the log is:

- "live": a line arrived before a poll that still read RUNNING: the log is readable while the
  session runs, and the curve moves;
- "at_end": the session has run `grace_s` with not one line: Kaggle shows its log only when it
  ends (the notebook prints at once, so a flushed log would have shown something);
- "waiting": neither is known yet.

It writes `live.json` (the mode and counts) beside the rows. It knows nothing of runs.
"""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lab.kaggle.client import AccountClient
from lab.kaggle.retries import status_of, unwrap
from lab.kernel.checkpoint import atomic_write
from lab.kernel.metrics import parse_metrics_line, read_metrics

LIVE_ROWS = "live-metrics.jsonl"
LIVE_STATE = "live.json"
GRACE_S = 300.0  # a running session with no line in its log this long: the log is not flushed while it runs
MODES = ("waiting", "live", "at_end")


class LiveLog:
    """Follows one session's log into `folder` (see the module's doc). `retry_s`: the wait
    before reconnecting a stream that ended or failed; `clock`: monotonic seconds."""

    def __init__(self, c: AccountClient, slug: str, version: int | None, folder: Path, *,
                 grace_s: float = GRACE_S, retry_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.c, self.slug, self.version, self.folder = c, slug, version, Path(folder)
        self.grace_s, self.retry_s, self.clock = grace_s, retry_s, clock
        self.mode = "waiting"
        before, self._rows = read_live(self.folder)  # a driver before this one may have read some
        # Events handled, this driver's and those before it: each connection replays the log from
        # its first line, and what was handled once is skipped, not taken into the curve again.
        self.events = int((before or {}).get("events") or 0)
        self.error: str | None = None
        self._first_event_at: float | None = None
        self._running_since: float | None = None
        self._keys = {_key(r) for r in self._rows}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the watch's side --------------------------------------------------------------------

    def start(self) -> "LiveLog":
        if self._thread is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._follow, name=f"lab-log-{self.slug}", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait_s: float = 0.0) -> None:
        self._stop.set()
        if self._thread is not None and wait_s:
            self._thread.join(wait_s)
        self._save_state()

    def seen_status(self, status: str, asked_at: float | None = None) -> str:
        """Told each polled status and when it was asked (`clock()` before the call: a line that
        came after the question may come from a session that ended meanwhile); returns the log's
        mode as known now."""
        now = self.clock()
        asked_at = now if asked_at is None else asked_at
        with self._lock:
            if status == "RUNNING":
                if self._running_since is None:
                    self._running_since = asked_at
                if self._first_event_at is not None and self._first_event_at < asked_at:
                    self.mode = "live"  # a line came before a poll that still read RUNNING
                elif self.mode != "live" and asked_at - self._running_since >= self.grace_s:
                    self.mode = "at_end"
        self._save_state()
        return self.mode

    def rows(self) -> list[dict]:
        with self._lock:
            return list(self._rows)

    def state(self) -> dict:
        with self._lock:
            last = self._rows[-1] if self._rows else {}
            return {"mode": self.mode, "events": self.events, "rows": len(self._rows), "last_step": last.get("step"),
                    "grace_s": self.grace_s, "error": self.error,
                    "updated": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    # -- the reader's side -------------------------------------------------------------------

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                count = 0
                for count, event in enumerate(self.c.kernel_log_events(self.slug, self.version), start=1):
                    if self._stop.is_set():
                        return
                    if count > self.events:
                        self._take(event)
                if count < self.events:
                    # The log came back shorter than what was read (another form of it, such as the
                    # stored log after the live one): the next connection reads it whole, and rows
                    # already kept are not added twice.
                    with self._lock:
                        self.events = 0
                self.error = None
            except Exception as e:  # noqa: BLE001 - the log is a courtesy: the status decides. The
                # client's messages may hold URLs but no secret; only the kind is kept.
                self.error = _kind(e)
            self._stop.wait(self.retry_s)

    def _take(self, event: dict) -> None:
        data = event.get("data") if isinstance(event, dict) else None
        new = []
        with self._lock:
            self.events += 1
            if data:
                if self._first_event_at is None:
                    self._first_event_at = self.clock()
                for line in str(data).splitlines():
                    row = parse_metrics_line(line)
                    if row is not None and _key(row) not in self._keys:
                        self._keys.add(_key(row))
                        self._rows.append(row)
                        new.append(row)
        if new:
            with open(self.folder / LIVE_ROWS, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))

    def _save_state(self) -> None:
        state = self.state()
        try:
            atomic_write(self.folder / LIVE_STATE, lambda f: f.write(json.dumps(state).encode("utf-8")))
        except OSError:
            pass


def _key(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def _kind(e: BaseException) -> str:
    exc = unwrap(e)
    status = status_of(exc)
    return f"HTTP {status}" if status is not None else type(exc).__name__


def read_live(folder: Path) -> tuple[dict | None, list[dict]]:
    """(live.json's state or None, the live rows) of a link folder."""
    try:
        state = json.loads((Path(folder) / LIVE_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    return (state if isinstance(state, dict) else None), read_metrics(Path(folder) / LIVE_ROWS)
