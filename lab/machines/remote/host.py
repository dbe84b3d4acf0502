"""What the lab's own machines share as the driver's hosts, boxes and Slurm clusters alike."""
from __future__ import annotations

from lab.machines.auto import Machine
from lab.machines.base import Host
from lab.machines.control import spawn_driver, tail
from lab.machines.lifecycle import Away, live
from lab.machines.remote.store import Stored, check_problem, holds_data, read_check
from lab.runs import Link, Run


class OwnHost(Host):
    """One of the lab's own machines, stored here as its kind's `stored` record (a box, a cluster)."""
    stored: type[Stored]
    holding = 1  # how many of its hosts must hold the data (a cluster's shared file system is one)

    @property
    def machine(self):
        return self.stored.get(self.name)

    @property
    def where(self) -> str:
        return self.machine.where

    @classmethod
    def names(cls) -> list[str]:
        return [m.name for m in cls.stored.all()]

    def checked(self, running: list[str], hosts: int) -> Machine:
        """The machine as its last check found it: its cards, and why it cannot run the lab's sessions."""
        record = read_check(self.name) or {}
        m = Machine(self.name, self.kind, record.get("gpu") or "unchecked", running=list(running),
                    cards=list(record.get("cards") or []), checked=record.get("at"), hosts=hosts)
        m.error = check_problem(self.name)
        return m

    def cards(self) -> str | None:
        return (read_check(self.name) or {}).get("gpu")

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        return {"data"} if data_id and all(holds_data(self.name, i, data_id) for i in range(self.holding)) else set()

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid is None:
            spawn_driver(run.id)  # someone must end the link and bring back what the session saves
        if Away.of(link).phase in ("planned", "staged"):
            return f"run {run.id}: cancelled before its session started on {self.where}; none starts"
        return (f"run {run.id}: the session on {self.where} saves a checkpoint and stops; its outputs come back when "
                "it has")

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        folder = run.folder / Away.of(link).folder
        return tail(folder / "session.log", lines) or tail(folder / "live.log", lines)

    def live(self, run: Run, link: Link) -> dict | None:
        return live(run, link, self.waiting(link))

    def waiting(self, link: Link) -> tuple[str, str] | None:  # (English, Russian) of why its session waits
        return None
