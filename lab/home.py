"""Where things live on a member's computer: the lab home folder and its layout."""
from __future__ import annotations

import os
from pathlib import Path


def lab_home() -> Path:
    """`$LAB_HOME`, default `./lab-home` (created on first use)."""
    home = Path(os.environ.get("LAB_HOME", "lab-home")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def constellations_file() -> Path:
    return lab_home() / "constellations.ini"


def tokenizers_dir() -> Path:
    return lab_home() / "tokenizers"


def data_dir() -> Path:
    return lab_home() / "data"


def runs_dir() -> Path:
    return lab_home() / "runs"


def accounts_dir() -> Path:
    return lab_home() / "accounts"


def machines_dir() -> Path:
    """The lab's own machines over SSH (lab.machines.ssh.boxes): one folder per box or group."""
    return lab_home() / "machines"
