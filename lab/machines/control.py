"""The control side's own state of a run, beside the registry: who drives it (a lock the OS
drops when its process dies), what the driver last said (`control.json`), a cancel request, the
driver's log (`control.log`), and the background process that drives a run.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.home import lab_home, runs_dir
from lab.kernel.checkpoint import atomic_write
from lab.machines.registry import class_of
from lab.runs import Link, Run, list_runs, now

ACTIVE = ("starting", "running")


def spawn_driver(run_id: str, resume: bool = False) -> int:
    """`python -m lab.machines.background RUN` in its own session: it survives the notebook."""
    cmd = [sys.executable, "-m", "lab.machines.background", run_id] + (["--resume"] if resume else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LAB_HOME": str(lab_home())}
    with open(runs_dir() / run_id / "driver.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    spawned[run_id] = proc
    return proc.pid


spawned: dict[str, subprocess.Popen] = {}  # kept so finished drivers are reaped, not left as zombies


def _control_file(run_id: str) -> Path:
    return runs_dir() / run_id / "control.json"


def read_control(run_id: str) -> dict:
    return read_json(_control_file(run_id)) or {}


def set_control(run_id: str, **values) -> None:
    write_json(_control_file(run_id), {**read_control(run_id), **values, "updated": now()})


def read_json(path: Path) -> dict | None:
    """A JSON object the lab wrote (a record, a state), or None where it is missing or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict) -> None:
    text = json.dumps(value, indent=1, ensure_ascii=False)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def cancel_flag(run_id: str) -> Path:
    return runs_dir() / run_id / "cancel-requested"


def cancel_requested(run_id: str) -> bool:
    return cancel_flag(run_id).exists()


class DriverLock:
    """Held by the one process driving a run; the OS drops it when that process dies."""
    def __init__(self, run_id: str):
        self.path = runs_dir() / run_id / ".driver.lock"
        self.file = None

    def acquire(self) -> bool:
        self.file = open(self.path, "a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            self.release()
            return False

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # (closing the file drops its lock)
            self.file = None


def driver_alive(run_id: str) -> bool:
    lock = DriverLock(run_id)
    if not lock.path.parent.is_dir():
        return False
    if lock.acquire():
        lock.release()
        return False
    return True


def active_link(run: Run) -> Link | None:
    return run.links[-1] if run.links and run.links[-1].status in ACTIVE else None


def active_runs() -> dict[str, list[str]]:
    """Machine -> the runs with a session there now (one inside its driver's process lives as long as it)."""
    out: dict[str, list[str]] = {}
    for run in list_runs():
        link = active_link(run)
        try:
            in_driver = link is not None and class_of(link).session_in_driver
        except UserError:  # a machine no longer in the lab: its session, if any, is not the lab's to count
            in_driver = False
        if link is not None and (not in_driver or driver_alive(run.id)):
            out.setdefault(link.machine, []).append(run.id)
    return out


def logged(run_id: str, say: Callable[[str], None]) -> Callable[[str], None]:
    log = runs_dir() / run_id / "control.log"

    def both(text: str) -> None:
        say(text)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
    return both


def tail(path: Path, lines: int) -> str:
    """The last lines of a log file (its last 64 KiB read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return tail_text(text, lines)


def tail_text(text: str, lines: int) -> str:
    out = [line.rsplit("\r", 1)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join([line for line in out if line.strip()][-lines:])
