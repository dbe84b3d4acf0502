"""The lab's own machines over SSH, as stored on this computer: a box, or a group of boxes that
trains one run across its hosts under torchrun.

Each is a folder `$LAB_HOME/machines/<name>/`: `machine.json` (its hosts as `ssh` reaches
them, the box's Python and workdir; no password, no key: the person's ssh client and agent
hold those), `check.json` (the last `lab machines check`: Python, torch, CUDA, the cards, free
disk, what is missing and the line that installs it), `check/` (the check's training burst as a
run folder the calculator reads as a measured speed) and `holds.json` (which prepared data is
on each host already).
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from lab.config import UserError
from lab.home import machines_dir
from lab.kernel.checkpoint import atomic_write
from lab.machines.ssh.client import Address

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
DEFAULT_PYTHON = "python3"
DEFAULT_WORKDIR = "lab-box"  # relative: in the remote user's home
ROOM_GB = 0.1  # room a session needs in a box's workdir beyond what is copied (its checkpoints, its log)
MACHINE_FILE, CHECK_FILE, HOLDS_FILE, BURST_FOLDER = "machine.json", "check.json", "holds.json", "check"


@dataclass
class Box:
    """One of the lab's SSH machines: one host, or a group of hosts (node 0 first)."""
    name: str
    hosts: list[Address]
    python: str = DEFAULT_PYTHON
    workdir: str = DEFAULT_WORKDIR
    added: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def folder(self) -> Path:
        return machines_dir() / self.name

    @property
    def where(self) -> str:
        """The machine as messages name it: "box 'gpu1' (me@gpu1.lab)"."""
        hosts = ", ".join(a.host for a in self.hosts)
        return f"{'group' if len(self.hosts) > 1 else 'box'} '{self.name}' ({hosts})"

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": "ssh", "hosts": [a.to_dict() for a in self.hosts], "python": self.python,
                "workdir": self.workdir, "added": self.added}

    @classmethod
    def from_dict(cls, d: dict) -> "Box":
        return cls(d["name"], [Address.from_dict(h) for h in d["hosts"]], d.get("python") or DEFAULT_PYTHON,
                   d.get("workdir") or DEFAULT_WORKDIR, d.get("added") or "")


def parse_hosts(ssh: str | None, hosts: str | None, port: int | None) -> list[Address]:
    """The hosts of `--ssh [USER@]HOST` or `--hosts H1,H2,...`, each with `--port` if given."""
    if bool(ssh) == bool(hosts):
        raise UserError("give the machine's host: --ssh [USER@]HOST for one box, or --hosts H1,H2,... for a group")
    names = [ssh] if ssh else [h.strip() for h in hosts.split(",") if h.strip()]
    for host in names:
        if not re.fullmatch(r"[A-Za-z0-9_.@%:\[\]-]+", host) or host.startswith("-"):
            raise UserError(f"{host!r} is not a host as ssh takes it ([USER@]HOST, or an alias of your ssh config)")
    if len(set(names)) != len(names):
        raise UserError(f"a host is named twice in --hosts {hosts}: each host of a group trains its own part")
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535)")
    return [Address(host, port) for host in names]


def add_box(name: str, hosts: list[Address], python: str | None = None, workdir: str | None = None,
            taken: list[str] = ()) -> Box:
    """Stores a new machine; `taken`: the names the lab's other machines have."""
    if not NAME.fullmatch(name):
        raise UserError(f"{name!r} is not a machine name: use a-z, 0-9, '-' and '_' (at most 40), starting with a "
                        "letter or digit")
    if name in taken or (machines_dir() / name / MACHINE_FILE).is_file():
        raise UserError(f"the lab already has a machine called '{name}': pick another name, or `lab machines "
                        f"remove {name}` first")
    box = Box(name, hosts, python or DEFAULT_PYTHON, workdir or DEFAULT_WORKDIR)
    box.folder.mkdir(parents=True, exist_ok=True)
    _write(box.folder / MACHINE_FILE, box.to_dict())
    return box


def remove_box(name: str) -> None:
    box = get_box(name)
    shutil.rmtree(box.folder)


def list_boxes() -> list[Box]:
    root = machines_dir()
    found = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        record = _read(folder / MACHINE_FILE)
        if record is not None:
            found.append(Box.from_dict(record))
    return found


def get_box(name: str) -> Box:
    record = _read(machines_dir() / name / MACHINE_FILE)
    if record is None:
        known = ", ".join(b.name for b in list_boxes()) or "none yet"
        raise UserError(f"no SSH machine '{name}' in the lab (its SSH machines: {known}); add one with "
                        "`lab machines add NAME --ssh [USER@]HOST`")
    return Box.from_dict(record)


# ---------------------------------------------------------------------------------------------
# What the machine's check found, and what its hosts hold


def read_check(name: str) -> dict | None:
    return _read(machines_dir() / name / CHECK_FILE)


def write_check(name: str, record: dict) -> None:
    _write(machines_dir() / name / CHECK_FILE, record)


def burst_folder(name: str) -> Path:
    return machines_dir() / name / BURST_FOLDER


def check_problem(name: str) -> str | None:
    """Why the machine's last check says it cannot run the lab's sessions (what to fix), or
    None: it can, or it was never checked."""
    record = read_check(name)
    if not record or record.get("can_run", True) is not False:
        return None
    return f"{record.get('why')} Then `lab machines check {name}`."


def holds_data(name: str, host: int, key: str) -> bool:
    return key in (_read(machines_dir() / name / HOLDS_FILE) or {}).get(str(host), [])


def note_data(name: str, host: int, key: str, held: bool = True) -> None:
    path = machines_dir() / name / HOLDS_FILE
    holds = _read(path) or {}
    keys = [k for k in holds.get(str(host), []) if k != key] + ([key] if held else [])
    holds[str(host)] = keys
    _write(path, holds)


def _read(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write(path: Path, value: dict) -> None:
    text = json.dumps(value, indent=1, ensure_ascii=False)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
