"""The emulated Kaggle's log stream: `GET /v1/kernels/logs/stream/{owner}/{slug}[?versionLabel=vN]`.

As kaggle 2.2.5's `kernels_logs_stream` expects it (read from its source): while the session
runs, `text/event-stream` with `data: {"stream_name", "time", "data"}` events, replayed from the
beginning on every connection, ending with `data: END_OF_LOG` when the session ends; once it
has ended, the stored log as a JSON array. How often the real service flushes a running
kernel's output into the stream is not known *(assumed: as it is printed)*; with
`log_while_running = False` the emulator plays the unfriendly case: nothing of a running
session's log can be read (the stream stays silent, and ListKernelSessionOutput's `log` is empty)
until it ends.
"""
from __future__ import annotations

import json
import time
from typing import Iterator

from kaggle_emulator.model import TERMINAL, _HttpError

END_OF_LOG = "END_OF_LOG"


class Logs:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    log_while_running: bool = True  # False: a running session's log is unreadable until it ends
    # While nothing is printed, an SSE comment this often *(assumed)*. The real client reads the
    # stream with requests' `iter_lines` (512-byte chunks): a line reaches it only once 512 more
    # bytes follow, so the comment is that long, and a quiet session's last line is not held back.
    log_keepalive_s: float | None = 1.0  # None: no keep-alive at all, a silent session's stream stays silent

    def log_readable(self, status: str) -> bool:
        """Whether a session's log can be read now (its status as Kaggle reports it)."""
        return self.log_while_running or status in TERMINAL

    def log_stream(self, owner: str, slug: str, version: str | None,
                   auth_header: str | None) -> tuple[int, str, bytes | Iterator[bytes]]:
        """(HTTP status, content type, body): a JSON error, the stored log, or SSE chunks."""
        user = self._authenticate(auth_header)
        entry = {"service": "kernels", "method": "LogsStream", "user": user.username if user else None,
                 "body": {"userName": owner, "kernelSlug": slug, "versionLabel": version}}
        fault = self._take_fault("LogsStream")
        try:
            if fault is not None:
                raise _HttpError(fault.status, f"Injected fault (HTTP {fault.status})")
            if user is None:
                raise _HttpError(401, "Unauthenticated: unknown username/key or token")
            with self._lock:
                s = self._visible_session(user, {"userName": owner, "kernelSlug": slug, "versionLabel": version})
                ended = s.status in TERMINAL and (s.log_done.is_set() or s.proc is None)
                stored = json.dumps(s.log)
        except _HttpError as e:
            entry["status"] = e.code
            self._record(entry)
            return e.code, "application/json", json.dumps({"code": e.code, "message": e.message}).encode()
        entry["status"] = 200
        self._record(entry)
        if ended:
            return 200, "application/json", stored.encode()
        return 200, "text/event-stream", self._events(s)

    def _events(self, s) -> Iterator[bytes]:
        """The running session's log from its first line, then each line as it is printed."""
        sent, last = 0, time.monotonic()
        while True:
            with self._lock:
                ended = s.status in TERMINAL and (s.log_done.is_set() or s.proc is None)
                readable = self.log_readable(s.status)
                new = list(s.log[sent:]) if readable else []
            for event in new:
                yield f"data: {json.dumps(event)}\n\n".encode()
            sent += len(new)
            if ended and readable:
                yield f"data: {END_OF_LOG}\n\n".encode()
                return
            if new:
                last = time.monotonic()
            elif self.log_keepalive_s is not None and time.monotonic() - last >= self.log_keepalive_s:
                yield b":" + b" " * 509 + b"\n\n"
                last = time.monotonic()
            if self._stopping.wait(0.05):
                return
