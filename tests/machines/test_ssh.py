"""A box of the lab's over SSH, against real OpenSSH servers on this machine (ssh_fixtures):
adding and checking it, a run through the notebook there that goes on here and then on another
box as one curve, and a run that outlives a dropped connection and a crashed control side, then
stops at a cancel with its checkpoint."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FP32, ROOT, TINY, lab, lab_here
from ssh_fixtures import PYTHON, ssh_lab  # noqa: F401 (fixture)

pytestmark = pytest.mark.xdist_group("ssh-home")  # the box is added and checked once: its tests in one process


@pytest.fixture(scope="module")
def ssh_home(ssh_lab, pydoc_data, tmp_path_factory):  # noqa: F811
    """A lab home of this module's own, with box 'a' (box-a) added and checked once."""
    home = tmp_path_factory.mktemp("ssh-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_HOME", str(home))
        mp.setenv("OMP_NUM_THREADS", "1")
        workdir = ssh_lab.workdir("a")
        added = here("machines", "add", "a", "--ssh", "box-a", "--python", PYTHON, "--workdir", str(workdir))
        yield {"home": home, "data": pydoc_data, "lab": ssh_lab, "added": added, "workdir": workdir}


def here(*args: str) -> str:
    """`lab ARGS` in this process (its stdout), as a person would type it."""
    code, out, err = lab_here(*args)
    assert code == 0, out + err
    return out


def run_fields(data: Path, steps: int, *extra: str) -> list[str]:
    return [*TINY, *FP32, "--data-dir", str(data), "-c", "pydoc", "--steps-until", str(steps), *extra]


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_record(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "run.json").read_text())


def run_id_of(out: str) -> str:
    """The run's id from `lab run`'s line "run ID: ..." (notes on the fields may come before it)."""
    return re.search(r"^run (\S+):", out, re.MULTILINE).group(1)


def test_adding_a_box_checks_it_and_the_calculator_counts_its_burst_as_measured(ssh_home):
    out = ssh_home["added"]
    assert "Added box 'a' (box-a)" in out and "cpu" in out and "tok/s measured" in out
    check = json.loads((ssh_home["home"] / "machines" / "a" / "check.json").read_text())
    host = check["hosts"][0]
    assert check["can_run"] is True and check["gpu"] == "cpu" and host["missing"] == []
    assert host["torch"] and host["python"] == sys.version.split()[0] and host["free_gb"] > 0
    assert "password" not in (ssh_home["home"] / "machines" / "a" / "machine.json").read_text().lower()
    listing = here("machines")
    assert any(line.split()[:3] == ["a", "ssh", "cpu"] and "min ago" in line for line in listing.splitlines())
    from lab.config import RunConfig
    from lab.trial.sources import CPU_SIZE
    from lab.sizing import estimate
    from lab.sizing.speeds import measured_runs
    assert [m.gpu for m in measured_runs() if m.run == "check:a"] == ["cpu"]
    size = {k: v for k, v in CPU_SIZE.items() if k != "vocab"}
    est = estimate(RunConfig(**size, gpu="cpu", precision="fp32"), vocab=CPU_SIZE["vocab"])
    assert est.tok_s.kind == "measured" and "check:a" in est.tok_s.note, "the calculator reads the burst"


def test_a_run_on_a_box_continues_here_then_there_again_as_one_curve(ssh_home, tmp_path, monkeypatch):
    home, data = ssh_home["home"], ssh_home["data"]
    # Cosine: more steps go on in the same run (a finished WSD run would grow into a child run).
    run_id = run_id_of(here("run", "--machine", "a", *run_fields(data, 20, "--schedule", "cosine")))
    folder = home / "runs" / run_id
    link = run_record(home, run_id)["links"][0]
    assert (link["machine"], link["kind"], link["status"], link["to_step"]) == ("a", "ssh", "done", 20)
    executed = json.loads((folder / link["notebook"]).read_text())
    assert any("nnodes" in "".join(c["source"]) for c in executed["cells"]), "the parameterized notebook ran there"
    assert (folder / "loss.png").stat().st_size > 1000 and (folder / "links" / "001-a" / "loss.png").is_file()
    from lab.kernel.checkpoint import verify_checkpoint
    assert verify_checkpoint(folder / "checkpoints" / link["checkpoint"]["name"]) is None

    here("run", "--resume", run_id, "--machine", "local", "--steps-until", "40", "-q")
    # The third link by a person without rsync: the checkpoint goes up, the outputs come back by sftp.
    no_rsync = tmp_path / "bin"
    no_rsync.mkdir()
    for tool in ("ssh", "sftp"):
        (no_rsync / tool).symlink_to(f"/usr/bin/{tool}")
    monkeypatch.setenv("PATH", str(no_rsync))
    here("run", "--resume", run_id, "--machine", "a", "--steps-until", "60", "-q")
    record = run_record(home, run_id)
    assert [(x["machine"], x["from_step"], x["to_step"]) for x in record["links"]] == \
        [("a", 0, 20), ("local", 20, 40), ("a", 40, 60)]
    assert [r["step"] for r in rows_of(folder)] == list(range(1, 61)), "one curve across the three links"
    assert record["status"] == "done"
    assert verify_checkpoint(folder / "checkpoints" / record["links"][2]["checkpoint"]["name"]) is None


def _driver_pid(home: Path, run_id: str) -> int:
    return json.loads((home / "runs" / run_id / "control.json").read_text())["pid"]


def _wait(what, timeout_s: float = 90.0, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def _live_rows(home: Path, run_id: str) -> int:
    live = home / "runs" / run_id / "links" / "001-a" / "live-metrics.jsonl"
    return len(live.read_text().splitlines()) if live.is_file() else 0


def test_a_dropped_connection_and_a_crashed_control_side_lose_nothing_and_a_cancel_saves_then_stops(ssh_home):
    home, data = ssh_home["home"], ssh_home["data"]
    # Long enough to be cut short; uncompiled, so it trains at once.
    started = lab("run", "--machine", "a", "--detach",
                  *run_fields(data, 1_000_000, "--eval-every", "200", "--torch-compile", "off"))
    run_id = run_id_of(started.stdout)
    _wait(lambda: _live_rows(home, run_id) > 20)
    driver = _driver_pid(home, run_id)
    sshd = ssh_home["lab"].servers["a"].proc
    os.kill(sshd.pid, signal.SIGSTOP)  # the box drops off the network: no connection reaches it
    try:
        log = home / "runs" / run_id / "control.log"
        _wait(lambda: "lost the connection to box-a" in log.read_text(), timeout_s=120)
    finally:
        os.kill(sshd.pid, signal.SIGCONT)
    seen = _live_rows(home, run_id)
    _wait(lambda: _live_rows(home, run_id) > seen + 50)  # the run went on, and the driver connected again
    os.kill(driver, signal.SIGKILL)  # the control side crashes
    box_metrics = ssh_home["workdir"] / "runs" / run_id / "001-0" / "out" / "metrics.jsonl"
    before = len(box_metrics.read_text().splitlines())
    _wait(lambda: len(box_metrics.read_text().splitlines()) > before + 50)  # the session runs on, detached
    watcher = subprocess.Popen([sys.executable, "-m", "lab.cli", "watch", run_id, "-q"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = _live_rows(home, run_id)
        _wait(lambda: _live_rows(home, run_id) > seen + 50)  # `lab watch` reattached
        cancelled = here("cancel", run_id)
        assert "saves a checkpoint and stops" in cancelled
        out, _ = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    record = run_record(home, run_id)
    assert record["status"] == "cancelled" and len(record["links"]) == 1, out
    link = record["links"][0]
    assert link["status"] == "cancelled" and link["outcome"]["kind"] == "cancelled"
    step = link["to_step"]
    assert link["checkpoint"]["step"] == step > before
    from lab.kernel.checkpoint import verify_checkpoint
    assert verify_checkpoint(home / "runs" / run_id / "checkpoints" / link["checkpoint"]["name"]) is None
    assert [r["step"] for r in rows_of(home / "runs" / run_id)] == list(range(1, step + 1)), "nothing lost"


def test_a_box_takes_a_run_longer_than_kaggles_session_and_says_nothing_of_kaggle(ssh_home):
    """Limits belong to their machine: a box has none, so a 900-minute run registers there (Kaggle's
    12-hour session refuses one: tests/machines/test_machines.py)."""
    from lab import settle
    from lab.config import RunConfig
    fields = RunConfig(**{k: v for k, v in [("context", 32), ("width", 32), ("heads", 2), ("layers", 2)]},
                       data_dir=str(ssh_home["data"]), limit_min=900).to_dict()
    run = settle.register_run(fields, machine="a")
    assert run.cfg.limit_min == 900
    sized = here("size", "--machine", "a", "--limit-min", "900", "--data-dir", str(ssh_home["data"]))
    assert "12-hour" not in sized and "leaves no room" not in sized, sized
