"""What a link on one of the lab's boxes holds (its `detail`), typed: read by this package only."""
from __future__ import annotations

from dataclasses import dataclass, field

from lab.machines.links import LinkRecord


@dataclass
class BoxLinkRecord(LinkRecord):
    """A box's link: its folder in the run, its phase (planned, staged, launching, launched,
    collected, ended, merged), why its machine was picked, the checkpoint it starts from, each
    host's paths and state, the group's rendezvous, what came back, whether a stop was sent, and
    how the session ended on each host."""
    folder: str = ""
    phase: str = "planned"
    why: str = ""
    source: dict | None = None  # {"path", "name", "step", "sha256"}
    hosts: list = field(default_factory=list)
    endpoint: str | None = None
    output: dict | None = None
    stop_sent: bool = False
    last: dict | None = None
