"""Stop signals and process groups, shared by the saver, the launcher and the control side.

A stop (the notebook's stop button, Ctrl-C, a cancel, a SIGTERM from whoever runs us) is caught,
not left to interrupt: the first one asks for a checkpoint and an orderly end; a second one, where
the catcher allows it, interrupts as usual. Work started below this process that has to end
whole (torchrun and its workers) runs in a session of its own, so that ending it on a timeout
ends every process of it, not torchrun alone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def catching_stop_signals(on_stop: Callable[[str], None], again_interrupts: bool = True) -> Iterator[dict]:
    """While inside, SIGINT and SIGTERM call `on_stop(name)` instead of interrupting; with
    `again_interrupts`, a second one raises KeyboardInterrupt (abandoning the orderly stop).
    The state says which signal came first (`state["signal"]`). Only the main thread may set
    handlers: elsewhere nothing is caught, and whoever runs the thread handles its signals."""
    state: dict = {"signal": None}

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if state["signal"] and again_interrupts:
            raise KeyboardInterrupt
        state["signal"] = state["signal"] or name
        on_stop(name)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def end_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Ends `proc`'s whole process group (it was started with start_new_session): SIGTERM, and
    SIGKILL for what is left after `grace_s` (torchrun gives its workers 30 s to save)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_group(cmd: list[str], timeout_s: float, grace_s: float = 30.0, **popen) -> tuple[subprocess.CompletedProcess, bool]:
    """Runs `cmd` in a session of its own, its output captured as text; (the finished process,
    whether it ran out of `timeout_s`). On a timeout the whole group is ended (`end_group`), so
    no worker is left holding a card, and what it printed until then is kept."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **popen)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), False
    except subprocess.TimeoutExpired:
        end_group(proc, grace_s)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), True
