"""What the lab's own machine has, and a measured speed: the check a box and a Slurm cluster both run on their
hosts with their own Python (lab.trial.box_session), then the probe's short burst under torchrun. The verdict
says whether the machine can run the lab's sessions, and why not with the line that fixes it.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from datetime import datetime

from lab.config import card_set
from lab.machines.remote.client import NOT_FOUND, Shell, last_line
from lab.machines.remote.store import ROOM_GB
from lab.trial.sources import CPU_SIZE, GPU_SIZE, HERE, session_source, worker_source

MIN_FREE_GB = 5.0  # less than this in the workdir: a warning (the data and a few checkpoints go there)


@dataclass(frozen=True)
class BoxPlan:
    """The burst (the calculator counts a speed after its warm-up) and how long it may take."""
    steps: int = 30
    timeout_s: float = 420.0
    gpu_size: dict = field(default_factory=lambda: dict(GPU_SIZE))
    cpu_size: dict = field(default_factory=lambda: dict(CPU_SIZE))

    def args(self, workdir: str, burst: bool) -> str:  # the check's one argument on a host (lab.trial.box_session)
        return json.dumps({**asdict(self), "workdir": workdir, "burst": burst, "min_free_gb": ROOM_GB})


def check_script() -> str:
    box_half = (HERE / "box_session.py").read_text(encoding="utf-8").replace("from __future__ import annotations\n", "")
    return "\n\n".join([session_source(), f"WORKER_SOURCE = {worker_source()!r}\n", box_half])


def check_host(shell: Shell, workdir: str, plan: BoxPlan, burst: bool) -> dict:
    """One host's facts (an error the check met there among them); an unreachable host, or no Python, raises."""
    proc = shell.run([shell.python, "-", plan.args(workdir, burst)], stdin=check_script(),
                     timeout_s=plan.timeout_s + 120)
    if proc.returncode in (126, NOT_FOUND):
        shell.answer(proc, "the check")  # raises: no Python there
    try:
        return {"host": shell.label, **json.loads(last_line(proc.stdout))}
    except ValueError:  # no answer ("") too
        why = last_line(proc.stderr) or f"exit {proc.returncode}"
        return {"host": shell.label, "error": f"the check did not finish on {shell.label}: {why}"}


def verdict(name: str, python: str, hosts: list[dict], started: datetime) -> dict:
    """Whether the machine can run the lab's sessions, and why not (with what to do)."""
    cards = [{"host": h["host"], "name": g["name"], "memory_gb": g["memory_gb"], "capability": g["capability"]}
             for h in hosts for g in h.get("gpus") or []]
    counted: dict[tuple, dict] = {}  # each host's cards of one kind as one entry with its count
    for c in cards:
        counted.setdefault((c["host"], c["name"], c["memory_gb"], c["capability"]), {**c, "count": 0})["count"] += 1
    record = {"format": 1, "machine": name, "at": started.isoformat(timespec="seconds"), "can_run": True,
              "why": None, "why_ru": None, "hosts": [{k: v for k, v in h.items() if k != "metrics"} for h in hosts],
              "cards": list(counted.values()), "gpu": card_set(cards[0]["name"], len(cards)) if cards else "cpu",
              "tok_s": ((hosts[0].get("worker") or {}).get("burst") or {}).get("tok_s")}
    problems = [p for h in hosts for p in _problems(python, h)]
    if problems:
        record.update(can_run=False, why=" ".join(en for en, _ in problems), why_ru=" ".join(ru for _, ru in problems))
    low = [h["host"] for h in hosts if h.get("free_gb") is not None and h["free_gb"] < MIN_FREE_GB]
    if low:
        record.update(warning=f"little free disk in the workdir on {', '.join(low)} (under {MIN_FREE_GB:g} GB)",
                      warning_ru=f"мало места в рабочей папке на {', '.join(low)} (меньше {MIN_FREE_GB:g} ГБ)")
    return record


def _problems(python: str, h: dict) -> list[tuple[str, str]]:
    host = h["host"]
    if h.get("error"):
        return [(f"{h['error']}.", f"{h['error']}.")]
    if not h.get("python_ok", True):
        return [(f"{host} has Python {h['python']}; the kit needs 3.10 or newer: give another with --python PATH.",
                 f"на {host} Python {h['python']}; нужен 3.10 или новее: укажите другой через --python ПУТЬ.")]
    if h.get("workdir_error"):
        return [(f"{host} cannot make the workdir {h['workdir']} ({h['workdir_error']}): give another with --workdir.",
                 f"на {host} не создать рабочую папку {h['workdir']} ({h['workdir_error']}): укажите другую "
                 "через --workdir.")]
    if h.get("disk_full"):
        return [(f"{host} has {h['free_gb'] * 1000:.1f} MB free in {h['workdir']}, too little for a run's data and "
                 f"checkpoints: free some space there, or give the machine another --workdir.",
                 f"на {host} свободно {h['free_gb'] * 1000:.1f} МБ в {h['workdir']}, слишком мало для данных и "
                 "чекпоинтов прогона: освободите место или укажите машине другую --workdir.")]
    if h.get("missing"):
        line = f"ssh {host} {shlex.quote(python)} -m pip install {' '.join(h['missing'])}"
        return [(f"{host} lacks {', '.join(h['missing'])}, which the training notebook needs: install them with "
                 f"`{line}` (torch for the box's CUDA: see pytorch.org).",
                 f"на {host} нет {', '.join(h['missing'])}, а они нужны блокноту обучения: установите их командой "
                 f"`{line}` (torch под CUDA этой машины: см. pytorch.org).")]
    worker = h.get("worker") or {}
    if worker.get("error"):
        return [(f"the cards' check failed on {host}: {worker['error']}.",
                 f"проверка карт на {host} не прошла: {worker['error']}.")]
    if worker and not (worker.get("all_reduce") or {}).get("ok"):
        return [(f"the all-reduce across the cards of {host} gave a wrong result.",
                 f"all-reduce между картами {host} дал неверный результат.")]
    return []
