"""`lab machines check NAME`: what one of the lab's SSH machines has, and a measured speed.

Over the person's own ssh (lab.machines.ssh.client), each host of the machine runs the check's
box half (lab.trial.box_session, after the probe session's functions, lab.trial.session) with the
box's own Python: the Python, torch, CUDA and the cards (name, memory, compute capability), free
disk in the workdir, and which of what the training notebook needs is missing, with the exact
line that installs it. On the first host, the probe's worker (lab.trial.worker, the same as on
Kaggle) then runs a short burst under torchrun: at the reference size on GPUs, tiny on a CPU.

The verdict is kept in `$LAB_HOME/machines/<name>/check.json`, the burst as a run folder in
`check/` beside it (lab.kaggle.probed.store_measurement), which the calculator reads as a
measured speed on that machine's cards. `lab machines` shows it with its age; Auto skips a
machine whose check says it cannot run. It runs on `lab machines add` and on a machine's first
use, and again whenever asked.
"""
from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from lab.config import UserError, card_set
from lab.machines.ssh.boxes import ROOM_GB, Box, burst_folder, get_box, write_check
from lab.machines.ssh.client import remote_python
from lab.kaggle.probed import store_measurement
from lab.trial.sources import CPU_SIZE, GPU_SIZE, HERE, session_source, worker_source

MIN_FREE_GB = 5.0  # less than this in the workdir: a warning (the data and a few checkpoints go there)


@dataclass(frozen=True)
class BoxPlan:
    """The burst (the calculator counts a speed after its warm-up) and how long it may take."""
    steps: int = 30
    timeout_s: float = 420.0
    gpu_size: dict = field(default_factory=lambda: dict(GPU_SIZE))
    cpu_size: dict = field(default_factory=lambda: dict(CPU_SIZE))


def check_script() -> str:
    """The box's half: the probe session's functions, the worker's source, then the check."""
    box_half = (HERE / "box_session.py").read_text(encoding="utf-8")
    box_half = box_half.replace("from __future__ import annotations\n", "")
    return "\n\n".join([session_source(), f"WORKER_SOURCE = {worker_source()!r}\n", box_half])


def check_machine(name: str, say: Callable[[str], None] = print, plan: BoxPlan | None = None) -> dict:
    """Checks every host of the machine, stores and returns the verdict. A host that cannot be
    reached (or has no Python at the given path) raises, and nothing is stored."""
    plan = plan or BoxPlan()
    box = get_box(name)
    started = datetime.now(timezone.utc)
    script, hosts = check_script(), []
    for i, address in enumerate(box.hosts):
        say(f"{box.where}: checking {address.host}" + (" (with a short training burst)" if i == 0 else ""))
        hosts.append(_check_host(box, i, script, plan))
    record = verdict(box, hosts, started)
    _store_burst(box, hosts[0], record)
    write_check(name, record)
    return record


def _check_host(box: Box, i: int, script: str, plan: BoxPlan) -> dict:
    address = box.hosts[i]
    args = json.dumps({"workdir": box.workdir, "gpu_size": plan.gpu_size, "cpu_size": plan.cpu_size,
                       "steps": plan.steps, "timeout_s": plan.timeout_s, "burst": i == 0, "min_free_gb": ROOM_GB})
    proc = remote_python(address, box.python, script, [args], timeout_s=plan.timeout_s + 120)
    if proc.returncode in (126, 127):
        raise UserError(f"{box.where}: there is no Python at {box.python} on {address.host}: give the box's Python "
                        f"with --python PATH (`ssh {address.host} which python3` finds one)")
    lines = proc.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1])
    except (IndexError, ValueError):
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"host": address.host, "error": f"the check did not finish on {address.host}: {why}"}
    return {"host": address.host, **facts}


def verdict(box: Box, hosts: list[dict], started: datetime) -> dict:
    """Whether the machine can run the lab's sessions, and why not (with what to do)."""
    record = {"format": 1, "machine": box.name, "at": started.isoformat(timespec="seconds"), "can_run": True,
              "why": None, "why_ru": None, "hosts": [{k: v for k, v in h.items() if k != "metrics"} for h in hosts]}
    cards = [{"host": h["host"], "name": g["name"], "memory_gb": g["memory_gb"], "capability": g["capability"]}
             for h in hosts for g in h.get("gpus") or []]
    record["cards"] = _counted(cards)
    record["gpu"] = card_set(cards[0]["name"], len(cards)) if cards else "cpu"
    burst = ((hosts[0].get("worker") or {}).get("burst")) or {}
    record["tok_s"] = burst.get("tok_s")
    problems = [p for h in hosts for p in _problems(box, h)]
    if problems:
        record.update(can_run=False, why=" ".join(en for en, _ in problems), why_ru=" ".join(ru for _, ru in problems))
    low = [h["host"] for h in hosts if h.get("free_gb") is not None and h["free_gb"] < MIN_FREE_GB]
    if low:
        record.update(warning=f"little free disk in the workdir on {', '.join(low)} (under {MIN_FREE_GB:g} GB)",
                      warning_ru=f"мало места в рабочей папке на {', '.join(low)} (меньше {MIN_FREE_GB:g} ГБ)")
    return record


def _counted(cards: list[dict]) -> list[dict]:
    """Each host's cards of one kind as one entry with its count."""
    out: dict[tuple, dict] = {}
    for c in cards:
        key = (c["host"], c["name"], c["memory_gb"], c["capability"])
        out.setdefault(key, {**c, "count": 0})["count"] += 1
    return list(out.values())


def _problems(box: Box, h: dict) -> list[tuple[str, str]]:
    """What keeps one host from running the lab's sessions, each with what to do (EN, RU)."""
    host, python = h["host"], box.python
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


def _store_burst(box: Box, first: dict, record: dict) -> None:
    """The first host's burst as a run folder the calculator reads, on the machine's cards."""
    if not first.get("metrics") or not (first.get("worker") or {}).get("burst"):
        return
    with tempfile.TemporaryDirectory(prefix="lab-check-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        metrics.write_text(first["metrics"], encoding="utf-8")
        gpu = card_set(first["gpus"][0]["name"], len(first["gpus"])) if first.get("gpus") else "cpu"
        store_measurement(burst_folder(box.name), metrics, first, gpu)
