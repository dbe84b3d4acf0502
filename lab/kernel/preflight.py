"""The session's first checks: the cards it was pushed for, the image it runs on, its NCCL settings.

One call at the notebook's start (`preflight`), before any input is read or any step taken:

* The cards. A session pushed for GPU T4 ×2 must find two CUDA devices of compute capability
  7.0 or more (the image's torch, 2.10 built for CUDA 12.8, has no kernels below sm_70). Kaggle
  offers GPUs only to verified accounts (the phone, and for accounts made after December 2025
  their identity: `lab.kaggle.limits`), and a session may start with none: then it writes
  `no-gpu.json` (what it found) and stops before training, unless the push said `allow_cpu`
  (the person's LAB_KAGGLE_ALLOW_CPU=1), when it trains on its CPU as before.
* The image: Kaggle's image version files (`/etc/git_commit`, `/etc/build_date`, also set as
  GIT_COMMIT and BUILD_DATE), Python, torch, CUDA, cuDNN, the driver; into `preflight.json`.
* NCCL: the settings the account's probe found the all-reduce working with, set for the
  workers torchrun starts from here.
* The timeline: `timeline.json` gets the wall-clock time of the first cell and of each mark
  the notebook makes after (`mark("inputs_checked")`, `mark("ended")`); the control side measures
  the session's boot, data checks and output copy from it.

Stdlib and torch only: the probe notebook pastes it too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

NO_GPU = "no-gpu.json"
PREFLIGHT = "preflight.json"
TIMELINE = "timeline.json"
# A card set's name -> (how many CUDA devices, the least compute capability each must have).
CARD_SETS = {"2xT4": (2, (7, 0))}


class NoCards(RuntimeError):
    """The session has not the cards it was pushed for; `no-gpu.json` says what it found."""


def nvidia_smi(field: str) -> str | None:
    """One field of `nvidia-smi --query-gpu` for the first card, or None without one."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _image_file(env: str, path: str) -> str | None:
    value = os.environ.get(env, "").strip()
    if value:
        return value
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def image_facts() -> dict:
    """The image this session runs: Kaggle's version files and the versions that matter here."""
    import torch  # here, not at the top: the control side reads this module's file names without torch
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"git_commit": _image_file("GIT_COMMIT", "/etc/git_commit"),
            "build_date": _image_file("BUILD_DATE", "/etc/build_date"),
            "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": cudnn, "driver": nvidia_smi("driver_version") if torch.cuda.is_available() else None}


def image_line(image: dict) -> str:
    """The session's start line: the image where it has version files (Kaggle's), and the versions
    it runs; what this machine does not have (CUDA, a driver) is left out, not shown as unknown."""
    built = " ".join(filter(None, [image.get("git_commit"), image.get("build_date") and f"({image['build_date']})"]))
    parts = [f"python {image['python']}", f"torch {image['torch']}"]
    parts += [f"CUDA {image['cuda']}"] if image.get("cuda") else []
    parts += [f"driver {image['driver']}"] if image.get("driver") else []
    return (f"image      {built}, " if built else "software   ") + ", ".join(parts)


def cards_found() -> list[dict]:
    """The CUDA devices torch sees: name, compute capability, memory."""
    import torch  # torch: the cards as torch sees them (the module's timeline needs none)
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gb": round(p.total_memory / 1e9, 2)})
    return out


def cards_missing(expected: str, found: list[dict]) -> str | None:
    """Why `found` is not the card set `expected`, or None when it is (or nothing is expected)."""
    if not expected:
        return None
    count, least = CARD_SETS.get(expected, (1, (0, 0)))
    fit = [c for c in found if tuple(int(x) for x in c["capability"].split(".")) >= least]
    if len(fit) >= count:
        return None
    return (f"pushed for {expected} ({count} CUDA device(s) of compute capability {least[0]}.{least[1]} or more), "
            f"it has {len(fit)}" + (f" of {len(found)} found" if len(found) != len(fit) else ""))


class Timeline:
    """The session's timeline in `timeline.json`: wall-clock seconds of its first cell and marks."""

    def __init__(self, out: Path, started_at: float):
        self.path, self.marks = Path(out) / TIMELINE, {"first_cell": started_at}
        self.mark("cards_checked")

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{TIMELINE}.tmp")
        tmp.write_text(json.dumps(self.marks, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)


def preflight(expect_cards: str, allow_cpu: bool, nccl_env: dict, out: Path, started_at: float) -> Timeline:
    """The session's first checks (see the module's doc); returns its timeline. Raises NoCards
    after writing `no-gpu.json` when the cards are missing and the CPU is not allowed."""
    out = Path(out)
    found, image = cards_found(), image_facts()
    missing = cards_missing(expect_cards, found)
    for name, value in (nccl_env or {}).items():
        os.environ[str(name)] = str(value)
    facts = {"expected": expect_cards, "found": found, "missing": missing, "allow_cpu": bool(allow_cpu),
             "nccl_env": dict(nccl_env or {}), "image": image}
    out.mkdir(parents=True, exist_ok=True)
    (out / PREFLIGHT).write_text(json.dumps(facts, indent=1), encoding="utf-8")
    timeline = Timeline(out, started_at)
    print(image_line(image) + (f"; NCCL {' '.join(f'{k}={v}' for k, v in nccl_env.items())} (the account's probe)"
                               if nccl_env else ""), flush=True)
    print("cards      " + (", ".join(f"{c['name']} ({c['memory_gb']} GB, capability {c['capability']})" for c in found)
                           or "none: the CPU"), flush=True)
    if missing and allow_cpu:
        print(f"warning: {missing}: training on the CPU (LAB_KAGGLE_ALLOW_CPU=1)", flush=True)
    elif missing:
        (out / NO_GPU).write_text(json.dumps(facts, indent=1), encoding="utf-8")
        raise NoCards(f"NO GPU: {missing}. Kaggle offers GPUs only to verified accounts (the phone number and, for "
                      "an account made after December 2025, its identity too, at kaggle.com/settings); this session "
                      "stops before training (no-gpu.json says what it found)")
    return timeline
