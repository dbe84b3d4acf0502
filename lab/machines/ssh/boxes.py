"""The lab's boxes over SSH as stored on this computer (`machine.json`: lab.machines.remote.store), one host
or a group that trains one run across its hosts; and `lab machines check NAME` on one."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from lab.machines.remote.check import BoxPlan, check_host, verdict
from lab.machines.remote.client import Address, Shell
from lab.machines.remote.store import DEFAULT_PYTHON, Stored, store_burst, write_check

DEFAULT_WORKDIR = "lab-box"  # relative: in the remote user's home


@dataclass
class Box(Stored):
    """One of the lab's SSH machines: one host, or a group of hosts (node 0 first)."""
    FILE, NOUN, HOW, KIND = "machine.json", "SSH machine", "lab machines add NAME --ssh [USER@]HOST", "ssh"
    name: str
    hosts: list[Address]
    python: str = DEFAULT_PYTHON
    workdir: str = DEFAULT_WORKDIR
    added: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def where(self) -> str:  # as messages name it: "box 'gpu1' (me@gpu1.lab)"
        hosts = ", ".join(a.host for a in self.hosts)
        return f"{'group' if len(self.hosts) > 1 else 'box'} '{self.name}' ({hosts})"

    @classmethod
    def from_dict(cls, d: dict) -> "Box":
        return cls(d["name"], [Address.from_dict(h) for h in d["hosts"]], d.get("python") or DEFAULT_PYTHON,
                   d.get("workdir") or DEFAULT_WORKDIR, d.get("added") or "")


def add_box(name: str, hosts: list[Address], python: str | None = None, workdir: str | None = None,
            taken: list[str] = ()) -> Box:
    return Box(name, hosts, python or DEFAULT_PYTHON, workdir or DEFAULT_WORKDIR).store(taken)


def shells(box: Box) -> list[Shell]:
    return [Shell(address, box.python, box.where, box.name) for address in box.hosts]


def check_machine(name: str, say: Callable[[str], None] = print, plan: BoxPlan | None = None) -> dict:
    plan, box = plan or BoxPlan(), Box.get(name)
    started = datetime.now(timezone.utc)
    hosts = []
    for i, shell in enumerate(shells(box)):
        say(f"{box.where}: checking {shell.label}" + (" (with a short training burst)" if i == 0 else ""))
        hosts.append(check_host(shell, box.workdir, plan, burst=i == 0))
    record = verdict(box.name, box.python, hosts, started)
    store_burst(name, hosts[0])
    write_check(name, record)
    return record
