"""Bad input for the lab's SSH machines, against real OpenSSH servers (ssh_fixtures): each is one
clear message that names the host and says what to do, exit status 2, and nothing of the lab's
is lost."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import TINY, lab_here
from ssh_fixtures import PYTHON, ssh_lab  # noqa: F401 (fixture)


@pytest.fixture
def home(ssh_lab, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    code, _, err = lab_here("machines", "add", "a", "--ssh", "box-a", "--python", PYTHON, "--workdir",
                            str(tmp_path / "w"), "--no-check")
    assert code == 0, err
    return tmp_path / "home"


def machines_listed() -> list[str]:
    from lab.machines.registry import machine_names
    return machine_names()


def refused(*args: str) -> str:
    """`lab ARGS` (in this process: nothing here needs one of its own) refused as bad input."""
    code, out, err = lab_here(*args)
    assert code == 2, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_an_unreachable_host_is_named_with_what_to_do_and_not_added(home, ssh_lab):  # noqa: F811
    err = refused("machines", "add", "off", "--ssh", "box-off", "--python", PYTHON)
    assert "box-off: cannot reach it (ssh: connect to host 127.0.0.1 port" in err and "Connection refused" in err
    assert "is the box on and on the network, and does `ssh box-off` work from here?" in err
    assert "The machine was not added" in err
    assert machines_listed() == ["local", "a"]


def test_a_host_whose_key_changed_is_refused_and_its_key_left_alone(home, ssh_lab):  # noqa: F811
    known = (ssh_lab.root / "known_hosts").read_text()
    err = refused("machines", "add", "rekeyed", "--ssh", "box-rekeyed", "--python", PYTHON)
    assert "box-rekeyed: its host key is not the one your known_hosts holds" in err
    assert "`ssh-keygen -R box-rekeyed`" in err and "The machine was not added" in err
    assert (ssh_lab.root / "known_hosts").read_text() == known, "the kit accepts no host key by itself"
    assert machines_listed() == ["local", "a"]


def test_a_wrong_python_is_named_with_how_to_find_the_right_one(home):
    err = refused("machines", "add", "nopy", "--ssh", "box-b", "--python", "/nonexistent/bin/python3")
    assert "there is no Python at /nonexistent/bin/python3 on box-b" in err
    assert "`ssh box-b which python3`" in err and "--python PATH" in err
    assert machines_listed() == ["local", "a"]


def test_a_host_without_torch_says_what_to_install_and_auto_passes_it_by(home):
    bare = "/usr/bin/python3"
    if not Path(bare).is_file() or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{bare} is missing here or has torch")
    err = refused("machines", "add", "bare", "--ssh", "box-b", "--python", bare)
    assert "bare cannot run the lab's sessions: box-b lacks torch" in err
    assert f"`ssh box-b {bare} -m pip install torch" in err and "then `lab machines check bare`" in err.lower()
    assert "bare" in machines_listed(), "kept, with its check: fixed and checked again, it runs"
    from lab.machines import driver
    state = driver.overview(only="bare")[0]
    assert not state.free and "lacks torch" in state.error  # Auto skips it
    err = refused("run", "--machine", "bare", *TINY, "-c", "pydoc")
    assert "box 'bare' (box-b): box-b lacks torch" in err
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir()), "no run registered"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs: a box's workdir on a full disk."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): the full-disk case needs one")
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_a_full_remote_disk_is_named_with_what_to_do_and_no_run_starts(home, small_disk):
    err = refused("machines", "add", "full", "--ssh", "box-a", "--python", PYTHON, "--workdir", str(small_disk))
    assert f"box-a has 1.0 MB free in {small_disk}, too little for a run's data and checkpoints" in err
    assert "free some space there, or give the machine another --workdir" in err
    err = refused("run", "--machine", "full", *TINY, "-c", "pydoc")
    assert "box 'full' (box-a): box-a has 1.0 MB free" in err
    assert list(small_disk.iterdir()) == [], "nothing was written there"


def test_a_missing_ssh_config_file_is_named(home, monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_SSH_CONFIG", str(tmp_path / "no-such-config"))
    err = refused("machines", "check", "a")
    assert f"LAB_SSH_CONFIG={tmp_path / 'no-such-config'}: no such file" in err
