"""What `lab probe ACCOUNT` found, as stored per account: read by `lab accounts`, the machines
panel, the Auto rule's machine states and the calculator. Stdlib only, no call to Kaggle.

`$LAB_HOME/accounts/<name>/probe.json` holds the verdict and the facts; `probe/` beside it the
short training burst as a run folder (config.json, device.json, metrics.jsonl), which the
calculator reads as it reads the lab's runs: a measured speed on that account's cards.
"""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from lab.home import accounts_dir

PROBE_FILE = "probe.json"
MEASURED_FOLDER = "probe"


def probe_path(account: str) -> Path:
    return accounts_dir() / account / PROBE_FILE


def read_probe(account: str) -> dict | None:
    """The account's last probe, or None when it was never probed (or the file is damaged)."""
    try:
        record = json.loads(probe_path(account).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def store_probe(account: str, record: dict) -> Path:
    """Writes the account's probe record whole or not at all (no secret inside)."""
    path = probe_path(account)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def mark_cannot_run(account: str, why: str, why_ru: str, seen_in: str) -> dict:
    """Records that the account cannot run the lab's GPU sessions, as a failed probe would: a
    session of a run (`seen_in`) came without its cards. What the last probe measured stays in
    the record; `lab probe NAME` after the fix writes a new verdict."""
    before = read_probe(account) or {}
    record = {**before, "format": 1, "account": account, "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "status": "no-gpu", "can_run": False, "why": why, "why_ru": why_ru, "seen_in": seen_in}
    store_probe(account, record)
    return record


def nccl_setting(record: dict | None) -> dict:
    """The NCCL environment the account's probe found the all-reduce working with ({} when it
    needed none, or the account was never probed): the runs there push with it."""
    found = (record or {}).get("nccl_env")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def cannot_run(record: dict | None) -> str | None:
    """Why the probe says the account cannot run the lab's sessions, or None (it can, or it was
    never probed: an unprobed account is tried as before)."""
    if not record or record.get("can_run", True) is not False:
        return None
    name, at = record.get("account", "NAME"), str(record.get("at", "?"))[:16].replace("T", " ")
    if record.get("seen_in"):  # a run's session found it (lab.kaggle.probed.mark_cannot_run)
        return f"{record['seen_in']} ({at} UTC) found it cannot run GPU sessions: {str(record.get('why')).rstrip('. ')}."
    return (f"the probe of {at} UTC says it cannot run: "
            f"{str(record.get('why')).rstrip('. ')}. Once that is fixed, `lab probe {name}` again.")


def age(record: dict, now: datetime | None = None, ru: bool = False) -> str:
    """How long ago the probe ran, in words a table fits ("3 h", "12 d"; in Russian "3 ч")."""
    try:
        then = datetime.fromisoformat(record["at"])
    except (KeyError, TypeError, ValueError):
        return "?"
    s = max(0.0, ((now or datetime.now(timezone.utc)) - then).total_seconds())
    minutes, hours, days = ("мин", "ч", "д") if ru else ("min", "h", "d")
    if s < 3600:
        return f"{s / 60:.0f} {minutes}"
    return f"{s / 3600:.0f} {hours}" if s < 86400 else f"{s / 86400:.0f} {days}"


def summary(record: dict | None, ru: bool = False) -> str:
    """One line: the verdict and the main figures."""
    if record is None:
        return "не проверен (lab probe ИМЯ)" if ru else "not probed (lab probe NAME)"
    if record.get("can_run", True) is None:
        return ("проба не удалась: " + str(record.get("why_ru") or record.get("why"))) if ru else \
            "the probe failed: " + str(record.get("why"))
    if not record.get("can_run", True):
        return ("не может: " + str(record.get("why_ru") or record.get("why"))) if ru else \
            "cannot run: " + str(record.get("why"))
    parts = [str(record.get("gpu") or "?")]
    if record.get("tok_s"):
        speed = f"{record['tok_s']:,.0f}"  # grouped as the calculator groups: "31 802" in Russian
        parts.append(f"{speed.replace(',', ' ')} ток/с" if ru else f"{speed} tok/s")
    reduce = record.get("all_reduce")
    if reduce:
        parts.append(("all-reduce ок" if ru else "all-reduce ok") if reduce.get("ok") else "all-reduce ✖")
    log = record.get("log_while_running")
    if log is not None:
        parts.append(("журнал виден сразу" if ru else "live log") if log else
                     ("журнал только в конце" if ru else "log only at the end"))
    if record.get("warning"):
        parts.append("внимание: " + str(record.get("warning_ru") or record["warning"]) if ru else
                     "warning: " + str(record["warning"]))
    return ", ".join(parts)


def store_measurement(folder: Path, metrics: Path, facts: dict, gpu: str) -> None:
    """The burst as a run folder the calculator reads (lab.sizing.measured_runs): its metrics, the
    size and precision it trained at (config.json) and the cards it ran on (device.json)."""
    if not metrics.is_file():
        return
    burst = facts["worker"]["burst"]
    tmp = folder.with_name(folder.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(metrics, tmp / "metrics.jsonl")
    (tmp / "config.json").write_text(json.dumps({**burst["size"], "gpu": gpu, "precision": burst["precision"]}),
                                     encoding="utf-8")
    (tmp / "device.json").write_text(json.dumps({"gpu": gpu, "device": "cuda" if facts.get("gpus") else "cpu",
                                                 "cards": max(1, len(facts.get("gpus") or [])),
                                                 "world": facts.get("procs"), "precision": burst["precision"],
                                                 "vocab": burst["size"]["vocab"], "torch": facts.get("torch")}),
                                     encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
