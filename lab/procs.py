"""Processes below this one: found from /proc, signalled as a tree.

Jupyter kernels start in their own session, so a Ctrl-C at the terminal or a SIGTERM to
papermill never reaches the training loop inside the kernel. Whoever runs a notebook
forwards the signal to its descendants instead; the loop's saver turns SIGTERM into a
checkpoint at the next step boundary.
"""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Iterator

from lab.kernel.signals import catching_stop_signals


def descendants(pid: int) -> list[int]:
    """All live processes below `pid` (empty where there is no /proc)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo and len(found) < 10_000:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def forwarding_stop_signals(say=print) -> Iterator[dict]:
    """While inside, the first SIGINT or SIGTERM is passed on to every descendant as SIGTERM
    (they save and stop); a second one interrupts this process as usual."""
    def forward(name: str) -> None:
        say("stopping: the run saves a checkpoint at the next step (press Ctrl-C again to abandon it)")
        for pid in descendants(os.getpid()):
            signal_quietly(pid, signal.SIGTERM)

    with catching_stop_signals(forward) as caught:
        yield caught
