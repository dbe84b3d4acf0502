"""Fixtures for the Kaggle side: a local Kaggle emulator and a lab home whose accounts use it.

`make_kaggle_emulator(**options)` starts an emulator (127.0.0.1, a free port) and stops it at
the end of the test; `kaggle_emulator` is one with the usual test settings.
`kaggle_lab(kaggle_emulator)` is a fresh lab home pointed at it (LAB_HOME, LAB_KAGGLE_API_URL,
HOME set; no global Kaggle token; LAB_KAGGLE_ALLOW_CPU=1, since the emulator's sessions have no
GPU) with two key accounts added: `alice` and `bob`.
`kaggle_lab.client(name)` gives that account's AccountClient with fast retries.
`kaggle_settings(monkeypatch, settings)`: every Kaggle host made in this process builds these.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from kaggle_emulator import KaggleEmulator

# Fast enough for tests: 1 wall second is 1 emulated minute of quota and session time.
TEST_EMULATOR = dict(time_scale=60.0, dataset_ready_s=0.3, queue_s=0.05, grace_s=5.0)


@pytest.fixture
def make_kaggle_emulator(tmp_path_factory) -> Iterator[Callable[..., KaggleEmulator]]:
    started: list[KaggleEmulator] = []

    def make(**options) -> KaggleEmulator:
        emu = KaggleEmulator(tmp_path_factory.mktemp("kaggle-emulator"), **{**TEST_EMULATOR, **options})
        emu.add_account("alice")
        emu.add_account("bob")
        started.append(emu.start())
        return emu

    yield make
    for emu in started:
        emu.stop()


@pytest.fixture
def kaggle_emulator(make_kaggle_emulator) -> KaggleEmulator:
    return make_kaggle_emulator()


@dataclass
class KaggleLab:
    emu: KaggleEmulator
    home: Path  # LAB_HOME
    files: Path  # where the test's kaggle.json files were written

    def kaggle_json(self, username: str, key: str | None = None) -> Path:
        """A kaggle.json for an emulator account (or with a given, maybe wrong, key)."""
        path = self.files / f"{username}-{len(list(self.files.iterdir()))}.json"
        path.write_text(json.dumps({"username": username, "key": key or self.emu.account(username).key}))
        return path

    def client(self, name: str, **kw):
        from lab.kaggle import client as kc
        kw.setdefault("retry", kc.RetryPolicy(attempts=6, base_s=0.01, cap_s=0.05))
        return kc.client_for(name, **kw)


@pytest.fixture
def kaggle_lab(kaggle_emulator, tmp_path, monkeypatch) -> KaggleLab:
    return lab_for(kaggle_emulator, tmp_path, monkeypatch)


@pytest.fixture
def lab_env(pydoc_data, kaggle_lab, monkeypatch):
    """`kaggle_lab` with the pydoc data (`lab_env.data`), ready to drive runs (`driving`)."""
    with driving(kaggle_lab, pydoc_data, monkeypatch) as lab:
        yield lab


def kaggle_settings(monkeypatch, settings) -> None:
    """Every Kaggle host made from now on in this process builds `settings` (a KaggleSettings at
    the emulator's pace) instead of the person's; a background driver keeps the person's."""
    from lab.machines.kaggle.data import KaggleSettings
    monkeypatch.setattr(KaggleSettings, "from_env", classmethod(lambda cls: settings))


def fast_driving(monkeypatch) -> None:
    """Drivers, in this process and in the background, look again every 0.2 s while a run waits,
    and background drivers poll Kaggle that often, through the person's own settings; sessions
    train on one thread (fast and bitwise repeatable)."""
    monkeypatch.setenv("LAB_DRIVER_POLL_S", "0.2")
    monkeypatch.setenv("LAB_KAGGLE_POLL_S", "0.2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@contextmanager
def driving(lab: KaggleLab, data: Path, monkeypatch) -> Iterator[KaggleLab]:
    """`fast_driving`, with the data at `lab.data`; no background driver is left behind after."""
    from lab.machines import control
    fast_driving(monkeypatch)
    lab.data = data
    try:
        yield lab
    finally:
        for proc in control.spawned.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        control.spawned.clear()


def lab_for(emu: KaggleEmulator, tmp_path: Path, monkeypatch) -> KaggleLab:
    from lab.kaggle import client as kc
    home, files, user_home = tmp_path / "lab-home", tmp_path / "creds", tmp_path / "user-home"
    for p in (home, files, user_home):
        p.mkdir(exist_ok=True)  # a thread an earlier test left may have made it (LAB_HOME is read late)
    monkeypatch.setenv("LAB_HOME", str(home))
    monkeypatch.setenv("LAB_KAGGLE_API_URL", emu.url)
    monkeypatch.setenv("HOME", str(user_home))  # no ~/.kaggle/access_token from this machine
    # The emulator's sessions have no GPU: they train on their CPU (a test that shows the stop unsets it).
    monkeypatch.setenv("LAB_KAGGLE_ALLOW_CPU", "1")
    for var in ("KAGGLE_API_TOKEN", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_USERNAME", "KAGGLE_KEY"):
        monkeypatch.delenv(var, raising=False)
    lab = KaggleLab(emu, home, files)
    for name in ("alice", "bob"):
        kc.add_account(name, kaggle_json=lab.kaggle_json(name))
    return lab


def make_notebook(*cells: str) -> dict:
    """A notebook (nbformat 4 JSON) of code cells, for pushing."""
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return json.loads(nbformat.writes(nb))


# The first cell of a notebook that wants to see how its session is stopped.
SAVER_CELL = """
import os, pathlib, signal, time
root = pathlib.Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))
work = root / "working"
def on_term(signum, frame):
    (work / "sigterm.txt").write_text("saved at SIGTERM")
    raise SystemExit(0)
signal.signal(signal.SIGTERM, on_term)
(work / "started.txt").write_text("started")
"""
SLEEP_CELL = "for _ in range(1200):\n    time.sleep(0.05)  # at most a minute\n"

__all__ = ["make_kaggle_emulator", "kaggle_emulator", "kaggle_lab", "lab_env", "driving", "fast_driving", "KaggleLab",
           "lab_for", "kaggle_settings", "make_notebook", "SAVER_CELL", "SLEEP_CELL", "TEST_EMULATOR"]
