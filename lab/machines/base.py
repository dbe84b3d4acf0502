"""The one small interface every machine gives the driver.

A machine says what it has free (`state`), starts a session of a run as the run's next link
(`start`), follows that session to its end and collects its outputs into the run folder
(`follow`), and cancels it (`cancel`). The driver chains links into a run through this
interface alone: it never asks which machine it drives.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from lab.config import UserError
from lab.machines.auto import Machine
from lab.runs import Link, Run


@dataclass
class Follow:
    """What a machine needs from the driver while it follows a link: where to say what happens,
    whether the person asked to cancel, whether this driver started the link (False: a driver
    that died did, and a session that lived inside it died with it), and, on this computer,
    whether to stream progress and how many processes torchrun starts (0: one per GPU)."""
    say: Callable[[str], None]
    cancelled: Callable[[], bool]
    fresh: bool = True
    progress: bool = True
    nproc: int = 0


class LinkRefused(UserError):
    """The machine refused the session and started nothing: `kind` is "busy" (it runs its maximum
    of sessions), "quota" (none left) or "other"; the driver tries another machine or waits."""

    def __init__(self, machine: str, message: str, kind: str):
        self.machine, self.kind = machine, kind
        super().__init__(message)


class Host(ABC):
    """One machine the lab runs on, by its name in the lab (`local`, an account's name)."""

    name: str
    # This computer runs one link per start (its limit is the person's time): `lab watch` goes on.
    one_link_per_start: bool = False

    @abstractmethod
    def state(self, running: list[str], patient: bool = False) -> Machine:
        """What the machine has free now; `running`: the lab's runs with a session there.
        `patient`: retry as long as a run's driver does, rather than answer a person fast."""

    def check(self) -> None:
        """Raises UserError when the machine cannot be used now (unknown, credentials refused)."""

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        """What of a run's next link the machine already has: {"data", "checkpoint"}."""
        return set()

    @abstractmethod
    def start(self, run: Run, machine: Machine, why: str) -> Link:
        """Records a new link of `run` here; nothing runs before `follow`."""

    @abstractmethod
    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        """Takes the link to its end and merges its outputs into the run folder; returns the
        ended link (`detail["session_started"]` once a session was asked for). Raises
        LinkRefused, or UserError when it failed before any session ran."""

    @abstractmethod
    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        """Stops the link's session, or says how; returns what happened."""

    @abstractmethod
    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        """The end of the session's log, as far as the control side has it."""
