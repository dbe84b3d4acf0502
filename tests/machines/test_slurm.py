"""A Slurm cluster of the lab's, against a real one-node Slurm the tests start (slurm_fixtures):
added over ssh and checked; a run that waits in the queue with Slurm's reason, whose job is
requeued by Slurm (as a preemption does) while the control side is away, and which goes on in a
new job with no step lost or repeated, is not started twice, and trains to steps_until with its
checkpoint and plot back; and a run whose job reaches its time limit and goes on in the next job
as one curve, then stops at a cancel after a save. (The failures: test_slurm_errors.)

A job's start (papermill, torch, the data) is most of each test's time, so both runs start when
the module does (`runs`), the cluster's node taking them side by side, and each test checks its own."""
from __future__ import annotations

import json
import re
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import FP32, TINY, lab, lab_here
from slurm_fixtures import slurm_cluster, slurm_login  # noqa: F401 (fixtures)
from ssh_fixtures import PYTHON

pytestmark = pytest.mark.xdist_group("slurm")  # one cluster per session: its tests in one process


@pytest.fixture(scope="module")
def hpc(slurm_cluster, slurm_login, pydoc_data, tmp_path_factory):  # noqa: F811
    """A lab home of this module's own with the cluster 'hpc' (over ssh, partition spare, jobs of
    two minutes) added and checked once; runs poll Slurm twice a second."""
    home = tmp_path_factory.mktemp("slurm-home")
    workdir = tmp_path_factory.mktemp("slurm-workdir")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_HOME", str(home))
        mp.setenv("LAB_SSH_CONFIG", str(slurm_login))
        mp.setenv("LAB_SLURM_POLL_S", "0.5")
        mp.setenv("OMP_NUM_THREADS", "1")
        slurm_cluster.run("scontrol", "update", "PartitionName=spare", "State=UP")
        added = here("machines", "add", "hpc", "--slurm", "slurm-login", "--partition", "spare", "--time", "2",
                     "--python", PYTHON, "--workdir", str(workdir))
        yield {"home": home, "data": pydoc_data, "added": added, "workdir": workdir, "slurm": slurm_cluster}


def here(*args: str) -> str:
    code, out, err = lab_here(*args)
    assert code == 0, out + err
    return out


def run_fields(data: Path, steps: int, *extra: str) -> list[str]:
    return [*TINY, *FP32, "--data-dir", str(data), "-c", "pydoc", "--steps-until", str(steps), "--torch-compile",
            "off", *extra]


def run_record(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "run.json").read_text())


def told(home: Path, run_id: str) -> str:
    """What the run's driver said (its control.log), for a failing assertion."""
    log = home / "runs" / run_id / "control.log"
    return log.read_text() if log.is_file() else "(no control.log)"


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_id_of(out: str) -> str:
    """The run's id from `lab run`'s line "run ID: ..." (notes on the fields may come before it)."""
    return re.search(r"^run (\S+):", out, re.MULTILINE).group(1)


def wait(what, timeout_s: float = 120.0, every_s: float = 0.2, about=lambda: ""):
    """Waits until `what()` is true; `about()` says what was seen when it never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}: {about()}")


@pytest.fixture(scope="module")
def runs(hpc, tmp_path_factory) -> dict:
    """Two runs started in the background at once: `busy` on 'hpc', whose partition is down now,
    so it waits; `timed`, far longer than a job, on 'short' (the same login node, the partition
    debug, jobs of one minute, never checked: a run reads its partition first)."""
    hpc["slurm"].run("scontrol", "update", "PartitionName=spare", "State=DOWN")
    here("machines", "add", "short", "--slurm", "slurm-login", "--partition", "debug", "--time", "1", "--python",
         PYTHON, "--workdir", str(tmp_path_factory.mktemp("slurm-short")), "--no-check")
    data = hpc["data"]
    started = {name: lab("run", "--machine", machine, "--detach", *fields) for name, machine, fields in (
        ("busy", "hpc", run_fields(data, 200)), ("timed", "short", run_fields(data, 1_000_000, "--eval-every", "200")))}
    return {name: run_id_of(proc.stdout) for name, proc in started.items()}


def test_adding_a_cluster_reads_its_partition_and_measures_a_job(hpc, runs):
    out = hpc["added"]
    assert "Added cluster 'hpc' (slurm-login, partition spare)" in out
    assert "partition spare (up): 1 node(s), 4 CPUs and no cards each; time limit 01:00:00; jobs can be " \
           "preempted (REQUEUE)" in out
    assert "tok/s measured" in out
    check = json.loads((hpc["home"] / "machines" / "hpc" / "check.json").read_text())
    assert check["can_run"] is True and check["gpu"] == "cpu" and check["kind"] == "slurm"
    assert check["partition"]["preemptable"] is True and check["partition"]["max_time_s"] == 3600
    assert check["job"] and check["tok_s"] > 0
    assert hpc["slurm"].job(check["job"])["JobState"] == "COMPLETED"
    from lab.sizing.speeds import measured_runs
    assert [m.gpu for m in measured_runs() if m.run == "check:hpc"] == ["cpu"], "the calculator reads the burst"
    listing = here("machines")
    assert any(line.split()[:3] == ["hpc", "slurm", "cpu"] and "free (queue: starts in ~" in line
               for line in listing.splitlines()), listing  # its partition is down now: Slurm guesses when
    assert any(line.split()[:3] == ["short", "slurm", "unchecked"] and "queue: starts in ~0 min" in line
               and line.split()[-1] == "never" for line in listing.splitlines()), listing


def _driver_pid(home: Path, run_id: str) -> int:
    return json.loads((home / "runs" / run_id / "control.json").read_text())["pid"]


def _rows_at(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_a_run_waits_in_the_queue_is_requeued_while_the_control_side_is_away_and_goes_on_not_run_twice(hpc, runs):
    """The life of a run on a busy cluster: it waits with Slurm's reason; its job is requeued, as
    a preemption does, while no control process runs; the run goes on from the checkpoint saved
    at Slurm's signal in a new job, with no step lost or repeated, and trains to steps_until."""
    home, slurm, run_id = hpc["home"], hpc["slurm"], runs["busy"]
    from lab.api import runs as api_runs
    note = wait(lambda: (api_runs.status(run_id).live or {}).get("note_en"), about=lambda: told(home, run_id))
    assert "waits in the queue on cluster 'hpc' (slurm-login, partition spare): its partition is down " \
           "(PartitionDown)" in note
    assert api_runs.status(run_id).live["note_ru"].startswith("задача ")
    slurm.run("scontrol", "update", "PartitionName=spare", "State=UP")
    remote = hpc["workdir"] / "runs" / run_id / "001"
    wait(lambda: _rows_at(remote / "out" / "metrics.jsonl") >= 10, about=lambda: told(home, run_id))
    assert "job" in told(home, run_id) and "runs on labnode" in told(home, run_id)
    job = run_record(home, run_id)["links"][0]["detail"]["job"]
    os.kill(_driver_pid(home, run_id), signal.SIGKILL)  # the control side dies
    slurm.run("scontrol", "requeue", job)  # as a preemption does: SIGTERM, then back into the queue
    wait(lambda: (remote / "exit.json").is_file())  # the session saved at Slurm's SIGTERM and ended
    wait(lambda: slurm.job(job)["Reason"] == "BeginTime")  # back in the queue, held for two minutes
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")  # started now instead
    wait(lambda: (remote / "requeued.json").is_file(), about=lambda: slurm.job(job))  # its restart saw the marker
    wait(lambda: slurm.job(job)["JobState"] == "COMPLETED")
    out = here("watch", run_id, "-q")
    record = run_record(home, run_id)
    links = [(x["machine"], x["from_step"], x["to_step"], x["status"]) for x in record["links"]]
    saved = record["links"][0]["to_step"]
    assert links == [("hpc", 0, saved, "stopped"), ("hpc", saved, 200, "done")], out
    assert 10 <= saved < 200 and "preempted (Slurm requeued it)" in record["links"][0]["reason"]
    assert record["links"][0]["outcome"]["kind"] == "continue" and record["status"] == "done"
    folder = home / "runs" / run_id
    assert [r["step"] for r in rows_of(folder)] == list(range(1, 201)), "no step lost or repeated"
    log = (folder / "links" / "001-hpc" / "session.log").read_text()
    assert "started again (restart 1)" in log and log.count("step 1/200") == 1, "the run was not started twice"
    last = record["links"][-1]
    executed = json.loads((folder / last["notebook"]).read_text())
    assert any('"limit_min": 1.0' in "".join(c["source"]) for c in executed["cells"]), "the limit inside the job's"
    assert (folder / "loss.png").stat().st_size > 1000
    from lab.kernel.checkpoint import verify_checkpoint
    assert verify_checkpoint(folder / "checkpoints" / last["checkpoint"]["name"]) is None
    assert slurm.job(last["detail"]["job"])["JobState"] == "COMPLETED"
    assert last["detail"]["cleaned"] and not Path(last["detail"]["remote"]).exists(), "the cluster's folder removed"
    assert (hpc["workdir"] / "data").is_dir(), "the data stays on the cluster for the next runs"


def test_a_job_at_its_time_limit_goes_on_in_a_next_job_as_one_curve_and_a_cancel_saves_then_stops(hpc, runs):
    home, slurm, run_id = hpc["home"], hpc["slurm"], runs["timed"]

    def a_later_link_trains():
        links = run_record(home, run_id)["links"]
        live = home / "runs" / run_id / "links" / f"{len(links):03d}-short" / "live-metrics.jsonl"
        return len(links) >= 2 and links[-1]["status"] == "running" and _rows_at(live) > 5
    wait(a_later_link_trains, timeout_s=240, about=lambda: told(home, run_id))
    assert "saves a checkpoint and stops" in here("cancel", run_id)
    wait(lambda: run_record(home, run_id)["status"] == "cancelled" and not _driver_alive(run_id),
         about=lambda: told(home, run_id))
    links = run_record(home, run_id)["links"]
    *limited, last = links
    for link in limited:  # each job's time limit: the notebook's own inside it, or Slurm's signal before it
        assert link["limit_min"] == 0.5 and link["status"] == "stopped" and "time limit" in link["reason"], link
        assert link["outcome"]["kind"] == "continue" and link["to_step"] > link["from_step"]
        assert slurm.job(link["detail"]["job"])["JobState"] == "COMPLETED", "it ended before Slurm had to kill it"
    assert [x["from_step"] for x in links[1:]] == [x["to_step"] for x in links[:-1]], "each goes on where one stopped"
    assert last["status"] == "cancelled" and last["outcome"]["kind"] == "cancelled"
    assert "cancelled with lab cancel after saving at step" in last["reason"]
    step = last["to_step"]
    assert last["checkpoint"]["step"] == step > last["from_step"]
    from lab.kernel.checkpoint import verify_checkpoint
    assert verify_checkpoint(home / "runs" / run_id / "checkpoints" / last["checkpoint"]["name"]) is None
    assert [r["step"] for r in rows_of(home / "runs" / run_id)] == list(range(1, step + 1)), "one curve"
    assert slurm.job(last["detail"]["job"])["JobState"] in ("COMPLETED", "CANCELLED")


def _driver_alive(run_id: str) -> bool:
    from lab.machines.control import driver_alive
    return driver_alive(run_id)
