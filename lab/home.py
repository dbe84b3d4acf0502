"""Where things live on a member's computer: the lab home folder and its layout.

One lab home, wherever the control notebook or the `lab` command is started from: `$LAB_HOME`
when it is set, else the kit's own (`default_home`: `lab-home` in the kit's checkout, the folder
`./scripts/demo` uses), never a folder that depends on the directory a command runs in.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "LAB_HOME"
KIT = Path(__file__).resolve().parent.parent  # the folder holding the `lab` package


def default_home() -> Path:
    """The kit's own lab home: `lab-home` beside `lab/` when the kit is used from its checkout (an
    editable install too), else `~/lab-home` (a kit installed as a package keeps no data among
    its files)."""
    return KIT / "lab-home" if (KIT / "pyproject.toml").is_file() else Path.home() / "lab-home"


def from_env() -> bool:
    """Whether `$LAB_HOME` chooses the lab home (else it is the kit's own)."""
    return bool(os.environ.get(ENV, "").strip())


def lab_home() -> Path:
    """`$LAB_HOME`, else the kit's own (`default_home`); created on first use."""
    home = Path(os.environ[ENV]).expanduser() if from_env() else default_home()
    home = home.resolve()
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
