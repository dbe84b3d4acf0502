"""One link on a Slurm cluster as one `sbatch` job: what the cluster records of it (`SlurmLink`), the job
script, and Slurm's commands on it. The script asks for the cluster's shape, the job's time and a SIGTERM
before its end (the loop's saver takes it: lab.kernel.checkpoint's StopGuard); it is requeueable, so a
preemption is not lost without a word, and its log is appended to, so a requeued start keeps the first's.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from lab.config import UserError
from lab.machines.lifecycle import LinkRecord
from lab.machines.remote.client import Shell, python_word
from lab.machines.slurm.cluster import Cluster
from lab.machines.slurm.query import slurm


@dataclass
class SlurmLink(LinkRecord):
    """A cluster's own record of a link (kept in `Link.detail` beside the lifecycle's `Away`)."""
    minutes: int = 0  # the job's time limit, and how long before its end Slurm signals it
    signal_s: int = 0
    remote: str | None = None  # the link's folder on the cluster
    rsync: bool = False
    job_name: str = ""
    job: str | None = None  # Slurm's job id once submitted
    restarts: int = 0  # Slurm's restarts of the job the lab has seen
    preempted: str | None = None  # when Slurm requeued the job after its session started: the lab ended the link
    pending: dict | None = None  # while it waits: {"reason", "en", "ru", "start", "never"}
    scancelled: str | None = None  # when the lab scancelled it (a cancel's grace spent, a requeue)
    state: dict | None = None  # Slurm's last word on the job (lab.machines.slurm.query.JobState)
    last: dict | None = None  # the cluster's half's last markers: {"runner", "exit", "requeued", "stop"}
    cleaned: bool = False


def shape_options(cluster: Cluster) -> list[str]:
    named = (("--partition", cluster.partition), ("--account", cluster.account), ("--gres", cluster.gres))
    return [f"--nodes={cluster.nodes}", "--ntasks-per-node=1"] + [f"{flag}={value}" for flag, value in named if value]


def job_script(cluster: Cluster, rec: SlurmLink, title: str) -> str:
    remote = rec.remote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={rec.job_name}", f"#SBATCH --output={remote}/session.log",
             "#SBATCH --open-mode=append", f"#SBATCH --chdir={remote}", f"#SBATCH --time={rec.minutes}",
             f"#SBATCH --signal=TERM@{rec.signal_s}", "#SBATCH --requeue"]
    lines += [f"#SBATCH {option}" for option in shape_options(cluster)]
    node = shlex.quote(f"{remote}/box.py")
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


def submit(login: Shell, script_path: str, where: str, then: str = "then `lab watch RUN`") -> str:
    """sbatch; the job's id. A refusal is an error with Slurm's own words, and `then` what to do."""
    proc = slurm(login, ["sbatch", "--parsable", script_path])
    job = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if proc.returncode != 0 or not job.isdigit():
        words = [line.split("error:", 1)[-1].strip() for line in proc.stderr.strip().splitlines() if line.strip()]
        raise UserError(f"{where}: Slurm refused the job: {'; '.join(words[-2:]) or f'sbatch exit {proc.returncode}'}. "
                        "Fix the cluster's --partition, --gres, --nodes or --time (`lab machines remove` and `lab "
                        f"machines add` it again), {then}",
                        ru=f"{where}: Slurm не принял задачу: {'; '.join(words[-2:])}")
    return job


def find_submitted(login: Shell, job_name: str) -> str | None:
    proc = slurm(login, ["squeue", "-h", "-t", "all", "-n", job_name, "-o", "%i"])
    ids = [line.strip() for line in proc.stdout.splitlines() if line.strip().isdigit()]
    return ids[-1] if proc.returncode == 0 and ids else None


def cancel_job(login: Shell, job: str) -> None:  # a pending one never starts
    slurm(login, ["scancel", job])
