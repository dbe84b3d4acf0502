"""Kaggle's answers a second reading of other sources found (issue 29), each played by the emulator
(`kaggle_emulator.quirks`, off by default, switched on here) and met by the real `kaggle` client over
HTTP: an answer that can pass is read as a wait, a refusal or "not there", never as a verdict on
the account or a halted run. Where a point needs only a push or a quota answer it is tested on the
client, the host or the probe directly; the runs under them are in tests/machines/test_kaggle_quirk_runs.py.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
import requests

from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator, make_notebook  # noqa: F401
from test_kaggle_client import accounts
from lab.config import UserError
from lab.kaggle import client as kc
from lab.kaggle.probed import cannot_run, read_probe
from lab.machines.auto import FOREIGN, takes_link
from lab.machines.kaggle.host import KaggleHost
from lab.machines.kaggle.refusals import Refused, check_limits, check_seats, kernel_exists, refused
from lab.probe.account import ProbePlan, probe_account
from lab.runs import End

SLOW = kc.RetryPolicy(attempts=3, base_s=0.01, cap_s=0.05)
CAP = "Maximum batch GPU session count of 2 reached."
FAST_PROBE = ProbePlan(hold_s=4.0, poll_s=0.2, log_grace_s=60.0, worker_timeout_s=120.0, session_timeout_s=7200,
                       allow_cpu=True)


def push(c: kc.AccountClient, slug: str, cells=("print('hello')",)) -> kc.PushResult:
    return c.push_kernel(slug, slug, make_notebook(*cells), timeout_s=600)


# -- 1. long busy spells -------------------------------------------------------------------------

def test_a_busy_spell_is_a_wait_with_its_time_never_a_failure_or_a_verdict(kaggle_lab):
    emu = kaggle_lab.emu
    emu.busy_spell("alice", for_s=30.0, retry_after_s=0.2)
    c = kaggle_lab.client("alice", retry=SLOW)
    with pytest.raises(kc.KaggleError) as e:
        c.quota()
    assert e.value.cause == "busy" and e.value.status == 429 and e.value.wait_s == pytest.approx(0.2)
    assert "RESOURCE_EXHAUSTED" in str(e.value) and "waits and asks again" in str(e.value)
    answer = next(r for r in emu.recorded("GetAcceleratorQuotaStatistics") if r.get("busy"))
    assert answer["status"] == 429, "the emulator answered in kaggle-cli#931's nested form"
    # A push out of tries, while the quota call is busy too: BUSY until Kaggle's time, not FAILED.
    with pytest.raises(kc.KaggleError) as e:
        push(c, "busy-kernel")
    said = refused(e.value, c)
    assert said.kind is End.BUSY and said.until
    wait = (datetime.fromisoformat(said.until) - datetime.now(timezone.utc)).total_seconds()
    assert 0 < wait < 5
    # The account as a machine: not free until the pause ends, and no error (an error would stop Auto).
    m = KaggleHost("alice").state([])
    assert m.error is None and m.busy_until and not m.free
    emu.busy_spell("alice", for_s=0.0)
    assert KaggleHost("alice").state([]).free


def test_a_probe_under_a_busy_spell_stores_nothing_and_leaves_the_account_usable(kaggle_lab):
    emu = kaggle_lab.emu
    emu.busy_spell("alice", for_s=60.0, retry_after_s=0.2, methods=("SaveKernel", "GetAcceleratorQuotaStatistics"))
    with pytest.raises(UserError, match="stored nothing"):
        probe_account("alice", FAST_PROBE, say=lambda s: None)
    assert read_probe("alice") is None and not emu.recorded("GetKernelSessionStatus")
    emu.busy_spell("alice", for_s=0.0)
    assert KaggleHost("alice").state([]).error is None


# -- 2. a refused push leaves an empty kernel ----------------------------------------------------

def test_a_shell_a_refusal_left_is_not_there_and_the_next_push_deletes_it_and_goes_on(kaggle_lab):
    emu = kaggle_lab.emu
    emu.shells_after_refusal = True
    c = kaggle_lab.client("alice")
    emu.fail_next_push("alice", CAP)
    with pytest.raises(kc.KaggleError) as e:
        push(c, "shell-kernel")
    assert e.value.cause == "session-cap" and refused(e.value, c).kind is End.BUSY
    assert not kernel_exists(c, "shell-kernel"), "its status answers 404: the refusal started nothing"
    pushed = push(c, "shell-kernel")  # Kaggle says "Notebook not found": the draft goes, the push is sent again
    assert pushed.version == 1 and emu.kernel_versions("alice", "shell-kernel") == [1]
    answers = [r["status"] for r in emu.recorded() if r["method"] in ("SaveKernel", "DeleteKernel")]
    assert answers == [200, 200, 200, 200]  # refused, "Notebook not found", deleted, taken


def test_a_probe_meeting_the_shell_of_a_refused_probe_pushes_again_and_bars_nothing(kaggle_lab):
    emu = kaggle_lab.emu
    emu.shells_after_refusal = True
    emu.fail_next_push("alice", CAP)
    with pytest.raises(UserError, match="needs a free GPU session"):
        probe_account("alice", FAST_PROBE, say=lambda s: None)
    assert read_probe("alice") is None
    emu.kill_next_session("alice", after_s=0.0)  # the next probe's session dies at once: its push is the point
    record = probe_account("alice", FAST_PROBE, say=lambda s: None)
    assert emu.recorded("DeleteKernel") and emu.kernel_versions("alice", "lab-probe") == [1]
    assert record["can_run"] is None and cannot_run(record) is None, "a failed probe bars nothing"
    assert KaggleHost("alice").state([]).error is None


# -- 3. identity verification, and hasEverRun ----------------------------------------------------

def test_an_account_kaggle_never_ran_a_gpu_session_on_gets_a_hint_before_its_first_run(kaggle_lab, capsys):
    emu = kaggle_lab.emu
    emu.account("bob").has_ever_run = True
    assert accounts() == 0
    out = capsys.readouterr().out
    hint = out.split("Before the first run:")[1]
    assert "alice: Kaggle says this account has not started a GPU session yet" in hint
    assert "phone" in hint and "identity" in hint and "lab probe alice" in hint and "bob:" not in hint
    # Not verified: the push is taken and runs without a GPU, with no quota spent and hasEverRun still false.
    emu.account("alice").gpu_allowed = False
    c = kaggle_lab.client("alice")
    push(c, "no-gpu-kernel")
    info = emu.wait_session("alice", "no-gpu-kernel", 60)
    assert info.status == "COMPLETE" and not info.gpu
    assert c.quota().used_s == 0 and c.quota().has_ever_run is False


# -- 4. 401 for a kernel that is not there -------------------------------------------------------

def test_a_401_for_a_missing_kernel_reads_not_there_while_the_credentials_work(kaggle_lab):
    emu = kaggle_lab.emu
    emu.missing_kernel_status = 401
    c = kaggle_lab.client("alice")
    with pytest.raises(kc.KaggleError) as e:
        c.kernel_status("alice/no-such-kernel")
    assert e.value.status == 404 and "not there" in str(e.value) and "lab accounts add" not in str(e.value)
    assert not kernel_exists(c, "no-such-kernel")
    assert emu.recorded("GetKernelSessionStatus")[0]["status"] == 401
    # With a key Kaggle does refuse, the same 401 is the credentials'.
    kc.remove_account("bob")
    kc.add_account("bob", kaggle_json=kaggle_lab.kaggle_json("bob", key="0" * 32))
    with pytest.raises(kc.KaggleError) as e:
        kaggle_lab.client("bob").kernel_status("bob/no-such-kernel")
    assert e.value.status == 401 and "lab accounts add bob" in str(e.value)


# -- 5. new access tokens ------------------------------------------------------------------------

def test_a_kgat_key_in_kaggle_json_is_stored_and_sent_as_an_access_token(kaggle_lab, capsys, monkeypatch):
    emu = kaggle_lab.emu
    token = "KGAT_" + "a1b2c3d4" * 4
    emu.add_account("carol", token=token)
    path = kaggle_lab.files / "carol.json"
    path.write_text(json.dumps({"username": "carol", "key": token}))
    # As the stock client sends it (Basic: a username and key), Kaggle answers 401 (kaggle-cli#1188).
    basic = requests.post(f"{emu.url}/v1/kernels.KernelsApiService/GetAcceleratorQuotaStatistics", json={},
                          auth=("carol", token), timeout=10)
    assert basic.status_code == 401
    assert accounts("add", "carol", "--kaggle-json", str(path)) == 0
    out = capsys.readouterr().out
    assert "stored as an access token: its kaggle.json's key is a KGAT_ token" in out and token not in out
    assert "h of 30.0 h GPU quota left" in out
    account = kc.get_account("carol")
    assert account.auth == "token" and not (account.folder / "kaggle.json").exists()
    assert emu.recorded("GetAcceleratorQuotaStatistics")[-1]["user"] == "carol"
    assert accounts() == 0 and "carol (access token)" in capsys.readouterr().out
    # One an older kit stored as a kaggle.json is read as the token it is.
    (account.folder / "access_token").unlink()
    (account.folder / "account.json").unlink()
    (account.folder / "kaggle.json").write_text(json.dumps({"username": "carol", "key": token}))
    assert kc.get_account("carol").auth == "token" and kaggle_lab.client("carol").quota().total_s == 30 * 3600


# -- 6 and 7. the quota past its total, and the two "left" figures --------------------------------

def test_quota_past_its_total_shows_as_such_plans_nothing_and_its_refusal_reads_as_quota(kaggle_lab, capsys):
    emu = kaggle_lab.emu
    emu.set_quota("alice", total_s=30 * 3600, used_s=30.93 * 3600)
    emu.set_quota("bob", total_s=30 * 3600, used_s=20 * 3600, reserved_s=6 * 3600)
    c = kaggle_lab.client("alice")
    q = c.quota()
    assert q.left_s == 0 and q.said_left_s == 0 and q.over_s == pytest.approx(0.93 * 3600)
    assert accounts() == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line[:5] in ("alice", "bob  ")}
    assert "0.0 h / 30.0 h" in rows["alice"] and "used 30.9 h: 0.9 h past the total" in rows["alice"]
    assert "4.0 h / 30.0 h" in rows["bob"] and "10.0 h" in rows["bob"], "left for a new session; `kaggle quota` says"
    m = KaggleHost("alice").state([])
    assert m.quota_left_h == 0 and m.quota_used_h == pytest.approx(30.93) and not takes_link(m)
    # Kaggle's own words for the refusal (one project's log) are the quota's, whatever the quota call says.
    emu.busy_spell("alice", for_s=60.0, retry_after_s=0.05, methods=("GetAcceleratorQuotaStatistics",))
    with pytest.raises(kc.KaggleError) as e:
        push(c, "over-quota")
    assert "Maximum weekly GPU quota of 30.00 hours reached." in str(e.value)
    assert e.value.cause == "quota" and refused(e.value, c).kind is End.NO_QUOTA


def test_running_sessions_reserve_quota_and_a_new_session_is_planned_with_what_is_left_after(kaggle_lab):
    emu = kaggle_lab.emu
    emu.reserve_running = True
    c = kaggle_lab.client("alice")
    push(c, "reserving", cells=("import time\ntime.sleep(30)",))
    deadline = time.monotonic() + 60
    while c.quota().reserved_s == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    q = c.quota()
    assert q.reserved_s > 0 and q.left_s < q.said_left_s, "a new session has less than `kaggle quota` says"
    assert KaggleHost("alice").state([]).quota_left_h == pytest.approx(c.quota().left_s / 3600, abs=0.05)
    emu.cancel("alice", "reserving")


# -- 9. the lab is several people ----------------------------------------------------------------

def test_another_members_sessions_fill_the_account_and_nothing_is_pushed_into_it(kaggle_lab):
    emu = kaggle_lab.emu
    emu.occupy("alice", 2)  # another member's two runs, listed among the account's kernels
    c = kaggle_lab.client("alice")
    assert sorted(status for _, status in c.gpu_sessions()) == ["RUNNING", "RUNNING"]
    m = KaggleHost("alice").state([])
    assert m.running == [FOREIGN, FOREIGN] and not m.free and m.error is None
    with pytest.raises(Refused) as e:
        check_seats(c, "alice/lab-next")
    assert e.value.kind is End.BUSY and "another lab member's" in str(e.value)
    assert not emu.recorded("SaveKernel")
    # An interactive session is listed nowhere: only Kaggle's cap shows it, and it reads BUSY.
    emu.release("alice")
    emu.occupy("alice", 2, interactive=True)
    assert c.gpu_sessions() == [] and KaggleHost("alice").state([]).free
    with pytest.raises(kc.KaggleError) as e:
        push(c, "into-a-full-one")
    assert refused(e.value, c).kind is End.BUSY


# -- 10. limits checked before they bite ---------------------------------------------------------

def test_a_dataset_over_1000_files_and_a_notebook_over_1_mb_are_refused_before_anything_goes_up(kaggle_lab,
                                                                                             tmp_path):
    emu = kaggle_lab.emu
    many = tmp_path / "many"
    many.mkdir()
    for i in range(1001):
        (many / f"f{i:04d}.txt").write_text("x")
    with pytest.raises(UserError, match="1001 files; Kaggle refuses a dataset version of more than 1000"):
        kaggle_lab.client("alice").upload_dataset("alice/many-files", many, "many-files")
    assert not emu.recorded("StartBlobUpload")
    # The emulator plays Kaggle's own refusal (reported, 2020) for a client that does not check.
    reply = requests.post(f"{emu.url}/v1/datasets.DatasetApiService/CreateDataset",
                          json={"ownerSlug": "alice", "slug": "many-files", "title": "many-files",
                                "licenseName": "other", "files": [{"token": str(i)} for i in range(1001)]},
                          auth=("alice", emu.account("alice").key), timeout=10).json()
    assert reply["error"] == "The file count exceeds the maximum of 1000"
    big = make_notebook("x = '" + "y" * 1_100_000 + "'")
    with pytest.raises(UserError, match="1.10 MB; Kaggle takes at most 1 MB"):
        check_limits(big, 3, tmp_path)
    with pytest.raises(UserError, match="is 1001 files"):
        check_limits(make_notebook("x = 1"), 1001, many)


# -- what a waiting run says -----------------------------------------------------------------------

def test_the_monitor_says_what_a_waiting_run_waits_for_and_until_when(kaggle_lab):
    from html import unescape

    from lab import ui
    from lab.config import RunConfig
    from lab.machines.control import set_control
    from lab.runs import Settled, create_run, updating
    run = create_run(Settled.whole(RunConfig(steps_until=30)))
    with updating(run.id) as r:
        r.status = "waiting"
    set_control(run.id, message="No Kaggle account can take the run now (...).", waiting_until="2026-12-01T12:03:04Z",
                waiting_for="the end of Kaggle's pause on alice, 2026-12-01 12:03:04 UTC",
                waiting_for_ru="конца паузы Kaggle на alice, 2026-12-01 12:03:04 UTC")
    ui.set_language("en")
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    try:
        assert "Waiting for the end of Kaggle's pause on alice, 2026-12-01 12:03:04 UTC" in unescape(monitor.state.value)
        ui.set_language("ru")
        monitor.refresh()
        assert "Ждёт конца паузы Kaggle на alice" in unescape(monitor.state.value)
    finally:
        monitor.close()
