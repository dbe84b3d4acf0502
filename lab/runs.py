"""The run registry: the lab's runs, their links (sessions) and lineage, on disk.

Each run is a folder `$LAB_HOME/runs/<id>/` holding `run.json` (this registry's record),
the run's `config.json`, `metrics.jsonl`, `checkpoints/`, the executed notebook of each
link and `loss.png`. A run is continued in links: each link is one session on one
machine, starting from the previous link's checkpoint. `run.json` is rewritten
atomically under a lock, so a crash never leaves it half-written and two processes never
interleave their updates.
"""
from __future__ import annotations

import fcntl
import json
import secrets
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from lab.config import RunConfig, UserError
from lab.home import runs_dir
from lab.machines.outcome import End, Outcome

RECORD = "run.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Link:
    """One session of a run on one machine. `status` is what the person sees; `outcome`, set by
    the machine in the write that ends the link, is what the driver decides from
    (lab.machines.outcome); `detail` is the machine's own record, which only it reads."""
    n: int
    machine: str
    status: str = "starting"  # starting, running, stopped, done, failed, cancelled
    started: str = field(default_factory=now)
    ended: str | None = None
    from_step: int = 0
    to_step: int | None = None
    reason: str | None = None
    notebook: str | None = None
    checkpoint: dict | None = None  # {"name", "step", "sha256"} of the checkpoint it ended with
    kind: str | None = None  # the machine's kind (lab.machines.registry), so a link finds its host by itself
    limit_min: float | None = None  # the link's own time limit, where its machine set one
    outcome: Outcome | None = None  # None until the link ends
    picked: dict | None = None  # why its machine was picked, {"en", "ru"}: the Auto rule's reason or the person's pick
    detail: dict = field(default_factory=dict)  # machine-specific: kernel slug, version, datasets

    @classmethod
    def from_dict(cls, d: dict) -> "Link":
        d = dict(d)
        detail = d.get("detail") or {}
        if "outcome" not in d:  # written before links carried their outcome: read what the machines kept then
            d["outcome"] = _outcome_of_old(d.get("status"), d.get("reason") or "", detail)
            d.setdefault("kind", detail.get("kind"))
            d.setdefault("limit_min", detail.get("limit_min"))
        elif d["outcome"] is not None:
            d["outcome"] = Outcome.from_dict(d["outcome"])
        return cls(**d)


def _outcome_of_old(status: str | None, reason: str, detail: dict) -> Outcome | None:
    """The outcome of a link recorded before outcomes were: from its status and the flags its
    machine set in `detail` then (this computer: `abandoned`; a Kaggle account: `refused`,
    `input_not_ready`, `session_started` once pushed; this computer's links are their session)."""
    session = bool(detail.get("session_started")) or detail.get("kind") == "local"
    if status in ("done", "stopped"):
        return Outcome(End.CONTINUE, reason)
    if status == "cancelled":
        return Outcome(End.CANCELLED, reason, session=session)
    if status != "failed":
        return None  # still starting or running
    if detail.get("refused"):
        return Outcome(End.NO_QUOTA, reason, session=session)
    if detail.get("abandoned"):
        return Outcome(End.INTERRUPTED, reason)
    if detail.get("input_not_ready"):
        return Outcome(End.PUSH_AGAIN, reason)
    return Outcome(End.LOST if session else End.FAILED, reason, session=session)


@dataclass
class Run:
    id: str
    config: dict
    created: str = field(default_factory=now)
    parent: dict | None = None  # {"run": id, "checkpoint": path, "step": n} for a run forked from a checkpoint
    links: list[Link] = field(default_factory=list)
    status: str = "new"  # new, running, stopped, done, failed, waiting

    @property
    def folder(self) -> Path:
        return runs_dir() / self.id

    @property
    def cfg(self) -> RunConfig:
        return RunConfig.from_dict(self.config)

    @property
    def step(self) -> int:
        done = [link.to_step for link in self.links if link.to_step is not None]
        return max(done) if done else (self.parent or {}).get("step", 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Run":
        return cls(**{**d, "links": [Link.from_dict(link) for link in d.get("links", [])]})


def new_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cfg.layers}x{cfg.width}-{secrets.token_hex(2)}"


def create_run(cfg: RunConfig, parent: dict | None = None) -> Run:
    run = Run(id=new_run_id(cfg), config=cfg.to_dict(), parent=parent)
    run.folder.mkdir(parents=True)
    _write(run)
    return run


def _write(run: Run) -> None:
    """Written atomically and synced (every write but a new run's holds the run's lock)."""
    from lab.kernel.checkpoint import atomic_write
    text = json.dumps(run.to_dict(), indent=1, ensure_ascii=False)
    atomic_write(run.folder / RECORD, lambda f: f.write(text.encode("utf-8")))


def load_run(ref: str) -> Run:
    """A run by id (or a unique prefix of one) or by its folder."""
    path = Path(ref).expanduser()
    if not (path / RECORD).is_file():
        matches = [p for p in _run_folders() if p.name == ref] or [p for p in _run_folders() if p.name.startswith(ref)]
        if len(matches) != 1:
            known = ", ".join(p.name for p in _run_folders()[-5:]) or "none yet"
            raise UserError(f"no run {ref!r}" + (" (several match)" if matches else "") +
                            f"; recent runs: {known} (see `lab runs`)")
        path = matches[0]
    return Run.from_dict(json.loads((path / RECORD).read_text(encoding="utf-8")))


def _run_folders() -> list[Path]:
    root = runs_dir()
    return sorted(p for p in root.iterdir() if (p / RECORD).is_file()) if root.is_dir() else []


def list_runs() -> list[Run]:
    return [Run.from_dict(json.loads((p / RECORD).read_text(encoding="utf-8"))) for p in _run_folders()]


@contextmanager
def updating(run_id: str) -> Iterator[Run]:
    """Read-modify-write of a run's record under an exclusive lock."""
    folder = runs_dir() / run_id
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            run = load_run(str(folder))
            yield run
            _write(run)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lineage(run: Run) -> list[str]:
    """The run's ancestors, oldest first, then the run itself."""
    chain, seen = [run.id], {run.id}
    while run.parent and run.parent.get("run") and run.parent["run"] not in seen:
        try:
            run = load_run(run.parent["run"])
        except UserError:
            break
        chain.append(run.id)
        seen.add(run.id)
    return list(reversed(chain))

