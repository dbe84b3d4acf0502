"""One link's spec: the run's config and this session's own fields, carried whole in one JSON form.

A run is settled once into a frozen `RunConfig` (lab.settle). Each link of it runs one session
somewhere, and that session needs more than the run: its own time limit (the run's wish, capped
by its machine: an account's quota, a partition's time limit, the time a group already spent),
where its data and checkpoint lie there and the sha256 each must have, the cards it was sent for,
its place in a group of hosts. `LinkSpec` holds both halves, `run` and `session`; its one JSON
form (`to_dict`) is what the link records in `run.json`, what papermill gives the training
notebook as its parameters (`run`, `session`) and what the notebook writes for its torchrun
workers. Nothing converts it on the way.

Stdlib only: the training notebook pastes this module, as it pastes `lab.config`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from lab.config import SESSION_FIELDS, ConfigError, Problem, RunConfig


@dataclass(frozen=True)
class Session:
    """What one session of a run needs beyond the run's fields, set by the machine that runs it."""
    limit_min: float = 0.0  # this link's own limit: the run's wish capped by its machine; 0: the run's own
    data_dir: str = ""  # the prepared data there; empty: found under /kaggle/input or beside the notebook
    resume_from: str = ""  # the checkpoint there (a file, a folder, or a dataset's mount name); empty: from scratch
    out_dir: str = ""  # where outputs go; empty: /kaggle/working on Kaggle, ./run elsewhere
    expect_data_sha256: str = ""  # sha256 of the data's manifest.json this session must find; empty: any
    expect_ckpt_sha256: str = ""  # sha256 of the checkpoint this session must resume from; empty: any
    expect_cards: str = ""  # the cards it was sent for ("2xT4"): without them it stops before training
    allow_cpu: bool = False  # with expect_cards: train on the CPU when the cards are missing
    nccl_env: dict = field(default_factory=dict)  # NCCL settings for the workers, from the account's probe
    nproc: int = 0  # processes under torchrun; 0: one per GPU (DDP when there are two or more)
    nnodes: int = 1  # hosts that train this run together under torchrun; 1: this one
    node_rank: int = 0  # this host's place in the group: 0 for the first, whose outputs are the run's
    rdzv_endpoint: str = ""  # where the group's hosts meet: HOST:PORT on the first host
    allow_fallback: bool = False  # a corrupt newest checkpoint: continue from the previous good one
    plot_every_s: float = 30.0  # seconds between redraws of the loss plot
    plot_x: str = "step"  # the plot's x axis: step or tokens

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Session":
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError([Problem(unknown[0], f"unknown session field(s): {', '.join(unknown)}",
                                       f"неизвестные поля сессии: {', '.join(unknown)}")])
        typed = {}
        for name, value in values.items():
            kind = type(known[name].default) if known[name].default is not dataclasses.MISSING else dict
            typed[name] = dict(value or {}) if kind is dict else kind(value)
        return cls(**typed)


@dataclass(frozen=True)
class LinkSpec:
    """The run's config and one session's fields: what a link carries whole, in one JSON form."""
    run: RunConfig
    session: Session = Session()

    @classmethod
    def of(cls, run: RunConfig, **session) -> "LinkSpec":
        """A link's spec: the run's fields without where the control side keeps its files (those
        are this session's, in `session`), and the session's own fields."""
        return cls(dataclasses.replace(run, **{name: "" for name in SESSION_FIELDS if name != "machine"}),
                   Session(**session))

    @property
    def limit_min(self) -> float:
        """The minutes this session may train: its own limit, else the run's."""
        return self.session.limit_min or self.run.limit_min

    def with_session(self, **changes) -> "LinkSpec":
        return dataclasses.replace(self, session=dataclasses.replace(self.session, **changes))

    def to_dict(self) -> dict:
        return {"run": self.run.to_dict(), "session": self.session.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)

    @classmethod
    def from_dict(cls, values: dict) -> "LinkSpec":
        unknown = sorted(set(values) - {"run", "session"})
        if unknown:
            raise ConfigError([Problem(unknown[0], f"a link's spec has 'run' and 'session', not {', '.join(unknown)}",
                                       f"в описании звена есть 'run' и 'session', а не {', '.join(unknown)}")])
        return cls(RunConfig.from_dict(values.get("run") or {}), Session.from_dict(values.get("session") or {}))

    @classmethod
    def from_json(cls, text: str) -> "LinkSpec":
        return cls.from_dict(json.loads(text))
