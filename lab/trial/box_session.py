"""The box's half of `lab machines check`: what one host of an SSH machine has.

Sent over ssh as a script (lab.machines.remote.check builds it: the probe session's functions,
lab.trial.session, then this) and run with the box's own Python: stdlib, and torch where it is
installed. It records the Python, what the training notebook needs and which of it is missing,
free disk in the machine's workdir, whether rsync is there, and with torch the cards (name,
memory, compute capability) and versions; then, on the host asked to, the probe's worker under
torchrun (an all-reduce across the cards and a short training burst: at the reference size on
GPUs, tiny on a CPU). It prints one JSON object; a failed part is recorded, never raised.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import socket
import sys
from pathlib import Path

# What the training notebook imports on a box (a bare Kaggle image has them all), by pip name.
NEEDS = ("torch", "numpy", "sentencepiece", "matplotlib", "papermill", "ipykernel")
MIN_PYTHON = (3, 10)


def package_facts() -> dict:
    """{"versions": {name: version}, "missing": [names]} of NEEDS, without importing them."""
    versions, missing = {}, []
    for name in NEEDS:
        if importlib.util.find_spec(name) is None:
            missing.append(name)
            continue
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "?"
    return {"versions": versions, "missing": missing}


def box_main(workdir: str, gpu_size: dict, cpu_size: dict, steps: int, timeout_s: float, burst: bool,
             min_free_gb: float, worker_source: str) -> dict:
    w = Path(workdir).expanduser()
    w = (w if w.is_absolute() else Path.home() / w).resolve()
    facts = {"format": 1, "python": sys.version.split()[0], "executable": sys.executable,
             "hostname": socket.gethostname(), "workdir": str(w), "rsync": bool(shutil.which("rsync")),
             "python_ok": sys.version_info[:2] >= MIN_PYTHON, **package_facts()}
    try:
        w.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        facts["workdir_error"] = f"{type(e).__name__}: {e}"
        return facts
    facts["free_gb"] = round(shutil.disk_usage(w).free / 1e9, 4)
    if facts["free_gb"] is not None and facts["free_gb"] < min_free_gb:
        facts["disk_full"] = True  # no room for a run there: nothing more is written
        return facts
    if "torch" in facts["missing"]:
        return facts
    facts.update(gpu_facts())  # noqa: F821 - lab.trial.session's, pasted before this
    if facts["missing"] or not burst:
        return facts
    folder = w / "check"
    folder.mkdir(parents=True, exist_ok=True)
    worker = folder / "lab_probe_worker.py"
    worker.write_text(worker_source, encoding="utf-8")
    cards = len(facts["gpus"])
    size = gpu_size if cards else cpu_size
    procs = cards if cards else 2  # on CPU two gloo processes still take the all-reduce path
    ran = run_worker(worker, folder / "worker.json", procs, size, steps, timeout_s)  # noqa: F821 - pasted too
    facts.update(size=size, procs=procs, worker=ran)
    metrics = folder / "metrics.jsonl"
    facts["metrics"] = metrics.read_text(encoding="utf-8") if metrics.is_file() else ""
    for path in (metrics, folder / "worker.json", worker):
        path.unlink(missing_ok=True)
    return facts


if __name__ == "__main__" and len(sys.argv) > 1:
    args = json.loads(sys.argv[1])
    print(json.dumps(box_main(args["workdir"], args["gpu_size"], args["cpu_size"], args["steps"], args["timeout_s"],
                              args["burst"], args["min_free_gb"], WORKER_SOURCE)),  # noqa: F821 - lab.machines.remote.check
          flush=True)
