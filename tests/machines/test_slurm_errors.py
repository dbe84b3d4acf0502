"""Bad input for the lab's Slurm clusters, against the real one-node Slurm (slurm_fixtures): a
partition that does not exist, Slurm's commands missing or reaching no controller, cards the
nodes do not have, and a job that fails at once (on a cluster reached here, `--slurm local`),
each one clear message, exit status 2, with nothing of the lab's lost."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import FP32, TINY, lab_here
from slurm_fixtures import slurm_cluster  # noqa: F401 (fixture)
from ssh_fixtures import PYTHON

pytestmark = pytest.mark.xdist_group("slurm")  # one cluster per session: its tests in one process


@pytest.fixture
def home(slurm_cluster, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAB_SLURM_POLL_S", "0.5")
    return tmp_path / "home"


def refused(*args: str) -> str:
    """`lab ARGS` refused as bad input: exit 2, one line, no traceback."""
    code, out, err = lab_here(*args)
    assert code == 2, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def machines_listed() -> list[str]:
    from lab.machines.registry import machine_names
    return machine_names()


def test_a_partition_that_does_not_exist_is_named_with_those_there(home, tmp_path):
    err = refused("machines", "add", "c", "--slurm", "local", "--partition", "nosuch", "--python", PYTHON,
                  "--workdir", str(tmp_path / "w"))
    assert "Slurm on this computer has no partition 'nosuch' (its partitions: debug, spare): give one of them with " \
           "--partition" in err and "The machine was not added" in err
    assert machines_listed() == ["local"]
    assert lab_here("machines", "add", "c", "--slurm", "local", "--partition", "nosuch", "--python", PYTHON,
                    "--no-check")[0] == 0
    err = refused("run", "--machine", "c", *TINY, "-c", "pydoc")
    assert "no partition 'nosuch'" in err
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir()), "no run registered"


def test_a_computer_without_slurms_commands_says_where_they_are_missing(home, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    err = refused("machines", "add", "c", "--slurm", "local", "--python", PYTHON)
    assert "there is no `sbatch` on this computer: is this the cluster's login node? Install Slurm's client " \
           "commands here (Debian: apt install slurm-client), or add the cluster with --slurm [USER@]LOGIN_HOST" in err
    assert machines_listed() == ["local"]


def test_slurm_commands_that_reach_no_controller_say_so(home, tmp_path, monkeypatch):
    from ssh_fixtures import free_port
    down = tmp_path / "slurm.conf"  # a controller that is not running, at a port where nothing listens
    down.write_text(f"ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                    "MessageTimeout=2\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1 Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(down))
    err = refused("machines", "add", "c", "--slurm", "local", "--python", PYTHON, "--workdir", str(tmp_path / "w"))
    assert "Slurm's commands on this computer reach no controller (slurm_load_partitions error: Unable to contact " \
           "slurm controller (connect failure))" in err
    assert "is this the cluster's login node, with its slurm.conf (or SLURM_CONF) in place?" in err
    assert machines_listed() == ["local"]


def test_cards_the_nodes_do_not_have_are_refused_in_slurms_words(home, tmp_path):
    err = refused("machines", "add", "g", "--slurm", "local", "--gres", "gpu:2", "--python", PYTHON,
                  "--workdir", str(tmp_path / "w"))
    assert "cluster 'g' (this computer, its default partition): Slurm refused the job:" in err
    assert "Invalid generic resource (gres) specification" in err and "--gres" in err
    assert machines_listed() == ["local"]


def test_slurm_flags_without_a_cluster_are_refused():
    err = refused("machines", "add", "b", "--ssh", "box-a", "--partition", "debug")
    assert "--partition, --account, --gres, --nodes and --time are a Slurm cluster's" in err
    err = refused("machines", "add", "b", "--slurm", "local", "--time", "0:30")
    assert "--time 0:30: a job of the lab's needs at least a minute" in err


def test_a_job_that_fails_at_once_stops_the_run_with_the_end_of_its_log(home, tmp_path, pydoc_data):
    bare = "/usr/bin/python3"
    lacks = Path(bare).is_file() and subprocess.run([bare, "-c", "import papermill"], capture_output=True).returncode
    if not lacks:
        pytest.skip(f"{bare} is missing here or has papermill")
    assert lab_here("machines", "add", "bare", "--slurm", "local", "--python", bare, "--workdir", str(tmp_path / "w"),
                    "--no-check")[0] == 0
    err = refused("run", "--machine", "bare", *TINY, *FP32, "--data-dir", str(pydoc_data), "-c", "pydoc",
                  "--steps-until", "20")
    assert "cluster 'bare' (this computer, its default partition): the session failed" in err
    assert "the session failed: ModuleNotFoundError: No module named 'papermill'" in err
    assert "(the cluster's Python lacks it" in err and "Its log ends:" in err and "are in links/001-bare/" in err
    run = next((home / "runs").iterdir())
    record = json.loads((run / "run.json").read_text())
    link = record["links"][0]
    assert record["status"] == "failed" and link["outcome"]["kind"] == "failed" and link["outcome"]["session"]
    assert (run / "links" / "001-bare" / "session.log").is_file(), "the job's log came back"
    assert Path(link["detail"]["remote"]).is_dir(), "a failed job's folder stays on the cluster for a look"
