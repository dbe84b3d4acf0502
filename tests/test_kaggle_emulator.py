"""The Kaggle emulator: the wire protocol as the real client speaks it, and sessions that run."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

from kaggle_fixtures import (SAVER_CELL, SLEEP_CELL, kaggle_emulator, kaggle_lab,  # noqa: F401 (fixtures)
                             make_kaggle_emulator, make_notebook, lab_for)
from kaggle_emulator import KaggleEmulator

TESTS = str(Path(__file__).resolve().parent)  # kaggle_emulator is a package there
QUOTA = "kernels.KernelsApiService/GetAcceleratorQuotaStatistics"


def rpc(emu: KaggleEmulator, method: str, body: dict, auth=None, headers=None) -> requests.Response:
    return requests.post(f"{emu.url}/v1/{method}", json=body, auth=auth, headers=headers, timeout=10)


def alice_auth(emu: KaggleEmulator) -> tuple[str, str]:
    return "alice", emu.account("alice").key


def stock_kaggle_api(emu: KaggleEmulator, monkeypatch, username: str):
    """The real client with no lab code in between, configured as kaggle-notes.md says."""
    from kaggle.api.kaggle_api_extended import KaggleApi
    from kagglesdk import kaggle_env
    monkeypatch.setitem(kaggle_env._env_to_endpoint, kaggle_env.KaggleEnv.PROD, emu.url)
    api = KaggleApi()
    api.config_values = {"username": username, "key": emu.account(username).key}
    api._authenticated = True
    return api


def test_unknown_credentials_get_401_as_json(kaggle_emulator):
    for auth, headers in [(("alice", "wrong"), None), (None, {"Authorization": "Bearer nope"}), (None, None)]:
        r = rpc(kaggle_emulator, QUOTA, {}, auth=auth, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == 401
    assert rpc(kaggle_emulator, QUOTA, {}, auth=alice_auth(kaggle_emulator)).status_code == 200


def test_quota_durations_keep_their_days_and_refresh_weekly(kaggle_emulator):
    emu = kaggle_emulator
    emu.set_quota("alice", total_s=30 * 3600, used_s=25 * 3600 + 0.5,
                  refresh_time=datetime.now(timezone.utc) + timedelta(days=2))
    gpu = rpc(emu, QUOTA, {}, auth=alice_auth(emu)).json()["gpuQuota"]
    assert gpu == {"timeUsed": "90000.500s", "timeReserved": "0s", "totalTimeAllowed": "108000s"}
    emu.set_quota("alice", refresh_time=datetime.now(timezone.utc) - timedelta(seconds=1))
    time.sleep(0.3)  # one supervisor tick
    reply = rpc(emu, QUOTA, {}, auth=alice_auth(emu)).json()
    assert reply["gpuQuota"]["timeUsed"] == "0s"
    assert reply["quotaRefreshTime"] > datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M")


def test_the_stock_client_uploads_and_reads_through_the_endpoint_table(kaggle_emulator, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KAGGLE_API_TOKEN", raising=False)
    api = stock_kaggle_api(kaggle_emulator, monkeypatch, "alice")
    assert api.quota_view().gpu_quota.total_time_allowed.total_seconds() == 108000
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(os.urandom(3000))
    (folder / "dataset-metadata.json").write_text(json.dumps(
        {"title": "Stock client data", "id": "alice/stock-client-data", "licenses": [{"name": "other"}]}))
    reply = api.dataset_create_new(str(folder), public=False, quiet=True)
    assert reply.status == "ok" and not reply.error
    stored = kaggle_emulator.state_dir / "datasets" / "alice" / "stock-client-data" / "v1" / "weights.bin"
    assert stored.read_bytes() == (folder / "weights.bin").read_bytes()
    upload = kaggle_emulator.recorded("upload")[0]
    assert upload["status"] == 200 and upload["bytes"] == 3000


def test_localhost_mode_through_a_proxy_reaches_the_emulator(kaggle_emulator, monkeypatch):
    """KAGGLE_API_ENVIRONMENT=LOCALHOST + HTTP_PROXY: paths arrive as http://localhost/api/v1/..."""
    from kagglesdk import KaggleClient, KaggleEnv
    from kagglesdk.kernels.types.kernels_api_service import ApiGetAcceleratorQuotaStatisticsRequest
    monkeypatch.setenv("HTTP_PROXY", kaggle_emulator.url)
    for var in ("NO_PROXY", "no_proxy", "http_proxy", "KAGGLE_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    with KaggleClient(env=KaggleEnv.LOCAL, username="alice", password=kaggle_emulator.account("alice").key) as k:
        reply = k.kernels.kernels_api_client.get_accelerator_quota_statistics(ApiGetAcceleratorQuotaStatisticsRequest())
    assert reply.gpu_quota.total_time_allowed.total_seconds() == 108000


def test_blob_uploads_resume_with_content_range(kaggle_emulator):
    emu, auth = kaggle_emulator, alice_auth(kaggle_emulator)
    start = rpc(emu, "blobs.BlobApiService/StartBlobUpload",
                {"type": "DATASET", "name": "part.bin", "contentLength": 10}, auth=auth).json()
    url = start["createUrl"]
    r = requests.put(url, data=b"0123", headers={"Content-Range": "bytes 0-3/10"}, timeout=10)
    assert r.status_code == 308 and r.headers["Range"] == "bytes=0-3"
    r = requests.put(url, data=b"", headers={"Content-Range": "bytes */10"}, timeout=10)
    assert r.status_code == 308 and r.headers["Range"] == "bytes=0-3"
    r = requests.put(url, data=b"456789", headers={"Content-Range": "bytes 4-9/10"}, timeout=10)
    assert r.status_code == 200
    assert requests.put(url, data=b"", headers={"Content-Range": "bytes */10"}, timeout=10).status_code == 200
    assert requests.put(f"{emu.url}/upload/00ff", data=b"x", timeout=10).status_code == 404
    made = rpc(emu, "datasets.DatasetApiService/CreateDataset",
               {"ownerSlug": "alice", "slug": "resumed-data", "title": "Resumed data", "isPrivate": True,
                "licenseName": "other", "files": [{"token": start["token"]}]}, auth=auth).json()
    assert made["status"] == "ok"
    assert (emu.state_dir / "datasets/alice/resumed-data/v1/part.bin").read_bytes() == b"0123456789"
    # Another account cannot use alice's upload token.
    bob = rpc(emu, "datasets.DatasetApiService/CreateDataset",
              {"ownerSlug": "bob", "slug": "stolen-data", "title": "Stolen data", "licenseName": "other",
               "files": [{"token": start["token"]}]},
              auth=("bob", emu.account("bob").key))
    assert bob.status_code == 400


def test_outputs_page_at_most_200_and_signed_urls_need_no_auth(kaggle_emulator):
    emu, auth = kaggle_emulator, alice_auth(kaggle_emulator)
    body = {"userName": "alice", "kernelSlug": "nothing-here", "pageSize": 201}
    assert rpc(emu, "kernels.KernelsApiService/ListKernelSessionOutput", body, auth=auth).status_code == 400
    body["pageSize"] = 20
    r = rpc(emu, "kernels.KernelsApiService/ListKernelSessionOutput", body, auth=auth)
    assert r.status_code == 403 and "kernels.get" in r.json()["message"]  # missing reads as private
    assert requests.get(f"{emu.url}/download/unknown-token", timeout=10).status_code == 404


def test_cancel_sends_sigterm_and_old_layout_mounts_inputs_by_slug(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(input_layout="old"), tmp_path, monkeypatch)
    alice = lab.client("alice")
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.txt").write_text("old layout")
    alice.upload_dataset("layout-data", data, "Layout data")
    alice.wait_dataset_ready("layout-data", timeout_s=10, poll_s=0.05)
    alice.push_kernel("cancel-me", "cancel-me", make_notebook(SAVER_CELL, SLEEP_CELL),
                      dataset_sources=["alice/layout-data"])
    info = lab.emu.session("alice", "cancel-me")
    deadline = time.monotonic() + 30
    while not (info.working / "started.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (info.root / "input" / "layout-data" / "data.txt").read_text() == "old layout"
    r = rpc(lab.emu, "kernels.KernelsApiService/CancelKernelSession", {"kernelSessionId": info.id},
            auth=alice_auth(lab.emu))
    assert r.status_code == 200 and "errorMessage" not in r.json()
    done = lab.emu.wait_session("alice", "cancel-me", timeout_s=20)
    assert done.status == "CANCEL_ACKNOWLEDGED"
    assert (done.working / "sigterm.txt").read_text() == "saved at SIGTERM"
    assert alice.kernel_status("cancel-me") == ("CANCEL_ACKNOWLEDGED", "")


def test_a_failing_notebook_ends_in_error_with_its_log(kaggle_lab):
    alice = kaggle_lab.client("alice")
    alice.push_kernel("broken-run", "broken-run", make_notebook("raise RuntimeError('boom in the notebook')"),
                      gpu=False)
    info = kaggle_lab.emu.wait_session("alice", "broken-run", timeout_s=40)
    assert info.status == "ERROR" and "see the log" in info.failure
    assert "boom in the notebook" in alice.kernel_log("broken-run")
    assert kaggle_lab.emu.account("alice").gpu_used_s == 0  # a CPU session uses no GPU quota


def test_recorded_requests_hold_no_credentials(kaggle_lab, tmp_path):
    alice = kaggle_lab.client("alice")
    alice.quota()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("x")
    alice.upload_dataset("recorded-data", tmp_path / "d", "Recorded data")
    text = json.dumps(kaggle_lab.emu.recorded())
    assert kaggle_lab.emu.account("alice").key not in text
    assert {r["user"] for r in kaggle_lab.emu.recorded() if r["method"] != "upload"} == {"alice"}


def test_the_command_line_emulator_serves_and_writes_private_credentials(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kaggle_emulator", "--port", "0", "--state", str(tmp_path),
                             "--account", "alice", "--token-account", "tina:tok-abcdefgh"],
                            cwd=TESTS, env={**os.environ, "PYTHONPATH": TESTS}, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any("Ctrl-C" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        url = lines[0].split()[3]
        creds = tmp_path / "credentials" / "alice" / "kaggle.json"
        assert stat.S_IMODE(creds.stat().st_mode) == 0o600
        key = json.loads(creds.read_text())["key"]
        r = requests.post(f"{url}/v1/{QUOTA}", json={}, auth=("alice", key), timeout=10)
        assert r.status_code == 200
        r = requests.post(f"{url}/v1/{QUOTA}", json={}, headers={"Authorization": "Bearer tok-abcdefgh"}, timeout=10)
        assert r.status_code == 200
        assert key not in "".join(lines) and "tok-abcdefgh" not in "".join(lines)
        # The set-up lines are the whole set-up: its sessions have no GPU (issue 33).
        assert f"  export LAB_KAGGLE_API_URL={url} LAB_KAGGLE_ALLOW_CPU=1\n" in lines
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_the_kernel_page_the_kit_links_for_stop_session_serves_a_stop_button_that_stops_it(kaggle_lab):
    # Issue 25: `lab cancel` and the monitor send the person to the kernel's page to press Stop
    # session; on the emulator that page answered 404.
    alice = kaggle_lab.client("alice")
    pushed = alice.push_kernel("stop-me", "stop-me", make_notebook(SAVER_CELL, SLEEP_CELL))
    info = kaggle_lab.emu.session("alice", "stop-me")
    deadline = time.monotonic() + 30
    while not (info.working / "started.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    page = requests.get(pushed.url, timeout=10)
    assert page.status_code == 200 and "Stop session" in page.text and "RUNNING" in page.text
    stopped = requests.post(f"{pushed.url}/stop", timeout=10)  # the button's form; the redirect is followed
    assert stopped.status_code == 200 and stopped.url == pushed.url
    done = kaggle_lab.emu.wait_session("alice", "stop-me", timeout_s=20)
    assert done.status == "CANCEL_ACKNOWLEDGED" and (done.working / "sigterm.txt").read_text() == "saved at SIGTERM"
    page = requests.get(pushed.url, timeout=10).text
    assert "No session is running" in page and "Stop session" not in page and "refresh" not in page
    assert requests.get(f"{kaggle_lab.emu.url}/code/alice/nothing-here", timeout=10).status_code == 404


def test_the_probes_hold_runs_on_the_emulators_clock():
    # Issue 25: at --time-scale 60 `lab probe` held its session 150 real seconds while the session's
    # 20 minutes passed in 20 s, so it could never succeed. (The browser test probes end to end.)
    from lab.probe.account import ProbePlan, probe_notebook
    nb = json.loads(KaggleEmulator(time_scale=60.0)._as_run_here(json.dumps(probe_notebook(ProbePlan()))))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    space: dict = {}
    for source in cells[:3]:  # the clock's first line, the parameters, the emulator's time cell
        exec(source, space)
    assert space["hold_s"] == ProbePlan().hold_s / 60 and space["worker_timeout_s"] == ProbePlan().worker_timeout_s


def test_a_sessions_clock_starts_when_its_notebook_runs_not_while_papermill_starts(kaggle_lab):
    # The emulator's own start-up of papermill and a kernel takes seconds this machine, which at a
    # fast scale are minutes of quota and session time Kaggle's start-up does not cost.
    alice = kaggle_lab.client("alice")
    alice.push_kernel("clock", "clock", make_notebook("import time\ntime.sleep(2)"))
    info = kaggle_lab.emu.wait_session("alice", "clock", timeout_s=60)
    assert info.status == "COMPLETE"
    used_s = kaggle_lab.emu.account("alice").gpu_used_s  # emulated seconds, 60 per wall second
    s = kaggle_lab.emu._kernel_version("alice", "clock", None).session
    booted_s, ran_s = s.started_at - s.launched_at, s.exited_at - s.started_at
    slack_s = 2 * kaggle_lab.emu.tick_s  # the charge is counted tick by tick
    assert booted_s > slack_s, booted_s  # papermill's start-up took real time here: what is not charged
    # Charged from the notebook's first line to its end (however long papermill takes to close on a
    # busy machine), not from papermill's start.
    assert 2 * 60 <= used_s <= (ran_s + slack_s) * kaggle_lab.emu.time_scale, (used_s, booted_s, ran_s)
