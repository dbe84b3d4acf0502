"""Processes below this one: found from /proc, signalled as a tree.

Jupyter kernels start in their own session, so a Ctrl-C at the terminal or a SIGTERM to
papermill never reaches the training loop inside the kernel. Whoever runs a notebook
forwards the signal to the run's session instead (the processes below it working in the run's
folder: the kernel papermill started there, and torchrun and its workers); the loop's saver turns
SIGTERM into a checkpoint at the next step boundary. Only those: the process that runs one run
may have started others (a notebook's background runs, a test's servers), and they go on.
"""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
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


def working_in(folder: Path, pid: int | None = None) -> list[int]:
    """The live processes below `pid` (this process by default) whose working directory is `folder`."""
    where = os.path.realpath(folder)
    found = []
    for p in descendants(os.getpid() if pid is None else pid):
        try:
            if os.readlink(f"/proc/{p}/cwd") == where:
                found.append(p)
        except OSError:  # ended since, or not ours to read
            continue
    return found


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_session(folder: Path, sig: int, pid: int | None = None) -> None:
    """`sig` to the run's session: each process below `pid` (this one by default) working in `folder`."""
    for p in working_in(folder, pid):
        signal_quietly(p, sig)


@contextmanager
def forwarding_stop_signals(folder: Path, say=print) -> Iterator[dict]:
    """While inside, the first SIGINT or SIGTERM is passed on as SIGTERM to the session working in
    the run's `folder` (it saves and stops); a second one interrupts this process as usual."""
    def forward(name: str) -> None:
        say("stopping: the run saves a checkpoint at the next step (press Ctrl-C again to abandon it)")
        signal_session(folder, signal.SIGTERM)

    with catching_stop_signals(forward) as caught:
        yield caught
