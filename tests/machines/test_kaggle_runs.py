"""Runs on Kaggle accounts, end to end: the real `kaggle` client against the emulator, the real
training notebook executed in its sandbox. A run longer than one account's quota continues on
the next; the control side survives being killed; each bad input stops the run clearly and
leaves it resumable.

Time: the emulator runs 60 emulated seconds per wall second (quota, session limits, and the
pushed notebook's own limit, which it rewrites: the kit sends real minutes). Where a test needs a
link to stop before the run's end, the emulator's card takes at least `min_step_s` per step, so
that holds on a fast machine as on a slow one. Tiny models, one CPU thread per session, status
polled every 0.2 s (every Kaggle host of these tests builds `SETTINGS`, or a test's own, instead of
the person's; the control side is killed at the kit's named fault points, lab.faults).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from kaggle_fixtures import (kaggle_emulator, kaggle_lab, kaggle_settings, lab_env, make_kaggle_emulator,  # noqa: F401
                             make_notebook)

from lab import faults, settle
from lab.config import RunConfig
from lab.kaggle.limits import KAGGLE_MARGIN_FLOOR_MIN
from lab.corpus.manifests import data_id_of
from lab.kaggle import sessions as kaggle_sessions
from lab.kernel.checkpoint import sha256_file
from lab.machines import control
from lab.api import runs as api_runs
from lab.machines import driver as machines
from lab.machines.kaggle import host as km
from lab.machines.kaggle import names as kn
from lab.machines.kaggle import data as kd
from lab.runs import End, load_run

TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=200, eval_batches=2, lr=3e-3,
            warmup_steps=2)
ALICE_QUOTA_S = 26 * 60  # a 16-minute link (16 wall seconds) after the 10-minute start-up: not the whole run
SETTINGS = kd.KaggleSettings(poll_s=0.2, retry_base_s=0.01, dataset_wait_s=20, input_wait_s=0.5, unsure_wait_s=1.0,
                             allow_cpu=True)


def tiny(data: Path, **kw) -> RunConfig:
    return RunConfig(**{**TINY, "data_dir": str(data), "constellations": ["pydoc"], **kw})


@pytest.fixture(autouse=True)
def fast_kaggle(monkeypatch):
    kaggle_settings(monkeypatch, SETTINGS)


def drive(run_id: str, lines: list | None = None):
    return machines.drive(run_id, say=(lines if lines is not None else []).append, progress=False)


def losses(folder: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@contextmanager
def one_thread():
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_losses(cfg: RunConfig, data: Path, out: Path) -> dict[int, float]:
    """The same run uninterrupted, in this process, on one thread like the sessions."""
    from lab.kernel.train import train
    with one_thread():
        train(RunConfig.from_dict({**cfg.to_dict(), "machine": "local"}), out, data, log=lambda s: None)
    return losses(out)


def pushes(emu, user: str | None = None) -> list[dict]:
    """SaveKernel requests Kaggle acted on (answered, or done with the reply lost)."""
    return [r for r in emu.recorded("SaveKernel") if (user is None or r["user"] == user)
            and (r["status"] == 200 or (r.get("fault") and r["status"] == 500))]



def secrets_of(emu) -> list[str]:
    return [emu.account(n).key for n in ("alice", "bob")]


# ---------------------------------------------------------------------------------------------
# The run across two accounts


@pytest.fixture
def paced_lab(pydoc_data, make_kaggle_emulator, tmp_path, monkeypatch):
    """`lab_env` on an emulator whose card takes at least 0.05 s a step: 300 steps cannot fit a
    link of a few wall seconds, however fast this machine is."""
    from kaggle_fixtures import driving, lab_for
    with driving(lab_for(make_kaggle_emulator(min_step_s=0.05), tmp_path, monkeypatch), pydoc_data, monkeypatch) as lab:
        yield lab


def test_a_run_longer_than_alices_quota_continues_on_bob_as_one_curve(paced_lab, tmp_path):
    lab_env = paced_lab
    emu, data = lab_env.emu, lab_env.data
    emu.set_quota("alice", total_s=ALICE_QUOTA_S)
    cfg = tiny(data, steps_until=400)
    # The first link where the person asked; then the Auto rule.
    run = settle.register_run(cfg.to_dict(), machine="alice")
    # A burst of 429s and 5xx on every call the run makes; one push whose reply is lost.
    for method, status, count in [("GetKernelSessionStatus", 429, 3), ("ListKernelSessionOutput", 503, 2),
                                  ("download", 500, 2), ("upload", 502, 2), ("StartBlobUpload", 429, 2),
                                  ("GetDatasetStatus", 504, 2), ("GetAcceleratorQuotaStatistics", 500, 2),
                                  ("CreateDataset", 503, 1), ("SaveKernel", 503, 2)]:
        emu.inject_faults(method, status, count, retry_after=0.05 if status == 429 else None)
    emu.inject_faults("SaveKernel", 500, 1, after=True)
    lines: list[str] = []
    final = drive(run.id, lines)

    assert final.status == "done", lines
    first, second = final.links
    assert (first.machine, first.status, first.reason) == ("alice", "stopped", "time limit")
    assert (second.machine, second.status, second.reason) == ("bob", "done", "steps_until reached")
    assert 0 < first.to_step == second.from_step < 400 and second.to_step == 400
    assert "its 30.0 h of GPU quota cover the whole run" in second.detail["why"]

    # One curve, bitwise the same as the run without a hand-off.
    ref = reference_losses(cfg, data, tmp_path / "reference")
    got = losses(final.folder)
    assert sorted(got) == list(range(1, 401))
    assert got == ref
    assert (final.folder / "loss.png").is_file() and (final.folder / "checkpoints" / "ckpt_00000400.pt").is_file()
    assert (final.folder / "links" / "001-alice" / "metrics.jsonl").is_file()
    # Its sessions ran on the emulator's CPU: the calculator's prediction for those cards sits beside
    # what they measured (the runs table's predicted column is no "-" for a Kaggle run).
    from lab.sizing.calibration import check as calibration
    assert calibration(final.folder) is not None and calibration(final.folder).gpu == "cpu"

    # The hand-off: the sha256 is the same at every hop, down to the file Kaggle stored for bob.
    out_ckpt = first.detail["output"]["checkpoint"]
    hop = second.detail["ckpt"]
    stored = emu.state_dir / "datasets" / "bob" / kn.ckpt_slug(run.id) / "v1" / out_ckpt["name"]
    downloaded = final.folder / first.detail["folder"] / "checkpoints" / out_ckpt["name"]
    assert out_ckpt["sha256"] == first.checkpoint["sha256"] == sha256_file(downloaded)
    assert hop["sha256_source"] == hop["sha256_staged"] == hop["sha256"] == out_ckpt["sha256"] == sha256_file(stored)

    # Nothing lost, nothing done twice: one session per link, the data once per account.
    assert len(pushes(emu)) == 2 and first.detail["kernel"].get("adopted")  # its reply was lost
    # Two pushes answered 503 were read back (not there: never done) before another was sent, by a new name.
    assert first.detail["kernel"]["tried"] == [f"alice/{kn.kernel_slug(run.id, 1, a)}" for a in (1, 2)]
    assert emu.kernel_versions("alice", kn.kernel_slug(run.id, 1, 3)) == [1]
    assert emu.kernel_versions("bob", kn.kernel_slug(run.id, 2)) == [1]
    data_slug = kn.data_slug(data_id_of(data))
    assert emu.dataset_versions("alice", data_slug) == [1] and emu.dataset_versions("bob", data_slug) == [1]
    assert emu.dataset_versions("bob", kn.ckpt_slug(run.id)) == [1]
    assert emu.recorded("CreateDatasetVersion") == []

    # The push as sent: shape, privacy, GPU, sources, size, and no secret in it.
    sent = [r for r in emu.recorded("SaveKernel") if r["user"] == "bob" and r["status"] == 200][0]["body"]
    assert (sent["machineShape"], sent["enableGpu"], sent["isPrivate"], sent["enableInternet"]) == (
        "NvidiaTeslaT4", True, True, False)
    assert sent["datasetDataSources"] == [f"bob/{data_slug}", f"bob/{kn.ckpt_slug(run.id)}"]
    assert sent["sessionTimeoutSeconds"] == (630 + 10) * 60 and sent["slug"] == f"bob/{kn.kernel_slug(run.id, 2)}"
    assert len(sent["text"].encode()) < 1_000_000
    params = "".join(c["source"] for c in json.loads(sent["text"])["cells"]
                     if "injected-parameters" in c["metadata"].get("tags", []))
    assert f'"resume_from": "{kn.ckpt_slug(run.id)}"' in params and '"data_dir": ""' in params
    first_sent = [r for r in emu.recorded("SaveKernel") if r["user"] == "alice" and r.get("status") == 500][0]["body"]
    assert first_sent["sessionTimeoutSeconds"] == (16 + 10) * 60  # the link's limit fits alice's quota
    for key in secrets_of(emu):
        for text in (sent["text"], first_sent["text"], (final.folder / "run.json").read_text(),
                     (final.folder / "control.log").read_text(), str(api_runs.status(run.id))):
            assert key not in text
    state = api_runs.status(run.id)
    assert state.status == "done" and "steps_until reached" in state.log_tail

    # Pushed on the image Kaggle runs now, told to check its cards (and, on the emulator, allowed the CPU).
    assert sent["dockerImagePinningType"] == "latest"
    assert '"expect_cards": "2xT4"' in params and '"allow_cpu": true' in params.lower() and '"nccl_env": {}' in params
    # Only documented licence names go up, and the upload says which was sent (pydoc: the PSF's terms).
    assert {r["body"]["licenseName"] for r in emu.recorded("CreateDataset")} == {"other"}
    assert any('licence sent as "other": Kaggle documents no name for' in line for line in lines), lines
    # Each link records the image it ran and what its session measured; the account keeps them.
    for link in final.links:
        device = json.loads((final.folder / link.detail["folder"] / "device.json").read_text())
        assert device["image"]["git_commit"] == "v160" and device["image"]["python"] == sys.version.split()[0]
        assert device["image"]["torch"] and device["cards_found"] == []
        seen = link.detail["measured"]
        assert seen["boot_s"] > 0 and seen["data_checks_s"] >= 0 and seen["output_copy_s"] is not None
        assert seen["first_step_s"] > 0 and seen["final_save_s"] > 0
        # As the watch saw it: COMPLETE, or ERROR when the quota ran out after the notebook's own end.
        assert seen["ended"]["status"] == link.detail["kaggle_status"] and seen["ended"]["outputs"]
        assert not seen["ended"]["cut_off"], "the notebook ended by itself"
        assert seen["ended"]["timeout_s"] == link.detail["session_timeout_s"] and "compile_s" in seen
    assert kaggle_sessions.session_overheads("alice")["sessions"] == 1
    assert kaggle_sessions.push_margin_min("bob") == KAGGLE_MARGIN_FLOOR_MIN, "the emulator's boot is seconds"


# ---------------------------------------------------------------------------------------------
# The control side killed mid-run


class Crash(BaseException):
    """The control side dying at a crash point: nothing after it runs, as with a kill."""


def test_killing_the_control_side_anywhere_neither_loses_nor_repeats_anything(paced_lab):
    emu, data = paced_lab.emu, paced_lab.data
    emu.set_quota("alice", total_s=22 * 60)  # a short first link: this test is about the hand-off
    run_id = settle.register_run(tiny(data, steps_until=300).to_dict(), machine="alice").id
    control.spawn_driver(run_id)  # a background process drives it
    wait_for(lambda: load_run(run_id).links and load_run(run_id).links[0].detail.get("kernel", {}).get("pushed_at"),
             what="the first push")
    driver = control.spawned[run_id]
    os.kill(driver.pid, signal.SIGKILL)  # the watcher killed right after the push
    driver.wait(timeout=30)
    assert not control.driver_alive(run_id) and "lab watch" in api_runs.status(run_id).message

    def crash(point: str) -> None:
        raise Crash(point)

    # It dies again after bob's copy of the checkpoint was uploaded, before that was recorded...
    with pytest.raises(Crash), faults.at("after-checkpoints-upload", crash):
        drive(run_id)
    assert emu.dataset_versions("bob", kn.ckpt_slug(run_id)) == [1]
    assert load_run(run_id).links[1].detail.get("ckpt") is None
    # ...then after bob's push was sent, before its reply was recorded...
    with pytest.raises(Crash), faults.at("after-push", crash):
        drive(run_id)
    assert emu.kernel_versions("bob", kn.kernel_slug(run_id, 2)) == [1]
    assert not load_run(run_id).links[1].detail["kernel"].get("pushed_at")
    # ...and `lab watch` finishes the run.
    done = subprocess.run([sys.executable, "-m", "lab.cli", "watch", run_id, "-q"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    final = load_run(run_id)
    assert final.status == "done" and [link.machine for link in final.links] == ["alice", "bob"]
    assert [r["body"]["slug"] for r in pushes(emu)] == [f"alice/{kn.kernel_slug(run_id, 1)}",
                                                        f"bob/{kn.kernel_slug(run_id, 2)}"]
    assert emu.dataset_versions("bob", kn.ckpt_slug(run_id)) == [1], "the lost upload was found, not repeated"
    assert final.links[1].detail["ckpt"].get("adopted") and final.links[1].detail["kernel"].get("adopted")
    assert sorted(losses(final.folder)) == list(range(1, 301))


# ---------------------------------------------------------------------------------------------
# Bad input: each stops the run with a message naming the account and what to do


def test_credentials_refused_mid_run_stop_it_before_any_push(lab_env):
    emu = lab_env.emu
    run = settle.register_run(tiny(lab_env.data, steps_until=5).to_dict(), machine="alice")
    emu.inject_faults("StartBlobUpload", 401, 1)  # the key was revoked after the run was checked
    final = drive(run.id)
    message = api_runs.status(run.id).message
    assert final.status == "failed" and final.links[0].status == "failed"
    assert "Kaggle account 'alice'" in message and "lab accounts add alice" in message
    assert f"lab watch {run.id}" in message
    assert pushes(emu) == []


def test_a_push_refused_at_the_session_limit_waits_for_a_picked_account_or_moves_on(lab_env):
    emu, data = lab_env.emu, lab_env.data
    busy = "Maximum batch GPU session count of 2 reached."
    emu.fail_next_push("alice", busy)
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="alice")
    lines: list[str] = []
    final = drive(run.id, lines)  # the picked account: the lab waits for it and asks again, not fails
    assert final.status == "done", lines
    assert [(link.machine, link.status) for link in final.links] == [("alice", "failed"), ("alice", "done")]
    assert any(busy in line and "Kaggle account 'alice'" in line and "waits for it and asks again" in line
               for line in lines), lines
    assert final.links[0].detail["kernel"]["refused"] and emu.kernel_versions("alice", kn.kernel_slug(run.id, 1)) == []
    assert kd.held("alice", "data", data_id_of(data))["ready"], "the upload is kept for the next try"
    assert len(emu.dataset_versions("alice", kn.data_slug(data_id_of(data)))) == 1, "the data went up once"

    # With Auto, the lab moves on to the next free account.
    emu.set_quota("bob", total_s=30 * 3600, used_s=29 * 3600)  # so Auto tries alice (most quota) first
    emu.fail_next_push("alice", busy)
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="auto")
    lines: list[str] = []
    final = drive(run.id, lines)
    assert final.status == "done", lines
    assert [(link.machine, link.status) for link in final.links] == [("alice", "failed"), ("bob", "done")]
    assert any(busy in line and "tries another machine" in line for line in lines)


def test_a_push_with_no_clear_answer_is_not_pushed_again_until_kaggle_is_asked(lab_env):
    emu, data = lab_env.emu, lab_env.data
    emu.inject_faults("SaveKernel", 500, 1)  # an error answer, and Kaggle did not take it
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="alice")
    slug = kn.kernel_slug(run.id, 1)
    final = drive(run.id)
    assert final.status == "done" and [link.status for link in final.links] == ["done"]
    calls = [(r["method"], r["body"].get("kernelSlug") or r["body"].get("slug", "").split("/")[-1])
             for r in emu.recorded() if r["method"] in ("SaveKernel", "GetKernelSessionStatus")]
    second = calls.index(("SaveKernel", kn.kernel_slug(run.id, 1, 2)))
    assert ("GetKernelSessionStatus", slug) in calls[1:second], "Kaggle was asked before any second push"
    assert emu.kernel_versions("alice", slug) == [] and final.links[0].detail["kernel"]["tried"] == [f"alice/{slug}"]


def test_a_session_kaggle_ran_without_its_data_trains_nothing_and_the_data_goes_up_again(lab_env):
    emu, data = lab_env.emu, lab_env.data
    emu.drop_sources_next_push("alice")
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="alice")
    lines: list[str] = []
    final = drive(run.id, lines)
    slug = f"alice/{kn.data_slug(data_id_of(data))}"
    assert any("without these sources" in line and slug in line for line in lines), lines
    assert final.status == "done" and [link.status for link in final.links] == ["failed", "done"]
    first = final.links[0]
    assert first.outcome.kind is End.PUSH_AGAIN and first.detail["kernel"]["dropped_sources"] == [slug]
    assert not (final.folder / first.detail["folder"] / "metrics.jsonl").exists(), "it trained nothing"
    # What Kaggle lost went up again, as a version that replaced the old one (storage holds one copy).
    assert emu.dataset_versions("alice", kn.data_slug(data_id_of(data))) == [2]
    assert len(pushes(emu)) == 2


def test_quota_exhausted_everywhere_waits_for_the_earliest_refresh_and_says_so(lab_env):
    emu = lab_env.emu
    refresh = datetime.now(timezone.utc) + timedelta(seconds=4)
    emu.set_quota("alice", used_s=30 * 3600, refresh_time=refresh)
    emu.set_quota("bob", used_s=30 * 3600)
    run = settle.register_run(tiny(lab_env.data, steps_until=5).to_dict(), machine="auto")
    result: dict = {}
    driver = threading.Thread(target=lambda: result.update(final=drive(run.id)))
    driver.start()
    wait_for(lambda: api_runs.status(run.id).status == "waiting", 30, "the waiting state")
    state = api_runs.status(run.id)
    assert "alice: 0.0 h of quota left" in state.message and "bob: 0.0 h of quota left" in state.message
    assert "waits for the earliest quota refresh" in state.message and "обновления квоты" in state.message_ru
    assert abs(datetime.fromisoformat(state.waiting_until) - refresh) < timedelta(seconds=1)
    assert state.driver and pushes(emu) == []
    driver.join(timeout=120)
    assert result["final"].status == "done" and [link.machine for link in result["final"].links] == ["alice"]


def test_a_dataset_that_never_gets_ready_stops_the_run_and_the_retry_uploads_nothing_twice(lab_env, monkeypatch):
    emu, data = lab_env.emu, lab_env.data
    slug = kn.data_slug(data_id_of(data))
    emu.set_dataset_behaviour("alice", slug, "stuck")
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="alice")
    kaggle_settings(monkeypatch, kd.KaggleSettings(poll_s=0.2, retry_base_s=0.01, dataset_wait_s=1, allow_cpu=True))
    final = drive(run.id)
    message = api_runs.status(run.id).message
    assert final.status == "failed" and pushes(emu) == []
    assert f"Kaggle account 'alice': dataset alice/{slug} is still" in message
    assert f"`lab watch {run.id}` waits for it again without uploading it twice" in message

    emu.set_dataset_behaviour("alice", slug, None)  # Kaggle catches up
    kaggle_settings(monkeypatch, SETTINGS)
    final = drive(run.id)
    assert final.status == "done" and [link.status for link in final.links] == ["failed", "done"]
    assert emu.dataset_versions("alice", slug) == [1] and len(emu.recorded("CreateDataset")) == 1


def test_a_kernel_ending_in_error_twice_stops_the_run_with_its_log(lab_env, monkeypatch):
    failing = make_notebook("raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')")
    import lab.notebooks
    monkeypatch.setattr(lab.notebooks, "link_notebook", lambda spec: failing)
    run = settle.register_run(tiny(lab_env.data, steps_until=5).to_dict(), machine="alice")
    lines: list[str] = []
    final = drive(run.id, lines)
    message = api_runs.status(run.id).message
    assert final.status == "failed" and [link.status for link in final.links] == ["failed", "failed"]
    assert any("only that session is lost" in line for line in lines), "the first failure costs only its session"
    assert "Kaggle account 'alice': the session ended ERROR" in message and f"lab watch {run.id}" in message
    log = final.folder / "links" / "002-alice" / f"{kn.kernel_slug(run.id, 2)}.log"
    assert log.is_file() and "CUDA out of memory" in log.read_text() and str(log.relative_to(final.folder)) in message
    assert "CUDA out of memory" in api_runs.status(run.id).log_tail
    assert len(pushes(lab_env.emu)) == 2 and final.links[1].to_step is None


def test_cancel_ends_the_kaggle_session_by_deleting_its_kernel_and_starts_no_further_link(lab_env):
    emu = lab_env.emu
    run_id = settle.register_run(tiny(lab_env.data, steps_until=100_000).to_dict(), machine="alice").id
    control.spawn_driver(run_id)
    wait_for(lambda: (load_run(run_id).links or [None])[0] is not None
             and load_run(run_id).links[0].detail.get("kaggle_status") == "RUNNING", what="the session to run")
    slug = kn.kernel_slug(run_id, 1)
    log = emu.session("alice", slug).root.parent / "log.txt"
    wait_for(lambda: log.is_file() and "step 1/" in log.read_text(), what="training to start")
    from conftest import lab_here
    code, _, err = lab_here("cancel", run_id)  # not at a terminal: the person confirms with --yes
    assert code == 2 and "a cancel deletes its kernel" in err and "--yes" in err
    assert not api_runs.status(run_id).cancel_requested, "nothing cancelled unasked"
    code, said, _ = lab_here("cancel", run_id, "--yes")
    assert code == 0 and f"alice/{slug}" in said and "deleted" in said and "is lost" in said, said
    control.spawned[run_id].wait(timeout=60)
    final = load_run(run_id)
    assert final.status == "cancelled" and final.links[0].status == "cancelled", final.links[0].reason
    assert emu.kernel_versions("alice", slug) == [], "its kernel was deleted: that ends a Kaggle session"
    assert emu.charged_s("alice", slug) == 0, "and gives its time back"
    assert len(pushes(emu)) == 1 and api_runs.status(run_id).cancel_requested


# ---------------------------------------------------------------------------------------------
# Kaggle as it may really be: the emulator plays each unfriendly answer, and a run still
# continues from alice to bob as one curve, uploads nothing twice and shows no key.


def unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch, **behaviour):
    from kaggle_fixtures import fast_driving, lab_for
    lab = lab_for(make_kaggle_emulator(min_step_s=0.05, **behaviour), tmp_path, monkeypatch)
    fast_driving(monkeypatch)
    lab.data = pydoc_data
    return lab


def continues_on_bob(lab, steps_until: int = 200, links: int | None = 2, lines: list | None = None):
    """Drives a run that starts on alice (a short link) and ends on bob; checks what must hold
    under any behaviour of the service, and returns the final run."""
    emu, data = lab.emu, lab.data
    emu.set_quota("alice", total_s=22 * 60)  # a 12-minute link (12 wall seconds): not the whole run
    run = settle.register_run(tiny(data, steps_until=steps_until).to_dict(), machine="alice")
    lines = [] if lines is None else lines
    final = drive(run.id, lines)
    assert final.status == "done" and final.step == steps_until, lines
    assert final.links[0].machine == "alice" and final.links[-1].machine == "bob" and len(final.links) == (
        links or len(final.links)), \
        [(link.machine, link.status, link.reason) for link in final.links]
    assert sorted(losses(final.folder)) == list(range(1, steps_until + 1)), "one curve"
    data_slug = kn.data_slug(data_id_of(data))
    assert emu.dataset_versions("alice", data_slug) == [1] and emu.dataset_versions("bob", data_slug) == [1]
    assert emu.dataset_versions("bob", kn.ckpt_slug(run.id)) == [1], "the hand-off went up once"
    texts = [r["body"].get("text", "") for r in emu.recorded("SaveKernel")]
    texts += [(final.folder / "run.json").read_text(), (final.folder / "control.log").read_text(),
              str(api_runs.status(run.id))]
    for key in secrets_of(emu):
        assert not any(key in text for text in texts)
    return final


def test_403_for_missing_datasets_lags_429_bursts_and_the_old_input_layout(make_kaggle_emulator, pydoc_data,
                                                                          tmp_path, monkeypatch):
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch, missing_status=403,
                         dataset_visible_s=1.0, dataset_ready_s=1.5, input_layout="old")
    for method in ("GetKernelSessionStatus", "GetDatasetStatus", "StartBlobUpload", "SaveKernel"):
        lab.emu.inject_faults(method, 429, 3, retry_after=0.05)
    continues_on_bob(lab)
    statuses = {r["status"] for r in lab.emu.recorded("GetDatasetStatus")}
    assert 403 in statuses and 429 in statuses, "the emulator did play them"


def test_a_session_killed_with_its_outputs_lost_costs_only_that_session(make_kaggle_emulator, pydoc_data, tmp_path,
                                                                       monkeypatch):
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch)
    # 4 wall seconds in, Kaggle's cut-off: CANCEL_ACKNOWLEDGED with no outputs, log or reason, and an
    # output listing that answers 403. The kit did not ask: it is no cancel, only that session is lost.
    lab.emu.kill_next_session("alice", after_s=4 * 60, status="CANCEL_ACKNOWLEDGED", listing_status=403)
    lines: list[str] = []
    final = continues_on_bob(lab, links=None, lines=lines)
    lost = final.links[0]
    assert lost.status == "failed" and lost.to_step is None and lost.outcome.kind is End.LOST
    assert "CANCEL_ACKNOWLEDGED" in lost.reason and "HTTP 403" in lost.reason and "without being asked" in lost.reason
    assert final.links[1].from_step == 0, "the run went on from step 0"
    assert any("only that session is lost" in line for line in lines), lines
    ended = lost.detail["measured"]["ended"]
    assert ended["cut_off"] and not ended["outputs"] and ended["status"] == "CANCEL_ACKNOWLEDGED"
    cut = kaggle_sessions.last_cut_off("alice")
    assert cut["run"] == final.id and "outputs lost" in kaggle_sessions.seen_line("alice")


def test_ready_before_mounted_is_waited_out_and_never_resumes_from_another_checkpoint(make_kaggle_emulator,
                                                                                     pydoc_data, tmp_path,
                                                                                     monkeypatch):
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch)
    real_register = settle.register_run

    def register(given, *args, **kwargs):  # bob's hand-off is READY two seconds before it can be mounted
        run = real_register(given, *args, **kwargs)
        lab.emu.set_dataset_behaviour("bob", kn.ckpt_slug(run.id), "mount-lag")
        return run
    monkeypatch.setattr(settle, "register_run", register)
    final = continues_on_bob(lab, links=None)
    alice, waited, bob = final.links[0], final.links[1], final.links[-1]
    assert alice.status == "stopped" and alice.to_step > 0
    assert waited.machine == "bob" and waited.status == "failed" and waited.outcome.kind is End.PUSH_AGAIN
    assert waited.to_step is None and not (final.folder / waited.detail["folder"] / "metrics.jsonl").exists(), \
        "it stopped before training"
    assert (final.folder / waited.detail["folder"] / "input-not-ready.json").is_file()
    assert bob.from_step == alice.to_step, "bob resumed from alice's checkpoint once mounted, never from 0"


def test_a_session_refused_for_quota_at_its_start_moves_the_run_to_the_next_account(make_kaggle_emulator,
                                                                                   pydoc_data, tmp_path,
                                                                                   monkeypatch):
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch, quota_at_push=False, queue_s=1.0)
    emu = lab.emu
    run = settle.register_run(tiny(lab.data, steps_until=20).to_dict(), machine="auto")
    emu.set_quota("bob", total_s=30 * 3600, used_s=20 * 3600)  # Auto tries alice (most quota) first
    spent = threading.Thread(target=lambda: (wait_for(lambda: pushes(emu, "alice"), 60, "alice's push"),
                                             emu.set_quota("alice", used_s=30 * 3600)))
    spent.start()  # alice's quota goes elsewhere between her push and her session's start
    lines: list[str] = []
    final = drive(run.id, lines)
    spent.join(timeout=60)
    assert final.status == "done", lines
    assert [(link.machine, link.status) for link in final.links] == [("alice", "failed"), ("bob", "done")]
    assert final.links[0].outcome.kind is End.NO_QUOTA and not final.links[0].detail.get("ran")
    assert any("quota is spent" in line and "tries another machine" in line for line in lines), lines


def test_a_session_kaggle_lost_is_deleted_past_its_limit_and_its_quota_comes_back(make_kaggle_emulator, pydoc_data,
                                                                                 tmp_path, monkeypatch):
    """unsloth's CI saw a kernel whose notebook crashed sit in RUNNING for hours past its timeout, stopped
    only by a delete, which took the account's used hours down: the lab's watchdog deletes it."""
    import time

    from lab.machines.base import Follow
    from lab.runs import updating
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch, enforce_timeout=False)
    lab.emu.wedge_next_session("alice", after_s=0)  # its notebook dies at once; Kaggle says RUNNING for ever
    monkeypatch.setenv("LAB_WATCHDOG_MARGIN_MIN", "0.05")  # 3 s past its own limit
    monkeypatch.setenv("LAB_WATCHDOG_SILENCE_MIN", "600")  # (the silence rule has its own test)
    run = settle.register_run(tiny(lab.data, steps_until=100_000).to_dict(), machine="alice")
    link = km.plan_link(run.id, "alice", 30 * 3600, None, "test")
    with updating(run.id) as r:  # a link of 3 s with no margin of its own: the watchdog's margin decides
        r.links[0].limit_min, r.links[0].detail["margin_min"] = 0.05, 0.0
    lines: list[str] = []
    began = time.monotonic()
    ended = km.KaggleHost("alice").follow(load_run(run.id), link, Follow(lines.append, lambda: False))
    slug = kn.kernel_slug(run.id, 1)
    assert ended.outcome.kind is End.LOST and ended.outcome.pass_over, ended.reason
    assert "the lab ended the session" in ended.reason and "past its own limit" in ended.reason
    assert time.monotonic() - began < 3 + 3 + 20, "deleted within its limit plus the watchdog's margin (and a poll)"
    assert lab.emu.kernel_versions("alice", slug) == [] and lab.emu.charged_s("alice", slug) == 0
    assert lab.emu.account("alice").gpu_used_s < 60, "the account's quota shows the time given back"


def test_a_session_cut_off_after_a_save_is_a_link_that_ended_and_the_run_goes_on(make_kaggle_emulator, pydoc_data,
                                                                                 tmp_path, monkeypatch):
    lab = unfriendly_lab(make_kaggle_emulator, pydoc_data, tmp_path, monkeypatch)
    # Cut off after its first save, as Kaggle's runtime limit does it (CANCEL_ACKNOWLEDGED, no reason),
    # with what it saved kept: a session that ended, not a cancel (the kit did not ask).
    lab.emu.kill_next_session("alice", once="checkpoints/ckpt_*.json", lose_outputs=False, status="CANCEL_ACKNOWLEDGED")
    run = settle.register_run(tiny(lab.data, steps_until=400, checkpoint_every_min=1.0).to_dict(), machine="alice")
    lines: list[str] = []
    final = drive(run.id, lines)
    assert final.status == "done", lines
    killed = final.links[0]
    assert killed.detail["kaggle_status"] == "CANCEL_ACKNOWLEDGED" and not killed.detail.get("cancel_requested")
    assert killed.status == "stopped" and killed.to_step > 0 and killed.outcome.kind is End.CONTINUE
    assert "the run goes on from its checkpoint" in killed.reason and "without being asked" in killed.reason
    assert final.links[1].from_step == killed.to_step and sorted(losses(final.folder)) == list(range(1, 401))
    ended = killed.detail["measured"]["ended"]
    assert ended["cut_off"] and ended["outputs"], "the first cut-off tells whether outputs survive it"
    assert "cut off by Kaggle" in kaggle_sessions.seen_line("alice") and "outputs kept" in kaggle_sessions.seen_line(
        "alice")


def test_a_session_without_its_cards_stops_before_training_and_the_account_is_marked(lab_env, monkeypatch):
    from dataclasses import replace

    from lab.kaggle.probed import cannot_run, read_probe
    # The person's setting unset: a session without GPU T4 x2 must not train on its CPU. The
    # emulator's sessions have no GPU at all, so each account in turn is found unable.
    monkeypatch.delenv("LAB_KAGGLE_ALLOW_CPU", raising=False)
    kaggle_settings(monkeypatch, replace(SETTINGS, allow_cpu=False))
    run = settle.register_run(tiny(lab_env.data, steps_until=5).to_dict(), machine="auto")
    lines: list[str] = []
    final = drive(run.id, lines)
    assert final.status == "failed" and [link.outcome.kind for link in final.links] == [End.UNFIT, End.UNFIT]
    assert {link.machine for link in final.links} == {"alice", "bob"}, "the run moved on to the other account"
    first = final.links[0]
    folder = final.folder / first.detail["folder"]
    assert json.loads((folder / "no-gpu.json").read_text())["expected"] == "2xT4"
    assert not (folder / "metrics.jsonl").exists() and final.step == 0, "it stopped before training"
    assert "phone" in first.reason and f"lab probe {first.machine}" in first.reason
    assert any("continues the run on another machine" in line for line in lines), lines
    for name in ("alice", "bob"):  # marked as a failed probe would: the Auto rule passes them over
        record = read_probe(name)
        assert record["can_run"] is False and record["seen_in"].startswith(f"run {run.id} link")
        assert cannot_run(record) and f"lab probe {name}" in cannot_run(record)
    message = api_runs.status(run.id).message
    assert "No Kaggle account can take the run" in message and "cannot run GPU sessions" in message
    assert pushes(lab_env.emu) and len(pushes(lab_env.emu)) == 2


def test_a_kernel_kaggle_never_starts_is_given_up_with_the_time_it_waited(lab_env, monkeypatch):
    from dataclasses import replace
    lab_env.emu.hold_next_session("alice", "NEW_SCRIPT")
    kaggle_settings(monkeypatch, replace(SETTINGS, start_wait_s=1.0))
    run = settle.register_run(tiny(lab_env.data, steps_until=5).to_dict(), machine="alice")
    final = drive(run.id)
    message = api_runs.status(run.id).message
    assert final.status == "failed" and final.links[0].detail["kaggle_status"] == "NEW_SCRIPT"
    assert "still reads NEW_SCRIPT 0 min after its push" in message and "has not started it" in message
    assert f"`lab cancel {run.id}` (it deletes the kernel" in message and f"lab watch {run.id}" in message
    assert len(pushes(lab_env.emu)) == 1


def test_a_version_that_does_not_hold_the_files_sent_is_caught_before_any_push(lab_env):
    emu, data = lab_env.emu, lab_env.data
    slug = kn.data_slug(data_id_of(data))
    emu.set_dataset_behaviour("alice", slug, "drop-file")  # Kaggle keeps all but the largest file, silently
    run = settle.register_run(tiny(data, steps_until=5).to_dict(), machine="alice")
    final = drive(run.id)
    message = api_runs.status(run.id).message
    assert final.status == "failed" and pushes(emu) == []
    # Listed again after waits, uploaded once more by itself, listed again: then the account is passed
    # over for the run, and with alice picked and no session run yet, the run stops and says why.
    assert final.links[0].outcome.kind is End.ELSEWHERE
    assert f"version 2 of dataset alice/{slug} does not hold what was sent (missing pydoc__" in message
    assert "uploaded twice" in message and "kaggle-cli#284" in message and "passed over for this run" in message
    assert kd.held("alice", "data", data_id_of(data)) is None, "forgotten: the next try uploads it again"
    assert emu.recorded("ListDatasetFiles")[0]["body"]["datasetVersionNumber"] == 1
    assert emu.dataset_versions("alice", slug) == [2] and len(emu.recorded("ListDatasetFiles")) == 8


def test_the_next_push_sizes_its_margin_from_the_accounts_sessions_never_below_the_floor(kaggle_lab):
    from conftest import lab

    from lab.kaggle.limits import KAGGLE_LIMIT_MAX_MIN, limit_problems
    from lab.runs import Settled, create_run
    run = create_run(Settled.whole(RunConfig(limit_min=630, constellations=["pydoc"])))
    # Seconds-long sessions (the emulator's): the floor.
    km.plan_link(run.id, "alice", 30 * 3600, None)
    assert load_run(run.id).links[0].detail["session_timeout_s"] == (630 + KAGGLE_MARGIN_FLOOR_MIN) * 60
    # Sessions that took 14 min from push to first cell and 3 min to copy their outputs.
    for n in (1, 2, 3):
        kaggle_sessions.record_session("alice", "earlier", n, "2026-12-01T10:00:00+00:00", {
            "boot_s": 14 * 60 + n, "output_copy_s": 180.0, "overrun_s": 30.0,
            "ended": {"status": "COMPLETE", "outputs": True, "cut_off": False}})
    seen = kaggle_sessions.session_overheads("alice")
    assert seen["sessions"] == 3 and seen["boot_s"] == 14 * 60 + 2 and seen["margin_min"] == 19.5
    planned = km.plan_link(run.id, "alice", 30 * 3600, None)
    assert planned.detail["session_timeout_s"] == int((630 + 19.5) * 60) and planned.limit_min == 630
    # A limit near the 12 hours: the timeout stays below Kaggle's maximum and the link's limit gives way.
    run = create_run(Settled.whole(RunConfig(limit_min=709, constellations=["pydoc"])))
    planned = km.plan_link(run.id, "alice", 30 * 3600, None)
    assert planned.detail["session_timeout_s"] < 12 * 3600 and planned.limit_min == 719 - 19.5
    # A run whose limit leaves no room for the floor is refused, with what to use.
    [problem] = [p for p in limit_problems(RunConfig(limit_min=KAGGLE_LIMIT_MAX_MIN + 1)) if p.field == "limit_min"]
    assert problem.severity == "error" and "leaves no room" in problem.en and "709" in problem.en
    shown = lab("accounts", "--offline").stdout
    assert "Sessions seen" in shown and "alice: 3 session(s) measured" in shown and "19.5 min beyond its limit" in shown
