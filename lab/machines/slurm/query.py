"""What Slurm says, read from its own commands on the login node: a job (`scontrol show job` while Slurm
holds it, else `sacct`), a partition, when Slurm would start a job, why one waits. A cluster without
accounting (no slurmdbd: `sacct` says "accounting storage is disabled") keeps a finished job in `scontrol`
only for its MinJobAge (300 s by default); after that the job's own files say how it ended.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from lab.config import UserError
from lab.machines.remote.client import NOT_FOUND, Shell, last_line
from lab.machines.slurm.cluster import parse_time

POLL_ENV = "LAB_SLURM_POLL_S"  # how often the lab asks Slurm about a job (the person's setting)
POLL_S = 15.0
ENDED = {"COMPLETED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "CANCELLED", "OUT_OF_MEMORY", "FAILED", "BOOT_FAIL",
         "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}  # requeued, on its way back into the queue
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it; `start` (UTC): when it started, or when Slurm expects it to."""
    job: str
    state: str  # PENDING, RUNNING, COMPLETED, TIMEOUT, PREEMPTED, NODE_FAIL, CANCELLED, OUT_OF_MEMORY, FAILED, ...
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0
    start: str | None = None
    end: str | None = None
    nodes: str = ""
    source: str = "scontrol"  # or "sacct"

    @property
    def ended(self) -> bool:
        return self.state in ENDED  # PREEMPTED too: a job preempted and cancelled; a requeued one is pending again

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUE_HOLD", "REQUEUE_FED")


def slurm(login: Shell, argv: list[str], timeout_s: float = 60.0):
    proc = login.run(argv, timeout_s=timeout_s)
    if proc.returncode == NOT_FOUND and ("not found" in proc.stderr or not proc.stderr.strip()):
        where = "this computer" if login.address is None else f"the login node {login.address.host}"
        hint = ("is this the cluster's login node? Install Slurm's client commands here (Debian: apt install "
                "slurm-client), or add the cluster with --slurm [USER@]LOGIN_HOST") if login.address is None else (
                f"does `ssh {login.address.host} {argv[0]} --version` work? Slurm's commands must be on the PATH "
                "of a non-interactive ssh session there")
        raise UserError(f"there is no `{argv[0]}` on {where}: {hint}")
    return proc


def scontrol_fields(line: str) -> dict[str, str]:
    """`Key=Value Key=Value ...` of one `scontrol show ... -o` line (a value may hold spaces)."""
    marks = list(_KEY.finditer(line))
    return {m.group(1): line[m.end():marks[i + 1].start()].strip() if i + 1 < len(marks) else line[m.end():].strip()
            for i, m in enumerate(marks)}


def _utc(text: str | None, offset: timedelta) -> str | None:
    try:
        local = datetime.fromisoformat(text or "")
    except ValueError:  # "Unknown", "None", "N/A"
        return None
    return (local - offset).replace(tzinfo=timezone.utc).isoformat(timespec="seconds")


_OFFSETS: dict[str, tuple[float, timedelta]] = {}  # login -> (when asked, its UTC offset): asked once an hour
OFFSET_TTL_S = 3600.0


def cluster_offset(login: Shell) -> timedelta:
    known = _OFFSETS.get(login.label)
    if known and time.monotonic() - known[0] < OFFSET_TTL_S:
        return known[1]
    out = login.run(["date", "+%z"], timeout_s=30).stdout.strip()
    offset = timedelta(0)
    if re.fullmatch(r"[+-]\d{4}", out):
        offset = (-1 if out[0] == "-" else 1) * timedelta(hours=int(out[1:3]), minutes=int(out[3:5]))
    _OFFSETS[login.label] = (time.monotonic(), offset)
    return offset


class SlurmUnreachable(UserError):
    """Slurm's controller did not answer (it restarts, the network is down): the job is not gone."""


def _from_scontrol(login: Shell, job: str, offset: timedelta) -> JobState | None:
    proc = slurm(login, ["scontrol", "show", "job", "-o", job])
    return from_scontrol(job, {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}, offset)


def from_scontrol(job: str, said: dict, offset: timedelta) -> JobState | None:
    """The job in `scontrol show job -o JOB`'s answer ({"rc", "out", "err"}); None once purged (MinJobAge)."""
    if said.get("rc") != 0:
        if "Invalid job id" in (said.get("err") or ""):
            return None
        raise SlurmUnreachable(f"Slurm's controller did not answer for job {job}: "
                               f"{(said.get('err') or '').strip() or 'scontrol exit ' + str(said.get('rc'))}")
    text = said.get("out") or ""
    line = next((x for x in text.splitlines() if x.startswith(f"JobId={job} ") or x == f"JobId={job}"), None)
    if line is None:
        return None
    f = scontrol_fields(line)
    return JobState(job, f.get("JobState", "UNKNOWN"), "" if f.get("Reason") == "None" else f.get("Reason", ""),
                    f.get("ExitCode", ""), int(f.get("Restarts") or 0), _utc(f.get("StartTime"), offset),
                    _utc(f.get("EndTime"), offset), f.get("NodeList", "") if f.get("NodeList") != "(null)" else "")


_NO_ACCOUNTING: dict[str, float] = {}  # login -> when its sacct said the cluster keeps no accounting


def _from_sacct(login: Shell, job: str, offset: timedelta) -> JobState | None:
    if time.monotonic() - _NO_ACCOUNTING.get(login.label, -OFFSET_TTL_S) < OFFSET_TTL_S:
        return None
    proc = slurm(login, ["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Reason,Start,End,NodeList"])
    if "accounting storage is disabled" in proc.stdout + proc.stderr:
        _NO_ACCOUNTING[login.label] = time.monotonic()
    rows = [line.split("|") for line in proc.stdout.splitlines()] if proc.returncode == 0 else []
    parts = next((p for p in rows if len(p) >= 7 and p[0] == job), None)
    if parts is None:
        return None
    state = parts[1].split()[0] if parts[1] else "UNKNOWN"  # "CANCELLED by 1000"
    return JobState(job, state, "" if parts[3] == "None" else parts[3], parts[2], 0, _utc(parts[4], offset),
                    _utc(parts[5], offset), parts[6] if parts[6] != "None assigned" else "", "sacct")


def job_state(login: Shell, job: str, scontrol: dict | None = None) -> JobState | None:
    """The job now, as the controller holds it, else its accounting record; `scontrol`: its answer read already."""
    offset = cluster_offset(login)
    live = _from_scontrol(login, job, offset) if scontrol is None else from_scontrol(job, scontrol, offset)
    return live or _from_sacct(login, job, offset)


def final_state(login: Shell, job: str, live: JobState) -> JobState:
    """How the job ended: its accounting record, else `live` (the controller's word that it ended, read already)."""
    kept = _from_sacct(login, job, cluster_offset(login))
    return replace(kept, restarts=live.restarts) if kept is not None and kept.state in ENDED else live


def partition_facts(login: Shell, partition: str | None) -> dict:
    """What the partition offers: its state, nodes (CPUs, memory, cards), its default and maximum time, and
    whether a job there can be preempted. No such partition is an error that names the cluster's."""
    proc = slurm(login, ["scontrol", "show", "partition", "-o", *([partition] if partition else [])])
    if proc.returncode != 0 and "not found" not in proc.stdout + proc.stderr:
        said = last_line(proc.stderr) or f"scontrol exit {proc.returncode}"
        raise UserError(f"Slurm's commands on {login.label} reach no controller ({said}): is this the cluster's "
                        "login node, with its slurm.conf (or SLURM_CONF) in place?")
    found = [scontrol_fields(line) for line in proc.stdout.splitlines() if line.startswith("PartitionName=")]
    chosen = next((f for f in found if partition is None and f.get("Default") == "YES"
                   or f.get("PartitionName") == partition), None)
    if proc.returncode != 0 or chosen is None:
        listed = slurm(login, ["sinfo", "-h", "-o", "%R"]).stdout.split()
        known = ", ".join(sorted({p.strip() for p in listed if p.strip()})) or "none"
        what = f"no partition '{partition}'" if partition else "no default partition"
        raise UserError(f"Slurm on {login.label} has {what} (its partitions: {known}): give one of them with "
                        "--partition", ru=f"в Slurm на {login.label} нет раздела «{partition}» (есть: {known})")
    name = chosen["PartitionName"]
    sinfo = slurm(login, ["sinfo", "-h", "-N", "-p", name, "-o", "%N|%c|%m|%G|%T"]).stdout
    rows = [line.strip().split("|") for line in sinfo.splitlines()]
    nodes = [{"node": p[0], "cpus": int(p[1]) if p[1].isdigit() else None,
              "memory_mb": int(p[2]) if p[2].isdigit() else None, "gres": "" if p[3] == "(null)" else p[3],
              "state": p[4]} for p in rows if len(p) == 5]
    config = slurm(login, ["scontrol", "show", "config"]).stdout
    preempt_type = next((line.split("=", 1)[1].strip() for line in config.splitlines()
                         if line.split("=")[0].strip() == "PreemptType"), "preempt/none")
    mode = chosen.get("PreemptMode", "OFF")
    return {"partition": name, "state": chosen.get("State", "?"), "nodes": nodes,
            "total_nodes": int(chosen.get("TotalNodes") or len(nodes)),
            "max_time_s": parse_time(chosen.get("MaxTime", "")),
            "default_time_s": parse_time(chosen.get("DefaultTime", "")), "preempt_mode": mode,
            "preemptable": preempt_type != "preempt/none" and mode.upper() not in ("OFF", ""),
            "preempt_type": preempt_type, "tres": chosen.get("TRES", "")}


def expected_start(login: Shell, shape: list[str]) -> tuple[str | None, str | None]:
    """(when Slurm would start a job of `shape` if it were sent now, in UTC, or None; Slurm's refusal)."""
    proc = slurm(login, ["sbatch", "--test-only", *shape, "--wrap", "true"])
    text = proc.stdout + proc.stderr
    found = re.search(r"to start at (\S+)", text)
    if proc.returncode != 0 or not found:
        lines = [line.split("error:", 1)[-1].strip() for line in text.strip().splitlines() if line.strip()]
        return None, (lines[-1] if lines else f"sbatch --test-only exit {proc.returncode}")
    return _utc(found.group(1), cluster_offset(login)), None


# Slurm's reasons for a pending job, in words: (English, Russian). The last group never start.
_REASONS = {
    "Priority": ("jobs of higher priority are ahead of it", "впереди задачи с большим приоритетом"),
    "Resources": ("it waits for the nodes and cards it asks for to be free",
                  "ждёт, пока освободятся нужные ей узлы и карты"),
    "QOSMaxGRESPerUser": ("your QOS's limit on cards per user is reached: your other jobs hold them",
                          "достигнут предел карт на пользователя в вашем QOS: их держат другие ваши задачи"),
    "QOSMaxJobsPerUserLimit": ("your QOS's limit on running jobs is reached", "достигнут предел задач в вашем QOS"),
    "AssocGrpGRES": ("your account's limit on cards is reached", "достигнут предел карт вашего счёта"),
    "AssocMaxJobsLimit": ("your account's limit on running jobs is reached", "достигнут предел задач вашего счёта"),
    "JobHeldUser": ("it is held (`scontrol release JOB` lets it go)",
                    "она задержана (`scontrol release JOB` отпустит)"),
    "JobHeldAdmin": ("the cluster's admins hold it", "её держат администраторы кластера"),
    "BeginTime": ("it may not start before its begin time", "ей нельзя начать раньше её времени начала"),
    "Dependency": ("it waits for another job", "она ждёт другую задачу"),
    "PartitionDown": ("its partition is down", "её раздел выключен"),
    "PartitionInactive": ("its partition is inactive", "её раздел неактивен"),
    "ReqNodeNotAvail": ("the nodes it needs are not available (down, drained or reserved)",
                        "нужные ей узлы недоступны (выключены, выведены или зарезервированы)"),
    "Reservation": ("it waits for its reservation", "она ждёт своего резервирования"),
    "PartitionTimeLimit": ("its time limit is above the partition's", "её лимит времени больше, чем у раздела"),
    "PartitionNodeLimit": ("it asks for more nodes than the partition gives", "она просит больше узлов, чем у раздела"),
    "InvalidAccount": ("the Slurm account is not valid", "счёт Slurm недействителен"),
    "InvalidQOS": ("the QOS is not valid", "QOS недействителен"),
    "AccountNotAllowed": ("the account may not use this partition", "этому счёту нельзя в этот раздел"),
    "BadConstraints": ("no node meets what it asks for", "ни один узел не подходит под её запрос"),
    "DependencyNeverSatisfied": ("the job it waits for will never end as it needs", "нужная ей задача так и не"
                                                                                     " завершится как надо"),
}
NEVER = {"PartitionTimeLimit", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "AccountNotAllowed",
         "BadConstraints", "DependencyNeverSatisfied"}


def reason_words(reason: str) -> tuple[str, str, bool]:
    """(English, Russian, never): a pending job's reason in words, and whether it can never start as it is."""
    code = reason.split(",")[0].strip()
    en, ru = _REASONS.get(code, (f"Slurm says {code or 'nothing'}", f"Slurm говорит {code or 'ничего'}"))
    return f"{en} ({code})" if code in _REASONS else en, f"{ru} ({code})" if code in _REASONS else ru, code in NEVER
