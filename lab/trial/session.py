"""The probe session: what one short Kaggle session finds out about an account's machine.

Pasted into the probe notebook (lab.probe.account builds it) after the worker script and
lab.kernel.signals and lab.kernel.preflight, and run on Kaggle's image: stdlib and torch only. It
records whether the session has GPUs, which, the image (Kaggle's version files, Python, torch,
CUDA, the driver) and NCCL's version, where /kaggle/input mounts the lab's probe dataset (its
marker file), free disk, then runs the worker under torchrun (an all-reduce across the cards and a
short training burst) with a timeout, so a hung NCCL costs minutes, not the session; when the
all-reduce fails or hangs, once more with NCCL_P2P_DISABLE=1, recording which worked (the runs on
the account push with it). It prints as it goes: the control side also learns whether Kaggle shows
a running session's log.
Everything lands in `probe.json` in the outputs; a failed part is recorded, never raised.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from lab.kernel.preflight import cards_found, image_facts
from lab.kernel.signals import run_group


def kaggle_dir() -> Path:
    return Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))


def gpu_facts() -> dict:
    """The cards torch sees, the image (lab.kernel.preflight: Kaggle's image version files,
    Python, torch, CUDA, the driver) and NCCL's version."""
    import torch  # torch: after the session's start is marked
    image = image_facts()
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": cards_found(), "driver": image["driver"],
             "nccl": None, "cuda_available": torch.cuda.is_available(), "image": image}
    if facts["gpus"]:
        try:
            version = torch.cuda.nccl.version()  # a tuple; an int in older torch
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as e:  # noqa: BLE001 - recorded, not raised
            facts["nccl"] = f"unknown ({type(e).__name__})"
    return facts


def find_marker(name: str, max_depth: int = 6) -> tuple[str | None, str | None]:
    """(where the probe dataset's marker file is mounted, relative to /kaggle/input; its text)."""
    root = kaggle_dir() / "input"
    if not root.is_dir():
        return None, None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        if name in filenames:
            return str((here / name).relative_to(root)), (here / name).read_text(encoding="utf-8", errors="replace")
        if len(here.relative_to(root).parts) >= max_depth:
            dirnames.clear()
        dirnames.sort()
    return None, None


def free_disk_gb(path: Path) -> float | None:
    try:
        return round(shutil.disk_usage(path).free / 1e9, 2)
    except OSError:
        return None


def run_worker(worker: Path, out: Path, procs: int, size: dict, steps: int, timeout_s: float,
               env: dict | None = None) -> dict:
    """The worker under torchrun, with `env` on top of this process's; its JSON, or what went
    wrong (a timeout: a hang, and then torchrun's whole process group is ended, its workers with it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           str(worker), str(out), json.dumps(size), str(steps)]
    out.unlink(missing_ok=True)  # an earlier try's result is not this one's
    started = time.monotonic()
    proc, timed_out = run_group(cmd, timeout_s, env={**os.environ, **(env or {})})
    if timed_out:
        return {"error": f"the workers did not finish within {timeout_s:.0f} s (a hang in NCCL?)"}
    print(proc.stdout[-4000:], end="", flush=True)
    result = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    if proc.returncode != 0 and not result.get("burst"):
        return {"error": f"the workers failed (exit {proc.returncode}): {root_cause(proc.stderr)}"
                         f"{proc.stderr.strip()[-1500:]}"}
    if proc.returncode != 0:  # rank 0 wrote the whole result, then a rank died tearing the group down
        result["teardown"] = f"torchrun exited {proc.returncode} after the result was written: {root_cause(proc.stderr)}"
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def root_cause(stderr: str) -> str:
    """The first error a worker raised, as one line ahead of torchrun's own summary ("" if none)."""
    for line in stderr.splitlines():
        text = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())  # torch prefixes each rank's lines
        head = text.split(":", 1)[0]
        if re.fullmatch(r"[\w.]*(Error|Exception)", head) and "ChildFailedError" not in head and ":" in text:
            return text[:300] + " | "
    return ""


P2P_OFF = {"NCCL_P2P_DISABLE": "1"}  # the one retry: NCCL without peer-to-peer between the cards


def _cards_talk(worker: Path, out: Path, procs: int, size: dict, steps: int, timeout_s: float) -> tuple[dict, dict]:
    """The worker's result, and {"nccl_env": the settings it worked with, "nccl_first_try": why
    the first try failed}: when the all-reduce fails or hangs, once more with NCCL_P2P_DISABLE=1."""
    worked = run_worker(worker, out, procs, size, steps, timeout_s)
    if not worked.get("error") and (worked.get("all_reduce") or {}).get("ok"):
        return worked, {"nccl_env": {}}
    why = worked.get("error") or "the all-reduce gave a wrong result"
    print(f"probe: {why}; once more with NCCL_P2P_DISABLE=1", flush=True)
    again = run_worker(worker, out, procs, size, steps, timeout_s, env=P2P_OFF)
    fixed = not again.get("error") and (again.get("all_reduce") or {}).get("ok")
    return again, {"nccl_env": dict(P2P_OFF) if fixed else {}, "nccl_first_try": why[:500]}


def probe_main(marker: str, gpu_size: dict, cpu_size: dict, steps: int, hold_s: float, timeout_s: float,
               worker: str = "lab_probe_worker.py") -> dict:
    """The whole probe; writes `probe/` (probe.json, and the burst's metrics.jsonl) into the
    outputs and returns the facts."""
    started = time.monotonic()
    print("probe: started", flush=True)
    work = kaggle_dir() / "working"
    out = (work if work.is_dir() else Path.cwd()) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    facts = {"format": 1, **gpu_facts(), "python": sys.version.split()[0]}
    facts["input_mount"], facts["input_marker"] = find_marker(marker)
    facts["free_disk_gb"] = {"working": free_disk_gb(out), "tmp": free_disk_gb(Path("/tmp"))}
    print(f"probe: {len(facts['gpus'])} GPU(s) {[g['name'] for g in facts['gpus']]}, torch {facts['torch']}, "
          f"CUDA {facts['cuda']}, NCCL {facts['nccl']}, driver {facts['driver']}; input at {facts['input_mount']}",
          flush=True)
    cards = len(facts["gpus"])
    size = gpu_size if cards else cpu_size
    procs = cards if cards else 2  # on CPU two gloo processes still take the all-reduce path
    worked, nccl = _cards_talk(Path(worker).resolve(), out / "worker.json", procs, size, steps, timeout_s)
    facts.update({"worker": worked, "size": size, "procs": procs, **nccl})
    (out / "worker.json").unlink(missing_ok=True)
    # Long enough that a log Kaggle flushes now and then shows some of it while the session runs.
    while time.monotonic() - started < hold_s:
        print(f"probe: holding the session for the log check, {hold_s - (time.monotonic() - started):.0f} s left",
              flush=True)
        time.sleep(min(10.0, max(0.0, hold_s - (time.monotonic() - started))))
    facts["session_s"] = round(time.monotonic() - started, 1)
    (out / "probe.json").write_text(json.dumps(facts, indent=1), encoding="utf-8")
    print("probe: done", flush=True)
    return facts

