"""An Auto run across accounts under the quirks of issue 29 (kaggle_emulator.quirks), the real training
notebook executed in the emulator's sandbox and the real `kaggle` client over HTTP: nothing that can
pass halts it. It reaches `steps_until` as one curve, uploads nothing twice, shows no key, and says
what it waits for while it waits. The points that need only a push or a quota answer are tested on
the client, the host and the probe in tests/kaggle/test_kaggle_quirks.py.
"""
from __future__ import annotations

import json
import threading
import time

import pytest
from kaggle_fixtures import kaggle_settings, make_kaggle_emulator  # noqa: F401 (fixtures)

from lab import settle
from lab.api import accounts as api_accounts
from lab.api import runs as api_runs
from lab.corpus.manifests import data_id_of
from lab.kaggle import client as kc
from lab.machines import driver
from lab.machines.kaggle import host as km
from lab.machines.kaggle import names as kn
from lab.runs import End
from test_kaggle_runs import SETTINGS, losses, pushes, tiny

BOB_TOKEN = "KGAT_" + "0f1e2d3c" * 4


@pytest.fixture(autouse=True)
def fast_kaggle(monkeypatch):
    kaggle_settings(monkeypatch, SETTINGS)


@pytest.fixture
def quirky_lab(pydoc_data, make_kaggle_emulator, tmp_path, monkeypatch):
    """Three accounts on an emulator playing the quirks a run meets, all at once: carol, whose storage
    keeps no version whole; alice busy at her first pushes, her sessions running past the quota and
    reserving it; bob added from a kaggle.json whose key is a KGAT_ token, not verified (its GPU pushes
    run without a GPU), full with another member's two sessions, its data's file list lagging behind
    READY; empty drafts after refusals, and 401 for missing kernels."""
    from kaggle_fixtures import driving, lab_for
    emu = make_kaggle_emulator(min_step_s=0.05)
    lab = lab_for(emu, tmp_path, monkeypatch)
    kc.remove_account("bob")
    emu.add_account("bob", token=BOB_TOKEN)
    (lab.files / "bob.json").write_text(json.dumps({"username": "bob", "key": BOB_TOKEN}))
    assert api_accounts.add("bob", kaggle_json=lab.files / "bob.json").auth == "token"
    emu.shells_after_refusal, emu.missing_kernel_status, emu.quota_overrun, emu.reserve_running = True, 401, True, True
    emu.account("bob").gpu_allowed = False
    emu.listing_lag_s = 0.3
    emu.add_account("carol")
    kc.add_account("carol", kaggle_json=lab.kaggle_json("carol"))
    with driving(lab, pydoc_data, monkeypatch) as lab:
        yield lab


def watched(run_id: str, stop: threading.Event) -> list[tuple]:
    """What the run's status says while it waits: (waiting_for, waiting_until), each once."""
    seen: list[tuple] = []

    def look() -> None:
        while not stop.is_set():
            state = api_runs.status(run_id)
            if state.status == "waiting" and (state.waiting_for, state.waiting_until) not in seen:
                seen.append((state.waiting_for, state.waiting_until))
            time.sleep(0.05)
    threading.Thread(target=look, daemon=True).start()
    return seen


def test_an_auto_run_across_accounts_under_the_quirks_reaches_its_end_as_one_curve(quirky_lab):
    emu, data = quirky_lab.emu, quirky_lab.data
    emu.set_quota("alice", total_s=22 * 60)  # a 12-minute link (12 wall seconds): not the whole run
    emu.occupy("bob", 2)  # another member's runs fill bob: Auto must neither push there nor count it free
    emu.busy_spell("alice", for_s=8.0, retry_after_s=1.0, methods=("SaveKernel",), from_first_call=True)
    slug = kn.data_slug(data_id_of(data))
    emu.set_dataset_behaviour("bob", slug, "listing-lag")
    emu.set_dataset_behaviour("carol", slug, "drop-file")  # carol has the most quota: Auto tries her first
    run = settle.register_run(tiny(data, steps_until=200).to_dict(), machine="auto")
    released = threading.Thread(target=lambda: (_wait_for(lambda: pushes(emu, "alice")), emu.release("bob")))
    released.start()  # bob's other member is done once alice's session is under way
    stop, lines = threading.Event(), []
    seen = watched(run.id, stop)
    try:
        started = time.monotonic()
        final = driver.drive(run.id, say=lambda s: lines.append(f"{time.monotonic() - started:6.1f} {s}"),
                             progress=False)
    finally:
        stop.set()
        released.join(timeout=60)

    assert final.status == "done" and final.step == 200, lines
    ends = [(link.machine, link.outcome.kind) for link in final.links]
    assert ends[0] == ("carol", End.ELSEWHERE) and ends[-2:] == [("alice", End.CONTINUE), ("bob", End.CONTINUE)], ends
    assert "uploaded twice" in final.links[0].reason and emu.dataset_versions("carol", slug) == [2]
    assert not pushes(emu, "carol"), "passed over for the run: nothing more went to carol"
    busy = [link for link in final.links if link.outcome.kind is End.BUSY]
    assert busy and all(link.machine == "alice" and not link.outcome.session and link.outcome.until for link in busy)
    assert "RESOURCE_EXHAUSTED" in busy[0].reason
    assert sorted(losses(final.folder)) == list(range(1, 201)), "one curve"
    # What it waited for, said by the driver (`lab watch` prints these lines) and in the run's status.
    assert any("bob: busy with 2 GPU session(s): a session the lab did not start" in line
               and "The lab waits for the end of Kaggle's pause on alice" in line for line in lines), lines
    assert any(what and "Kaggle's pause on alice" in what and until for what, until in seen), seen
    # Nothing into the full account, nothing uploaded twice (bob's lagging list was read again, not re-sent).
    bob_pushes = [r for r in emu.recorded("SaveKernel") if r["user"] == "bob"]
    assert len(bob_pushes) == 1 and len(pushes(emu, "bob")) == 1
    assert emu.dataset_versions("alice", slug) == [1] and emu.dataset_versions("bob", slug) == [1]
    assert emu.dataset_versions("bob", kn.ckpt_slug(run.id)) == [1]
    assert {r["user"] for r in emu.recorded("CreateDatasetVersion")} == {"carol"}, "only carol's one more upload"
    assert any("listing it again" in line for line in lines), lines
    # bob signed in with its access token as a Bearer token, and ran its GPU push without a GPU.
    bob = emu.session("bob", kn.kernel_slug(run.id, final.links[-1].n))
    assert not bob.gpu and emu.account("bob").gpu_used_s == 0
    texts = [r["body"].get("text", "") for r in emu.recorded("SaveKernel")]
    texts += [(final.folder / "run.json").read_text(), (final.folder / "control.log").read_text(),
              str(api_runs.status(run.id))]
    for secret in (emu.account("alice").key, emu.account("carol").key, BOB_TOKEN):
        assert not any(secret in text for text in texts)


def _wait_for(condition, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_the_driver_waits_for_the_time_a_busy_machine_names_and_says_what_it_waits_for(pydoc_data, tmp_path,
                                                                                       monkeypatch):
    """Any machine's BUSY with `until`: the driver asks it again at that time, not before, and the run's
    status says what it waits for and until when meanwhile."""
    from datetime import datetime, timedelta, timezone

    from lab.config import RunConfig
    from lab.machines import registry
    from lab.runs import Outcome, updating
    from test_machines import card_kind
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAB_DRIVER_POLL_S", "0.05")
    card_kind(monkeypatch)
    host = registry.host_class("card")
    real_follow, asked = host.follow, []

    def follow(self, run, link, how):
        asked.append(time.monotonic())
        if len(asked) > 1:
            return real_follow(self, run, link, how)
        until = (datetime.now(timezone.utc) + timedelta(seconds=1.5)).isoformat(timespec="milliseconds")
        with updating(run.id) as r:  # the first answer: busy, ask again in 1.5 s
            ended = r.links[link.n - 1]
            ended.status, ended.outcome = "failed", Outcome(End.BUSY, "card: busy.", session=False, until=until)
        return ended
    monkeypatch.setattr(host, "follow", follow)
    run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=40).to_dict(), machine="card")
    stop, lines = threading.Event(), []
    seen = watched(run.id, stop)
    try:
        final = driver.drive(run.id, say=lines.append, progress=False)
    finally:
        stop.set()
    assert final.status == "done" and len(asked) == 2 and asked[1] - asked[0] >= 1.4, (asked, lines)
    assert any("card: busy. The lab waits for it and asks again at" in line for line in lines), lines
    assert any(what and what.startswith("the end of the pause card asked for") and until for what, until in seen), seen
