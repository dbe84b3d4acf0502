"""A group of two hosts (two sshd on this machine's loopback, ssh_fixtures) trains one run under
torchrun, one process on each host, gloo: bitwise the run of two processes on one host."""
from __future__ import annotations

import json
import re

from conftest import FP32, TINY, lab_here
from ssh_fixtures import PYTHON, ssh_lab  # noqa: F401 (fixture)


def _losses(folder) -> list[tuple]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm")) for r in rows]


def here(*args: str) -> str:
    code, out, err = lab_here(*args)
    assert code == 0, out + err
    return out


def test_a_run_on_a_group_of_two_hosts_is_bitwise_the_run_of_two_processes_on_one_host(
        ssh_lab, pydoc_data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    here("machines", "add", "pair", "--hosts", "box-a,box-b", "--python", PYTHON, "--workdir",
         str(ssh_lab.workdir("pair")), "--no-check")
    fields = [*TINY, *FP32, "--data-dir", str(pydoc_data), "-c", "pydoc", "--steps-until", "20"]
    # By a person without rsync: the data goes up by sftp, resumable file by file.
    no_rsync = tmp_path / "bin"
    no_rsync.mkdir()
    for tool in ("ssh", "sftp"):
        (no_rsync / tool).symlink_to(f"/usr/bin/{tool}")
    monkeypatch.setenv("PATH", str(no_rsync))
    out = here("run", "--machine", "pair", *fields)
    assert "checking box-a (with a short training burst)" in out and "checking box-b" in out, "checked on first use"
    assert "copying the data" in out and "torchrun over 2 hosts, rendezvous at 127.0.0.1:" in out
    run_id = re.search(r"^run (\S+):", out, re.MULTILINE).group(1)
    run = tmp_path / "home" / "runs" / run_id
    record = json.loads((run / "run.json").read_text())
    assert [(x["machine"], x["status"], x["to_step"]) for x in record["links"]] == [("pair", "done", 20)]
    assert json.loads((run / "device.json").read_text())["world"] == 2
    assert (run / "links" / "001-pair" / "node-1" / "session.log").is_file(), "the second host's log came back"
    here("train", "--nproc", "2", "--out", str(tmp_path / "one-host"), *fields)
    assert _losses(run) == _losses(tmp_path / "one-host")
