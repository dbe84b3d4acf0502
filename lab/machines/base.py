"""The one small interface every machine gives the driver, which chains links into a run through it alone.
Each kind is one entry in lab.machines.registry, and builds its own settings."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from lab.config import Problem, RunConfig, UserError
from lab.machines.auto import Machine
from lab.runs import Link, Run


@dataclass
class Follow:
    """What a machine needs from the driver while it follows a link."""
    say: Callable[[str], None]
    cancelled: Callable[[], bool]  # whether the person asked to cancel
    fresh: bool = True  # False: a driver that died started the link, and a session inside it died with it
    progress: bool = True  # on this computer: stream progress, and the processes torchrun starts (0: one per GPU)
    nproc: int = 0


class Host(ABC):
    """One machine the lab runs on, by its name in the lab (`local`, an account's name)."""
    kind: str  # its key in lab.machines.registry, recorded on each of its links
    # This computer runs one link per start (its limit is the person's time): `lab watch` goes on.
    one_link_per_start: bool = False
    # Its session runs inside the driver's process, so it lives exactly as long as that driver.
    session_in_driver: bool = False
    # Listed among the lab's machines (and considered by Auto); an unlisted kind is used by name only.
    listed: bool = True

    def __init__(self, name: str):
        self.name = name

    @classmethod
    @abstractmethod
    def names(cls) -> list[str]:
        """The lab's machines of this kind, by name (no call to any service)."""

    @abstractmethod
    def state(self, running: list[str], patient: bool = False) -> Machine:
        """What the machine has free now; `running`: the lab's runs with a session there."""

    def check(self, say: Callable[[str], None] = print) -> None:
        """Raises UserError when the machine cannot be used now; `say` hears what a long check does."""

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        """What of a run's next link the machine already has: {"data", "checkpoint"}."""
        return set()

    def limits(self, cfg: RunConfig) -> list[Problem]:
        """What the run's fields meet on this machine (a session's longest time there); none by default."""
        return []

    @classmethod
    def limits_under_auto(cls, cfg: RunConfig) -> list[Problem]:
        """What Auto meets on machines of this kind, as notes: Auto's links there are capped."""
        return []

    def cards(self) -> str | None:
        """The cards its sessions train on, as the calculator names them; None where not known yet."""
        return None

    @abstractmethod
    def start(self, run: Run, machine: Machine, why: str) -> Link:
        """Records a new link of `run` here (with its own limit); nothing runs before `follow`."""

    @abstractmethod
    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        """Takes the link to its end, merges its outputs into the run folder, and returns the ended link
        with its `outcome`. Raises UserError only when it could not end it now: `lab watch RUN` goes on."""

    @abstractmethod
    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        """Stops the link's session, or says how; returns what happened."""

    def cancel_loses(self, run: Run, link: Link) -> tuple[str, str] | None:
        """(English, Russian) of what a cancel loses where the session cannot save first; None where it can."""
        return None

    @abstractmethod
    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        """The end of the session's log, as far as the control side has it."""

    def session_page(self, link: Link) -> str | None:
        """Where a person sees (and stops) the link's session by hand, if it has such a page."""
        return None

    def live(self, run: Run, link: Link) -> dict | None:
        """The running link's curve as its machine shows it (lab.machines.lifecycle.live); None: the run's own."""
        return None


def env_seconds(var: str, default: float, unit: str = "seconds") -> float:
    """A positive number (of seconds, or `unit`) the person set in the environment, else `default`."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{var}={raw!r} is not a number of {unit}") from None
    if value <= 0:
        raise UserError(f"{var} must be positive (got {raw})")
    return value
