"""The console's background work: a slow call (Kaggle, a probe, preparing data) runs in a thread
and hands its answer to the widget that asked; `Latest` keeps only the newest request's answer
(the form's Auto pick, asked on every change)."""
from __future__ import annotations

import threading


def in_background(fn, *args, on_done=None, on_error=None) -> threading.Thread:
    """Runs `fn(*args)` in a daemon thread; hands the result or the exception to the callbacks."""
    def work():
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001 - shown to the person by on_error
            if on_error:
                on_error(e)
            return
        if on_done:
            on_done(result)
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


class Latest:
    """Runs `fn(*args)` in one background thread; only the newest request's answer is kept."""

    def __init__(self, fn, done):
        self.fn, self.done = fn, done
        self.lock, self.idle = threading.Lock(), threading.Event()
        self.pending, self.thread = None, None
        self.idle.set()

    def submit(self, *args) -> None:
        with self.lock:
            self.pending = args
            self.idle.clear()
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.lock:
                args, self.pending = self.pending, None
                if args is None:
                    self.thread = None
                    self.idle.set()
                    return
            try:
                result, error = self.fn(*args), None
            except Exception as e:  # noqa: BLE001 - handed to `done`
                result, error = None, e
            with self.lock:
                stale = self.pending is not None
            if not stale:
                self.done(args, result, error)

    def wait(self, timeout_s: float = 30.0) -> bool:
        return self.idle.wait(timeout_s)
