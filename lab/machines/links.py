"""What a machine keeps on each of its links, and the one locked write that changes it.

Each kind of machine keeps its own record of a link (a Kaggle kernel and its datasets, a box's
hosts and phase) in the link's `detail`, as a typed record of its own package
(`lab.machines.kaggle.record`, `lab.machines.ssh.record`); only that package reads it. The driver
decides from the link's outcome alone (`lab.runs.End`).

    get_link(run_id, n)              the run and its link n, as recorded now
    set_link(run_id, n, **changes)   detail keys (and the link's status) changed in one locked write
    LinkRecord                       the base of a kind's typed record: read from a link, written back
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from lab.runs import Link, Run, load_run, updating

R = TypeVar("R", bound="LinkRecord")


def get_link(run_id: str, n: int) -> tuple[Run, Link]:
    run = load_run(run_id)
    return run, run.links[n - 1]


def set_link(run_id: str, n: int, *, status: str | None = None, **detail: Any) -> Link:
    """Records detail keys (and the link's status) in one locked write."""
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.detail.update(detail)
        if status is not None:
            link.status = status
    return link


@dataclasses.dataclass
class LinkRecord:
    """A kind's record of one link, kept in `Link.detail` as plain JSON. Keys the record does not
    know (written by an older kit) are kept as they are and not read."""

    @classmethod
    def of(cls: type[R], link: Link) -> R:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in link.detail.items() if k in names})

    def as_detail(self) -> dict:
        """The record as a new link's `detail`."""
        return dataclasses.asdict(self)

    @classmethod
    def _known(cls, changes: dict) -> dict:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
        return changes

    @classmethod
    def update(cls, run_id: str, n: int, *, status: str | None = None, **changes: Any) -> Link:
        """`set_link` for the fields of this record only: a misspelt field is an error, not a new key."""
        return set_link(run_id, n, status=status, **cls._known(changes))

    @classmethod
    def put(cls, link: Link, **changes: Any) -> None:
        """Changes fields on a link being written (inside `lab.runs.updating`)."""
        link.detail.update(cls._known(changes))
