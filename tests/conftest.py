"""Shared fixtures: a lab home with the embedded `pydoc` constellation prepared once per session."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--context", "32", "--width", "32", "--heads", "2", "--layers", "2", "--batch-per-card", "4",
        "--eval-every", "10", "--eval-batches", "2", "--lr", "3e-3", "--warmup-steps", "2"]
# For tests that compare arithmetic across batch splits, processes or compilation: under bf16
# autocast (what auto picks on a CPU with bf16 instructions) other shapes round differently.
FP32 = ["--precision", "fp32"]


@pytest.fixture(scope="session")
def lab_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("lab-home")
    os.environ["LAB_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def pydoc_data(lab_home) -> Path:
    """The `pydoc` constellation prepared with a small vocabulary (fast to train on)."""
    from lab import corpus
    return corpus.prepare(["pydoc"], vocab=512, progress=False)


def lab(*args: str, check: bool = True, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Runs the `lab` command as a person would, in a fresh process."""
    proc = subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def lab_here(*args: str) -> tuple[int, str, str]:
    """`lab ARGS` in this process: (exit status, stdout, stderr). For what needs no process of
    its own (config and data errors, runs whose signals nobody sends)."""
    import contextlib
    import io
    from lab.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()
