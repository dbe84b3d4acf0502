"""The lab's own machines as stored on this computer, boxes and clusters alike: each a folder
`$LAB_HOME/machines/<name>/` with its record (a box's `machine.json`, a cluster's `cluster.json`; no
password, no key), `check.json` (the last `lab machines check`), `check/` (its training burst as a run
folder: a measured speed on the machine's cards) and `holds.json` (the data each of its hosts holds).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from lab.config import UserError, card_set
from lab.home import machines_dir
from lab.kaggle.probed import store_measurement
from lab.machines.control import read_json, write_json

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
DEFAULT_PYTHON = "python3"  # a box's or a cluster's Python where none is given
ROOM_GB = 0.1  # room a session needs in a machine's workdir beyond what is copied (its checkpoints, its log)
CHECK_FILE, HOLDS_FILE, BURST_FOLDER = "check.json", "holds.json", "check"


class Stored:
    """One of the lab's own machines as stored here, its record `FILE` in its folder (a dataclass of kind `KIND`)."""
    FILE = NOUN = HOW = KIND = ""

    def to_dict(self) -> dict:
        return {"kind": self.KIND, **asdict(self)}

    @property
    def folder(self) -> Path:
        return machines_dir() / self.name

    def store(self, taken: list[str]) -> "Stored":
        if not NAME.fullmatch(self.name):
            raise UserError(f"{self.name!r} is not a machine name: use a-z, 0-9, '-' and '_' (at most 40), "
                            "starting with a letter or digit")
        if self.name in taken or self.folder.is_dir():
            raise UserError(f"the lab already has a machine called '{self.name}': pick another name, or `lab "
                            f"machines remove {self.name}` first")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / self.FILE, self.to_dict())
        return self

    def remove(self) -> None:
        shutil.rmtree(self.folder)

    @classmethod
    def all(cls) -> list:
        root = machines_dir()
        found = [read_json(folder / cls.FILE) for folder in sorted(root.iterdir())] if root.is_dir() else []
        return [cls.from_dict(r) for r in found if r is not None]

    @classmethod
    def get(cls, name: str):
        found = [m for m in cls.all() if m.name == name]
        if not found:
            known = ", ".join(m.name for m in cls.all()) or "none yet"
            raise UserError(f"no {cls.NOUN} '{name}' in the lab (its {cls.NOUN}s: {known}); add one with `{cls.HOW}`")
        return found[0]


def read_check(name: str) -> dict | None:
    return read_json(machines_dir() / name / CHECK_FILE)


def write_check(name: str, record: dict) -> None:
    write_json(machines_dir() / name / CHECK_FILE, record)


def check_problem(name: str) -> str | None:
    """Why the machine's last check says it cannot run the lab's sessions (what to fix), or None."""
    record = read_check(name)
    if not record or record.get("can_run", True) is not False:
        return None
    return f"{record.get('why')} Then `lab machines check {name}`."


def store_burst(name: str, host: dict) -> None:
    if not host.get("metrics") or not (host.get("worker") or {}).get("burst"):
        return
    with tempfile.TemporaryDirectory(prefix="lab-check-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        metrics.write_text(host["metrics"], encoding="utf-8")
        gpu = card_set(host["gpus"][0]["name"], len(host["gpus"])) if host.get("gpus") else "cpu"
        store_measurement(machines_dir() / name / BURST_FOLDER, metrics, host, gpu)


def holds_data(name: str, host: int, key: str) -> bool:
    return key in (read_json(machines_dir() / name / HOLDS_FILE) or {}).get(str(host), [])


def note_data(name: str, host: int, key: str, held: bool = True) -> None:
    path = machines_dir() / name / HOLDS_FILE
    holds = read_json(path) or {}
    holds[str(host)] = [k for k in holds.get(str(host), []) if k != key] + ([key] if held else [])
    write_json(path, holds)

