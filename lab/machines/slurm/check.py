"""`lab machines check NAME` for a Slurm cluster: from the login node, the cluster's Python and what its
partition offers; then one short job on one node running a box's check and the probe's training burst
(lab.machines.remote.check), kept as a box's verdict is. `quick_check` is the part without a job.
"""
from __future__ import annotations

import json
import shlex
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.machines.base import env_seconds
from lab.machines.remote.check import BoxPlan, check_script, verdict
from lab.machines.remote.client import Shell, python_word
from lab.machines.remote.store import store_burst, write_check
from lab.machines.slurm.cluster import Cluster
from lab.machines.slurm.job import cancel_job, shape_options, submit
from lab.machines.slurm.query import POLL_ENV, POLL_S, job_state, partition_facts, reason_words, slurm

CHECK_WAIT_ENV = "LAB_SLURM_CHECK_WAIT_S"  # how long the check's job may wait in the queue (default 15 min)
CHECK_WAIT_S = 900.0
CHECK_MINUTES = 10  # the check job's time limit (less where the partition gives less)


def quick_check(cluster: Cluster) -> tuple[Shell, dict, dict]:
    """The login node answers with the cluster's Python, and the partition is there: (login, hello, facts)."""
    login = cluster.shell
    slurm(login, ["sbatch", "--version"])  # Slurm's commands are there (else: where to find them)
    return login, login.helper("hello", cluster.workdir, timeout_s=60), partition_facts(login, cluster.partition)


def check_cluster(name: str, say: Callable[[str], None] = print, plan: BoxPlan | None = None) -> dict:
    plan, cluster = plan or BoxPlan(), Cluster.get(name)
    started = datetime.now(timezone.utc)
    say(f"{cluster.where}: reading the partition")
    login, hello, facts = quick_check(cluster)
    say(f"{cluster.where}: {partition_line(facts)}")
    say(f"{cluster.where}: a short job with a training burst on one node")
    host, job, waited = _measured_job(cluster, login, hello["workdir"], plan, say)
    record = verdict(cluster.name, cluster.python, [host], started)
    record.update(kind="slurm", partition=facts, login=login.label, job=job, queue_wait_s=round(waited, 1))
    if host.get("missing") and not host.get("error"):
        line = f"{cluster.python} -m pip install {' '.join(host['missing'])}"
        record.update(why=f"the cluster's Python lacks {', '.join(host['missing'])} on its nodes, which the training "
                          f"notebook needs: on the login node, `{line}` (torch for the cluster's CUDA: see "
                          "pytorch.org).",
                      why_ru=f"у Python кластера на узлах нет {', '.join(host['missing'])}, а они нужны блокноту "
                             f"обучения: на узле входа `{line}` (torch под CUDA кластера: см. pytorch.org).")
    if facts["state"].upper() != "UP":
        record.update(warning=f"the partition is {facts['state'].lower()} now: jobs wait until it is up",
                      warning_ru=f"раздел сейчас {facts['state'].lower()}: задачи ждут, пока он не заработает")
    store_burst(name, host)
    write_check(name, record)
    return record


def partition_line(facts: dict) -> str:
    """"partition debug (up): 2 nodes, 8 CPUs and gpu:a100:4 each; time limit 1-00:00:00; jobs
    can be preempted (REQUEUE)"."""
    kinds = sorted({(n["cpus"], n["gres"] or "no cards") for n in facts["nodes"]}, key=str)
    each = "; ".join(f"{cpus} CPUs and {gres}" for cpus, gres in kinds) or "no node"
    days, rest = divmod(int(facts["max_time_s"]), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    limit = (f"{days}-{hms}" if days else hms) if facts["max_time_s"] else "none"
    preempt = f"jobs can be preempted ({facts['preempt_mode']})" if facts["preemptable"] else "no preemption"
    return (f"partition {facts['partition']} ({facts['state'].lower()}): {facts['total_nodes']} node(s), {each} "
            f"each; time limit {limit}; {preempt}")


def _measured_job(cluster: Cluster, login: Shell, workdir: str, plan: BoxPlan,
                  say: Callable[[str], None]) -> tuple[dict, str, float]:
    folder = f"{workdir}/check/{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    shape = [o for o in shape_options(cluster) if not o.startswith("--nodes")] + ["--nodes=1"]
    script = "\n".join(["#!/bin/bash", f"#SBATCH --job-name=lab-check-{cluster.name}",
                        f"#SBATCH --output={folder}/check.log", f"#SBATCH --chdir={folder}",
                        f"#SBATCH --time={min(CHECK_MINUTES, cluster.time_min or CHECK_MINUTES)}",
                        *[f"#SBATCH {o}" for o in shape],
                        "# The lab kit's check: the node's Python, torch, cards, and a short training burst.",
                        f"exec {python_word(cluster.python)} {shlex.quote(folder + '/check.py')} "
                        f"\"$(cat {shlex.quote(folder + '/args.json')})\"", ""])
    login.run(["mkdir", "-p", folder])
    with tempfile.TemporaryDirectory(prefix="lab-slurm-check-") as tmp:
        for name, text in {"check.py": check_script(), "args.json": plan.args(folder, True), "job.sh": script}.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        login.copy_up(Path(tmp), folder, False, {})
    job = submit(login, f"{folder}/job.sh", cluster.where, then="then check it again")
    waited = _wait(cluster, login, job, say)
    text = login.read(f"{folder}/check.log")
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    try:
        facts = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
        raise UserError(f"{cluster.where}: the check's job {job} did not finish: {tail} (its log: {folder}/check.log "
                        "on the cluster)") from None
    login.remove(folder, f"{workdir}/check")  # (and check/ itself, once empty)
    return {"host": facts.get("hostname") or "node", **facts}, job, waited


def _wait(cluster: Cluster, login: Shell, job: str, say: Callable[[str], None]) -> float:
    """Waits for the check's job to end, saying why it waits (scancelled after CHECK_WAIT_S); its queue wait."""
    poll, patience = env_seconds(POLL_ENV, POLL_S), env_seconds(CHECK_WAIT_ENV, CHECK_WAIT_S)
    began, said, ran = time.monotonic(), None, None
    while True:
        state = job_state(login, job)
        if state is None or state.ended:
            return (ran or time.monotonic()) - began
        if state.pending:
            en, _, never = reason_words(state.reason)
            if en != said:
                say(f"{cluster.where}: the check's job {job} waits in the queue: {en}")
                said = en
            if never or time.monotonic() - began > patience:
                cancel_job(login, job)
                raise UserError(f"{cluster.where}: the check's job {job} " + (
                    f"can never start: {en}" if never else f"waited {patience / 60:.0f} min in the queue ({en})")
                    + "; it was scancelled. `lab machines check " + cluster.name + "` again later")
        elif ran is None:
            ran = time.monotonic()
        time.sleep(poll)
