"""One link on a Slurm cluster as one `sbatch` job: what the link records (`SlurmLink`, kept in
`Link.detail` and read by this package alone), the job script, and Slurm's commands on it.

The job script asks for the cluster's shape (partition, account, nodes, `--gres`), the job's
time (lab.machines.slurm.cluster.job_time) and a signal before its end (`--signal=TERM@S`:
SIGTERM is one of the two signals the training loop's saver takes, lab.kernel.checkpoint's
StopGuard); it is requeueable, so a preemption requeues it rather than losing it without a word,
and its log is appended to, so a requeued start does not wipe the first one's lines. It runs the
cluster's half (lab.machines.slurm.node) as one task per node under `srun`.
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields

from lab.config import UserError
from lab.machines.slurm.cluster import Cluster
from lab.machines.slurm.login import Login
from lab.machines.ssh.client import python_word
from lab.runs import Link, Run, load_run, updating

PHASES = ("planned", "staged", "submitting", "submitted", "ended", "collected", "merged")
BEFORE_SUBMIT = ("planned", "staged", "submitting")


@dataclass
class SlurmLink:
    """What a link on a cluster holds, phase by phase (each written before and after its side
    effect, so the control side may die anywhere and `lab watch RUN` picks up where it stopped)."""
    folder: str  # the link's folder in the run folder here: links/NNN-NAME
    why: str = ""
    source: dict | None = None  # the checkpoint it goes on from ({"name", "step", "sha256", "path"})
    phase: str = "planned"
    minutes: int = 0  # the job's time limit, and how long before its end Slurm signals it
    signal_s: int = 0
    remote: str | None = None  # the link's folder on the cluster, and the data there
    data: str | None = None
    rsync: bool = False
    job_name: str = ""
    job: str | None = None  # Slurm's job id once submitted
    restarts: int = 0  # Slurm's restarts of the job the lab has seen
    preempted: bool = False  # Slurm requeued the job after its session started: the lab ended the link
    pending: dict | None = None  # while it waits: {"reason", "en", "ru", "start"}
    stop_sent: str | None = None  # when the lab asked the job to save and stop (a cancel), and scancelled it
    scancelled: str | None = None
    state: dict | None = None  # Slurm's last word on the job (lab.machines.slurm.query.JobState)
    last: dict | None = None  # the cluster's half's last word: {"runner", "exit", "requeued", "stop"}
    output: dict | None = None  # what came back (lab.machines.kaggle.outputs.check_output)
    cleaned: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SlurmLink":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def record(run_id: str, n: int) -> tuple[Run, Link, SlurmLink]:
    run = load_run(run_id)
    link = run.links[n - 1]
    return run, link, SlurmLink.from_dict(link.detail)


def note(run_id: str, n: int, *, status: str | None = None, **changes) -> SlurmLink:
    """Records `changes` to the link's record (and its status) in one locked write."""
    unknown = set(changes) - {f.name for f in fields(SlurmLink)}
    if unknown:
        raise TypeError(f"not in a Slurm link's record: {sorted(unknown)}")
    with updating(run_id) as run:
        link = run.links[n - 1]
        rec = SlurmLink.from_dict(link.detail)
        for key, value in changes.items():
            setattr(rec, key, value)
        link.detail = rec.to_dict()
        if status is not None:
            link.status = status
    return rec


def shape_options(cluster: Cluster) -> list[str]:
    """sbatch's options for the cluster's shape: partition, account, nodes, cards."""
    out = [f"--nodes={cluster.nodes}", "--ntasks-per-node=1"]
    for flag, value in (("--partition", cluster.partition), ("--account", cluster.account),
                        ("--gres", cluster.gres)):
        if value:
            out.append(f"{flag}={value}")
    return out


def job_script(cluster: Cluster, rec: SlurmLink, title: str) -> str:
    """The batch script of the link's job (kept in its folder on the cluster)."""
    remote = rec.remote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={rec.job_name}", f"#SBATCH --output={remote}/session.log",
             "#SBATCH --open-mode=append", f"#SBATCH --chdir={remote}", f"#SBATCH --time={rec.minutes}",
             f"#SBATCH --signal=TERM@{rec.signal_s}", "#SBATCH --requeue"]
    lines += [f"#SBATCH {option}" for option in shape_options(cluster)]
    node = shlex.quote(f"{remote}/node.py")
    python = python_word(cluster.python)  # `~/` is the home on the cluster
    gres = f" --gres={cluster.gres}" if cluster.gres else ""  # the cards of each node, for the step as for the job
    lines += [f"# {title}: the lab kit's job. papermill runs the training notebook on each node, one task per",
              "# node under srun; torchrun in it starts one process per card, the nodes meeting at the first.",
              'echo "lab: job $SLURM_JOB_ID (start ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST at '
              '$(date -u +%FT%TZ)"',
              "export PYTHONUNBUFFERED=1",
              # srun's steps no longer inherit the job's CPUs per task (Slurm 22.05): say them.
              f'exec srun --ntasks-per-node=1 --cpus-per-task="${{SLURM_CPUS_ON_NODE:-1}}"{gres} --kill-on-bad-exit=1 '
              f"{python} {node} job {shlex.quote(remote)}"]
    return "\n".join(lines) + "\n"


def submit(login: Login, script_path: str, where: str, then: str = "then `lab watch RUN`") -> str:
    """sbatch; the job's id. A refusal (a partition that does not exist, cards the nodes do not
    have, a time above the partition's) is an error with Slurm's own words, and `then` what to do."""
    proc = login.slurm(["sbatch", "--parsable", script_path])
    job = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if proc.returncode != 0 or not job.isdigit():
        words = [line.split("error:", 1)[-1].strip() for line in proc.stderr.strip().splitlines() if line.strip()]
        raise UserError(f"{where}: Slurm refused the job: {'; '.join(words[-2:]) or f'sbatch exit {proc.returncode}'}. "
                        "Fix the cluster's --partition, --gres, --nodes or --time (`lab machines remove` and `lab "
                        f"machines add` it again), {then}",
                        ru=f"{where}: Slurm не принял задачу: {'; '.join(words[-2:])}")
    return job


def find_submitted(login: Login, job_name: str) -> str | None:
    """The job of that name Slurm holds (a submission whose answer the control side did not
    record), if any."""
    proc = login.slurm(["squeue", "-h", "-t", "all", "-n", job_name, "-o", "%i"])
    ids = [line.strip() for line in proc.stdout.splitlines() if line.strip().isdigit()]
    return ids[-1] if proc.returncode == 0 and ids else None


def cancel_job(login: Login, job: str) -> None:
    """scancel: Slurm ends the job (a pending one never starts)."""
    login.slurm(["scancel", job])
