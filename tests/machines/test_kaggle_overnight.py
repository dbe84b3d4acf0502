"""The overnight run (issue 39): an Auto run across two accounts under what a CI that runs on Kaggle's T4s
every day saw the real service do (unslothai/unsloth; kaggle_emulator.overnight), the real training
notebook executed in the emulator's sandbox and the real `kaggle` client over HTTP. A session Kaggle loses
is deleted by the lab's watchdog and its quota comes back; error pages are passing answers; a push answered
with an error is read back before any other, so no link runs two sessions; a later link runs on the first
link's image. The run reaches its end as one curve, uploads nothing twice and shows no key."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from kaggle_fixtures import kaggle_settings, make_kaggle_emulator  # noqa: F401 (fixtures)

from lab import settle
from lab.corpus.manifests import data_id_of
from lab.kaggle.client import KaggleError
from lab.machines import driver
from lab.machines.control import set_control
from lab.machines.kaggle import names as kn
from lab.machines.kaggle.record import KaggleLinkRecord
from test_kaggle_runs import SETTINGS, losses, secrets_of, tiny

OVERNIGHT = replace(SETTINGS, unsure_wait_s=2.0)  # a push with no clear answer is read back for 2 s


@pytest.fixture
def overnight(pydoc_data, make_kaggle_emulator, tmp_path, monkeypatch):
    from kaggle_fixtures import driving, lab_for
    emu = make_kaggle_emulator(min_step_s=0.05)
    lab = lab_for(emu, tmp_path, monkeypatch)
    kaggle_settings(monkeypatch, OVERNIGHT)
    monkeypatch.setenv("LAB_WATCHDOG_SILENCE_MIN", "0.25")  # 15 s without a line or a step while RUNNING: lost
    with driving(lab, pydoc_data, monkeypatch) as lab:
        yield lab


def sessions_of(emu, user: str, run_id: str, n: int) -> list:
    """The sessions Kaggle ran for link `n` of the run on `user`, whatever slug each push used."""
    prefix = kn.kernel_slug(run_id, n)
    return [s for s in emu._sessions.values() if s.owner == user and (s.slug == prefix or s.slug.startswith(
        prefix + "-")) and (s.started_at is not None or s.launched_at is not None)]


def test_an_overnight_auto_run_survives_what_kaggle_did_to_a_daily_ci(overnight):
    emu, data = overnight.emu, overnight.data
    emu.set_quota("alice", total_s=22 * 60)  # a 12-minute link (12 wall seconds): then bob
    emu.set_quota("bob", total_s=60 * 3600)
    emu.error_pages("alice", for_s=600, status=503, methods=("SaveKernel",), count=1)  # the first push: a page
    emu.error_pages("alice", for_s=600, status=429, methods=("GetKernelSessionStatus",), count=3)
    emu.inject_faults("SaveKernel", 503, count=1, after=True)  # a later push: taken, then answered 503
    emu.show_kernels_late("bob", by_s=1.0)  # and its kernel unseen for a second
    emu.wedge_next_session("bob", once="checkpoints/ckpt_*.json")  # bob's first session: lost after its first save
    run = settle.register_run(tiny(data, steps_until=300, checkpoint_every_min=1.0).to_dict(), machine="auto")
    lines: list[str] = []
    before = emu.image
    final = _drive_with_new_image(run.id, emu, lines)
    assert final.status == "done" and final.step == 300, [(x.machine, x.status, x.reason) for x in final.links]
    assert sorted(losses(final.folder)) == list(range(1, 301)), "one curve"
    lost = [x for x in final.links if x.outcome.pass_over]
    assert len(lost) == 1 and lost[0].machine == "bob" and "the lab ended the session" in lost[0].reason, lines
    assert emu.charged_s("bob", KaggleLinkRecord.of(lost[0]).kernel.slug) == 0, "deleting it gave its time back"
    for link in final.links:  # no link ever ran two sessions
        assert len(sessions_of(emu, link.machine, run.id, link.n)) <= 1, link.n
    images = {s.image for s in emu._sessions.values() if s.started_at is not None}
    assert images == {before}, ("every link on the first link's image, though Kaggle's changed",
                                [(s.slug, s.image, s.started_at) for s in emu._sessions.values()],
                                [(x.n, x.machine, KaggleLinkRecord.of(x).image) for x in final.links], lines)
    data_slug = kn.data_slug(data_id_of(data))
    assert emu.dataset_versions("alice", data_slug) == [1] and emu.dataset_versions("bob", data_slug) == [1]
    assert any("error page" in line for line in lines), ("Kaggle's page said as what it is", lines)
    texts = [r["body"].get("text", "") for r in emu.recorded("SaveKernel")]
    texts += [(final.folder / "run.json").read_text(), (final.folder / "control.log").read_text()]
    for key in secrets_of(emu):
        assert not any(key in text for text in texts)


def _drive_with_new_image(run_id: str, emu, lines: list):
    """Drives the run; Kaggle's image changes as soon as the first link's session runs."""
    import threading
    import time

    def change():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(s.started_at for s in emu._sessions.values()):
            time.sleep(0.05)
        emu.new_image("gcr.io/kaggle-gpu-images/python:v161")
    threading.Thread(target=change, daemon=True).start()
    return driver.drive(run_id, say=lines.append, progress=False)


def test_the_person_may_ask_for_kaggles_newest_image(overnight):
    emu = overnight.emu
    run = settle.register_run(tiny(overnight.data, steps_until=5).to_dict(), machine="alice")
    set_control(run.id, kaggle_image="newest")
    emu.new_image("gcr.io/kaggle-gpu-images/python:v161")
    final = driver.drive(run.id, say=lambda s: None, progress=False)
    assert final.status == "done"
    assert all("dockerImage" not in r["body"] for r in emu.recorded("SaveKernel")), "no image pinned"


def test_a_push_answered_with_an_error_page_is_read_back_not_pushed_blind(overnight):
    """The page came before Kaggle acted: the kernel never shows, so after the read-back wait the link is
    pushed once more under a new name, and the first name is watched and deleted should it show late."""
    emu = overnight.emu
    emu.error_pages("alice", for_s=600, status=503, methods=("SaveKernel",), count=1)
    run = settle.register_run(tiny(overnight.data, steps_until=5).to_dict(), machine="alice")
    lines: list[str] = []
    final = driver.drive(run.id, say=lines.append, progress=False)
    assert final.status == "done", lines
    kernel = KaggleLinkRecord.of(final.links[0]).kernel
    assert kernel.tried == [f"alice/{kn.kernel_slug(run.id, 1)}"] and kernel.slug.endswith("-2"), kernel
    assert len([r for r in emu.recorded("SaveKernel") if r["status"] == 200]) == 1
    assert any("reads the kernel back" in line for line in lines) and any("503" in line for line in lines), lines


def test_a_push_taken_then_answered_503_is_followed_not_pushed_again(overnight):
    emu = overnight.emu
    emu.inject_faults("SaveKernel", 503, count=1, after=True)
    run = settle.register_run(tiny(overnight.data, steps_until=5).to_dict(), machine="alice")
    final = driver.drive(run.id, say=lambda s: None, progress=False)
    assert final.status == "done" and len(emu.recorded("SaveKernel")) == 1, "one push: its session followed"
    assert KaggleLinkRecord.of(final.links[0]).kernel.adopted


def test_a_datasets_new_version_refused_while_the_first_processes_waits_for_it(overnight, tmp_path):
    """kagglehub PR #182: a 403 for a new version while the first is still processing: waited for, sent again."""
    emu = overnight.emu
    emu.version_403_while_processing = True
    emu.dataset_ready_s = 1.0
    c = overnight.client("alice")
    folder = tmp_path / "up"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    assert c.upload_dataset("alice/lab-ckpt-version-test", folder, "lab-ckpt-version-test") == 1
    (folder / "a.txt").write_text("two")
    assert c.upload_dataset("alice/lab-ckpt-version-test", folder, "lab-ckpt-version-test", ready_wait_s=30) == 2
    assert [r["status"] for r in emu.recorded("CreateDatasetVersion")] == [403, 200]
    c.wait_dataset_ready("alice/lab-ckpt-version-test", timeout_s=30, poll_s=0.1)
    (folder / "a.txt").write_text("three")
    emu.set_dataset_behaviour("alice", "lab-ckpt-version-test", "stuck")  # version 3 never gets done
    c.upload_dataset("alice/lab-ckpt-version-test", folder, "lab-ckpt-version-test", ready_wait_s=30)
    (folder / "a.txt").write_text("four")
    with pytest.raises(KaggleError) as caught:  # still processing after the wait: the run goes elsewhere
        c.upload_dataset("alice/lab-ckpt-version-test", folder, "lab-ckpt-version-test", ready_wait_s=1)
    assert caught.value.cause == "processing"


def test_an_answer_the_client_cannot_read_is_retried_and_named_as_kaggles_page(overnight):
    emu = overnight.emu
    c = overnight.client("alice")
    emu.error_pages("alice", for_s=600, status=429, methods=("GetAcceleratorQuotaStatistics",), count=2)
    assert c.quota().total_s > 0, "two pages, then the answer: retried"
    emu.error_pages("alice", for_s=600, status=503, methods=("GetAcceleratorQuotaStatistics",))
    with pytest.raises(KaggleError) as caught:
        c.quota()
    e = caught.value
    assert e.retryable and e.cause == "unreadable" and "503 Service Unavailable" in str(e), str(e)
    assert "Expecting value" not in str(e)


def test_a_kernel_version_is_asked_as_v_n(overnight):
    """The API takes `v<N>` and answers 404 to a bare number (kaggle-cli#1200/#1201): the emulator does too."""
    emu = overnight.emu
    c = overnight.client("alice")
    from kaggle_fixtures import make_notebook
    c.push_kernel("alice/lab-version-label", "lab-version-label", make_notebook("print(1)"), gpu=False)
    emu.wait_session("alice", "lab-version-label")
    assert c.kernel_status("alice/lab-version-label", 1)[0] == "COMPLETE", "the client writes v1"
    status, reply, _ = emu.rpc("kernels.KernelsApiService", "GetKernelSessionStatus",
                               "Basic " + __import__("base64").b64encode(
                                   f"alice:{emu.account('alice').key}".encode()).decode(),
                               {"userName": "alice", "kernelSlug": "lab-version-label", "versionLabel": "1"})
    assert status == 404 and "v1" in json.dumps(reply)
