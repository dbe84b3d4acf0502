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
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Iterator

from lab.config import RunConfig, UserError
from lab.home import runs_dir
from lab.kernel.checkpoint import atomic_write

RECORD = "run.json"


class End(str, Enum):
    """How a link ended, as its machine reports it: the one thing the driver decides from.

    A machine ends each link with an `Outcome` and records it on the link (`lab.runs.Link.outcome`)
    in the same write that ends the link. Its kind says what the driver does next; its reason is
    what the driver says (in Russian too where the control notebook shows it); `session` says
    whether the machine started a session for the link (it spent the machine's time or quota), so
    the run "went on" there and the Auto rule may continue it elsewhere.

        CONTINUE     the session ended with its work saved (its time limit, done, a checkpoint
                     before a kill): the run goes on from its step
        LOST         the session ran and died, or its outputs were lost: only that session is lost;
                     MAX_LOST_IN_A_ROW such links one after another stop the run
        INTERRUPTED  the session died with the control process it ran in: the run goes on, and it
                     counts as no failure (nothing of the session's own went wrong)
        PUSH_AGAIN   the session found its inputs not yet mounted and trained nothing: the next link
                     is pushed again after a wait; MAX_INPUT_WAITS in a row stop the run
        BUSY         the machine refused the session: it runs its maximum of sessions (the lab's, or
                     others' it can see), or its service asked for a pause (`until`: when it may be
                     asked again, as it said); the run goes on elsewhere meanwhile, or waits for it
        NO_QUOTA     the machine refused the session: its quota is spent
        UNFIT        the session came without the cards it was pushed for and trained nothing: the
                     machine is marked unable to run such sessions (the Auto rule skips it) and the
                     run goes on elsewhere; the reason says what to fix
        ELSEWHERE    the machine cannot take this run's link for a cause of its own that waiting will
                     not soon fix (a dataset its storage does not keep as sent, after a second upload):
                     the run goes on on another machine and this one is passed over for the run; with
                     no other, the run stops and the reason says what to fix
        FAILED       the run's own cause (its data, notebook or fields), or tries that are spent and
                     were shown: the run stops here; the reason says what to fix, then `lab watch RUN`
        CANCELLED    the person cancelled the run
    """
    CONTINUE = "continue"
    LOST = "lost"
    INTERRUPTED = "interrupted"
    PUSH_AGAIN = "push-again"
    BUSY = "busy"
    NO_QUOTA = "no-quota"
    UNFIT = "unfit"
    ELSEWHERE = "elsewhere"
    FAILED = "failed"
    CANCELLED = "cancelled"


REFUSED = (End.BUSY, End.NO_QUOTA)  # the machine started nothing: another machine, or a wait for this one


@dataclass(frozen=True)
class Outcome:
    kind: End
    reason: str
    reason_ru: str | None = None
    session: bool = True  # the machine started a session for the link
    until: str | None = None  # BUSY: when the machine may be asked again, as it said (ISO 8601 UTC)
    pass_over: bool = False  # its machine lost the session: the next link goes elsewhere where one can take it

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        return cls(End(d["kind"]), d.get("reason") or "", d.get("reason_ru"), bool(d.get("session", True)),
                   d.get("until"), bool(d.get("pass_over")))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Link:
    """One session of a run on one machine. `status` is what the person sees; `outcome`, set by
    the machine in the write that ends the link, is what the driver decides from
    (End, Outcome above); `detail` is the machine's own record, which only it reads."""
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
    state: str | None = None  # where its session is now, the same words for every machine (lab.machines.lifecycle)
    state_at: str | None = None  # since when (ISO 8601 UTC)
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


@dataclass(frozen=True)
class Start:
    """Where a settled run starts: from scratch (no checkpoint), or from a checkpoint at its step:
    the run's own newest when the same run goes on, another run's when a new run starts from it."""
    checkpoint: str | None = None  # the checkpoint file on this computer
    step: int = 0
    sha256: str | None = None  # the checkpoint's, as its sidecar records it
    run: str | None = None  # the run that saved it (None: a checkpoint file from elsewhere)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Start":
        return cls(**{k: v for k, v in (d or {}).items() if k in ("checkpoint", "step", "sha256", "run")})


@dataclass(frozen=True)
class Settled:
    """A run as it was settled where it was registered (`lab.settle`), carried whole from there:
    `run.json` stores it, every link's session gets its config as it is (a push's and papermill's
    parameters, a torchrun worker's config file), and the session checks it once against the data
    and the checkpoint it opens. Nothing downstream merges it with a checkpoint again or guesses
    which fields were given.

        cfg           every field as the run trains, frozen (a continued run's model fields are its
                      checkpoint's; the fields not given, the run's or the checkpoint's as they were)
        given         the fields the person gave (the form's, a command's flags and config file)
        start         where it starts: scratch, or a checkpoint with its step and sha256
        machine       where it goes: "auto", "local", an account, a box
        data_sha256   the sha256 of its data's manifest.json, pinned with `cfg.data_dir` (None
                      until the data is prepared: the driver prepares it, then pins it, once)
    """
    cfg: RunConfig
    given: frozenset = frozenset()
    start: Start = Start()
    machine: str = "auto"
    data_sha256: str | None = None

    @classmethod
    def whole(cls, cfg: RunConfig, start: Start = Start()) -> "Settled":
        """A config taken whole, every field as given (a run recorded before settled records were
        is read so; tests make runs so)."""
        return cls(cfg, frozenset(cfg.to_dict()), start, cfg.machine or "auto")

    def pinned(self, data_dir: str, sha256: str) -> "Settled":
        """The same record with its data pinned (the driver prepared it after registration)."""
        return replace(self, cfg=replace(self.cfg, data_dir=data_dir), data_sha256=sha256)

    def to_dict(self) -> dict:
        return {"config": self.cfg.to_dict(), "given": sorted(self.given), "start": asdict(self.start),
                "machine": self.machine, "data_sha256": self.data_sha256}

    @classmethod
    def from_dict(cls, d: dict) -> "Settled":
        return cls(RunConfig.from_dict(d["config"]), frozenset(d.get("given") or ()), Start.from_dict(d.get("start")),
                   d.get("machine") or d["config"].get("machine") or "auto", d.get("data_sha256"))


@dataclass
class Run:
    id: str
    settled: Settled  # the run as it was registered (lab.settle): its whole config, what was given, its start
    created: str = field(default_factory=now)
    parent: dict | None = None  # {"run": id, "checkpoint": path, "step": n} for a run forked from a checkpoint
    links: list[Link] = field(default_factory=list)
    status: str = "new"  # new, running, stopped, done, failed, waiting

    @property
    def folder(self) -> Path:
        return runs_dir() / self.id

    @property
    def cfg(self) -> RunConfig:
        return self.settled.cfg

    @property
    def step(self) -> int:
        done = [link.to_step for link in self.links if link.to_step is not None]
        return max(done) if done else (self.parent or {}).get("step", 0)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("settled", "links")}
        return {**d, "settled": self.settled.to_dict(), "links": [asdict(link) for link in self.links]}

    @classmethod
    def from_dict(cls, d: dict) -> "Run":
        d = dict(d)
        if "settled" in d:
            settled = Settled.from_dict(d.pop("settled"))
        else:  # recorded before runs carried their settled record: its config, every field taken as given
            parent = d.get("parent") or {}
            settled = Settled.whole(RunConfig.from_dict(d.pop("config")), Start.from_dict(
                {"checkpoint": parent.get("checkpoint"), "step": parent.get("step", 0), "run": parent.get("run")}))
        return cls(**{**d, "settled": settled, "links": [Link.from_dict(link) for link in d.get("links", [])]})


def new_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cfg.layers}x{cfg.width}-{secrets.token_hex(2)}"


def create_run(settled: Settled, parent: dict | None = None) -> Run:
    run = Run(id=new_run_id(settled.cfg), settled=settled, parent=parent)
    run.folder.mkdir(parents=True)
    _write(run)
    return run


def _write(run: Run) -> None:
    """Written atomically and synced (every write but a new run's holds the run's lock)."""
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

