"""The lab's Slurm clusters as stored on this computer (`cluster.json` beside a box's records:
lab.machines.remote.store), and the rule for a job's time: the cluster's `--time`, else the partition's
default, else its maximum. The notebook's own limit lies inside it by a margin (`job_time`), and Slurm
signals the job `signal_s` before its end: whichever comes first, the saver runs before Slurm's kill.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from lab.config import UserError
from lab.machines.remote.client import Address, Shell, parse_hosts
from lab.machines.remote.store import DEFAULT_PYTHON, Stored

LOCAL = "local"  # `--slurm local`: Slurm's commands run on this computer (it is the login node)
DEFAULT_WORKDIR = "lab-slurm"  # relative: in the home on the cluster's shared file system
GRES = re.compile(r"[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:\d+)?(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:\d+)?)*")
SLURM_WORD = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass
class Cluster(Stored):
    """One Slurm partition the lab sends jobs to, reached from `login` (None: this computer)."""
    FILE, NOUN, HOW = "cluster.json", "Slurm cluster", "lab machines add NAME --slurm [USER@]LOGIN_HOST --partition P"
    KIND = "slurm"
    name: str
    login: Address | None
    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    gres: str | None = None  # the cards per node, as sbatch's --gres takes them ("gpu:2", "gpu:a100:4")
    nodes: int = 1
    time_min: int | None = None  # the job's time limit; None: the partition's
    python: str = DEFAULT_PYTHON
    workdir: str = DEFAULT_WORKDIR
    added: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def shell(self) -> Shell:  # its login node as the kit reaches it
        return Shell(self.login, self.python, self.where, self.name)

    @property
    def where(self) -> str:
        """The cluster as messages name it: "cluster 'hpc' (login.hpc.edu, partition gpu)"."""
        login = "this computer" if self.login is None else self.login.host
        partition = f"partition {self.partition}" if self.partition else "its default partition"
        return f"cluster '{self.name}' ({login}, {partition})"

    @classmethod
    def from_dict(cls, d: dict) -> "Cluster":
        login = Address.from_dict(d["login"]) if d.get("login") else None
        return cls(d["name"], login, d.get("partition"), d.get("account"), d.get("gres"), int(d.get("nodes") or 1),
                   d.get("time_min"), d.get("python") or DEFAULT_PYTHON, d.get("workdir") or DEFAULT_WORKDIR,
                   d.get("added") or "")


def parse_login(slurm: str, port: int | None) -> Address | None:
    if slurm.strip() == LOCAL:
        if port is not None:
            raise UserError("--port is for a login node reached over ssh; `--slurm local` runs Slurm's commands here")
        return None
    return parse_hosts(slurm, None, port)[0]


def parse_time(text: str) -> int:
    """Seconds of a Slurm time as sbatch and scontrol write it ("90", "1:30:00", "2-00:00:00"; "UNLIMITED": 0)."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", ""):
        return 0
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    if not (days.isdigit() or days == "") or not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise UserError(f"{text!r} is not a time as Slurm writes it (minutes, H:MM:SS or D-HH:MM:SS)")
    numbers = [int(p) for p in parts]
    if days:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # M, M:S, H:M:S
        hours, minutes, seconds = numbers if len(numbers) == 3 else ([0] + numbers + [0])[:3]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def checked_shape(partition: str | None, account: str | None, gres: str | None, nodes: int | None,
                  time: str | None) -> dict:
    for flag, value in (("--partition", partition), ("--account", account)):
        if value is not None and not SLURM_WORD.fullmatch(value):
            raise UserError(f"{flag} {value!r}: a Slurm name is letters, digits and . _ + -")
    if gres is not None and not GRES.fullmatch(gres):
        raise UserError(f"--gres {gres!r} is not as sbatch takes it: NAME[:TYPE][:COUNT], e.g. gpu:2 or gpu:a100:4")
    if nodes is not None and not 1 <= nodes <= 1024:
        raise UserError(f"--nodes {nodes}: a run takes 1 to 1024 nodes")
    minutes = None
    if time is not None:
        seconds = parse_time(time)
        if seconds < 60:
            raise UserError(f"--time {time}: a job of the lab's needs at least a minute (Slurm counts whole minutes)")
        minutes = math.ceil(seconds / 60)
    return {"partition": partition, "account": account, "gres": gres, "nodes": nodes or 1, "time_min": minutes}


def add_cluster(name: str, login: Address | None, shape: dict, python: str | None = None,
                workdir: str | None = None, taken: list[str] = ()) -> Cluster:
    if workdir and re.search(r"\s", workdir):
        raise UserError(f"--workdir {workdir!r}: give a folder without spaces (a job script's #SBATCH lines name it)")
    return Cluster(name, login, python=python or DEFAULT_PYTHON, workdir=workdir or DEFAULT_WORKDIR,
                   **shape).store(taken)


@dataclass(frozen=True)
class JobTime:
    """A job's time limit (whole minutes), the notebook's own limit inside it, and when Slurm signals it."""
    minutes: int
    limit_min: float
    signal_s: int


def margin_s(job_s: int) -> int:
    """What a job keeps after the notebook's limit for its start, the final save and the outputs: a tenth
    of the job, at least two minutes (half of a job shorter than four), at most ten."""
    return int(min(600, max(job_s * 0.1, min(120, job_s / 2))))


def job_time(cluster_min: int | None, partition_default_s: int, partition_max_s: int, run_limit_min: float) -> JobTime:
    """The job's time: the run's own limit and the margin, within what the cluster gives."""
    allowed = cluster_min * 60 if cluster_min else partition_default_s or partition_max_s  # 0: no limit
    if allowed and partition_max_s:
        allowed = min(allowed, partition_max_s)
    most = max(1, allowed // 60) if allowed else None
    minutes = max(1, math.ceil((run_limit_min * 60 + margin_s(int(run_limit_min * 60))) / 60))
    while minutes * 60 - margin_s(minutes * 60) < run_limit_min * 60 and (most is None or minutes < most):
        minutes += 1  # the margin grows with the job: one more minute until the run's limit fits inside
    minutes = min(minutes, most) if most else minutes
    margin = margin_s(minutes * 60)
    return JobTime(minutes, round(min(run_limit_min, (minutes * 60 - margin) / 60), 3), max(10, margin // 2))
