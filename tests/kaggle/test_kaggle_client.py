"""The per-account Kaggle client, with the real `kaggle` client talking to the local emulator."""
from __future__ import annotations

import argparse
import json
import stat
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from kaggle_fixtures import (SAVER_CELL, SLEEP_CELL, kaggle_emulator, kaggle_lab,  # noqa: F401 (fixtures)
                             make_kaggle_emulator, make_notebook, lab_for)
from lab.cli import accounts as accounts_cli
from lab.kaggle import client as kc
from lab.config import UserError

TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")


def accounts(*argv: str) -> int:
    """`lab accounts ...` as the CLI runs it (UserError: one line on stderr, exit 2)."""
    parser = argparse.ArgumentParser(prog="lab accounts")
    accounts_cli.configure(parser)
    try:
        return accounts_cli.run(parser.parse_args(list(argv)))
    except UserError as e:
        print(f"lab accounts: error: {e}", file=sys.stderr)
        return 2


def wait_kernel(client: kc.AccountClient, slug: str, timeout_s: float = 60.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.kernel_status(slug)
        if status[0] in TERMINAL:
            return status
        time.sleep(0.2)
    raise AssertionError(f"{slug} did not end within {timeout_s} s")


def data_folder(tmp_path, name="data", **files: str):
    folder = tmp_path / name
    folder.mkdir()
    for fname, text in (files or {"data.txt": "hello from the dataset"}).items():
        (folder / fname).write_text(text)
    return folder


# -- accounts ---------------------------------------------------------------------------------

def test_added_accounts_are_stored_privately_and_never_show_their_key(kaggle_lab):
    key = kaggle_lab.emu.account("alice").key
    assert [(a.name, a.username, a.auth) for a in kc.list_accounts()] == [("alice", "alice", "key"),
                                                                          ("bob", "bob", "key")]
    folder = kaggle_lab.home / "accounts" / "alice"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "kaggle.json").stat().st_mode) == 0o600
    client = kaggle_lab.client("alice")
    for text in (repr(kc.get_account("alice")), repr(client), repr(client._api), str(vars(client))):
        assert key not in text


def test_bad_account_input_is_refused_clearly(kaggle_lab, tmp_path):
    with pytest.raises(UserError, match="Bad account name"):
        kc.add_account("Not Good", kaggle_json=kaggle_lab.kaggle_json("alice"))
    broken = tmp_path / "broken.json"
    broken.write_text('{"username": "carol", "key": "s3cret-value" ')  # cut short
    with pytest.raises(UserError, match="is not a kaggle.json") as e:
        kc.add_account("carol", kaggle_json=broken)
    assert "s3cret-value" not in str(e.value)
    with pytest.raises(UserError, match="already account 'alice'"):
        kc.add_account("alice2", kaggle_json=kaggle_lab.kaggle_json("alice"))
    with pytest.raises(UserError, match="already exists"):
        kc.add_account("alice", kaggle_json=kaggle_lab.kaggle_json("alice"))


def test_lab_accounts_lists_quota_over_a_day_and_refresh_time(kaggle_lab, capsys):
    refresh = datetime(2031, 5, 6, 7, 8, tzinfo=timezone.utc)
    # 30 h total, 26 h 1 min 1.5 s used, 1 h reserved: every duration is over a day in seconds.
    kaggle_lab.emu.set_quota("alice", total_s=108000, used_s=93661.5, reserved_s=3600, refresh_time=refresh)
    q = kaggle_lab.client("alice").quota()
    assert (q.total_s, q.used_s, q.reserved_s, q.left_s) == (108000, 93661.5, 3600, 10738.5)
    assert q.refresh_time == refresh
    # The trap the client steps around: the SDK's own rendering of a duration drops whole days.
    from kagglesdk.kaggle_object import TimeDeltaSerializer
    assert TimeDeltaSerializer._to_dict_value(timedelta(seconds=108000)) == "21600s"

    assert accounts() == 0
    out = capsys.readouterr().out
    alice = next(line for line in out.splitlines() if line.startswith("alice"))
    assert "3.0 h / 30.0 h" in alice and "2031-05-06 07:08" in alice and alice.endswith("-")
    assert "30.0 h / 30.0 h" in next(line for line in out.splitlines() if line.startswith("bob"))


def test_remove_forgets_the_account(kaggle_lab, capsys):
    assert accounts("remove", "bob") == 0
    assert [a.name for a in kc.list_accounts()] == ["alice"]
    assert accounts("remove", "bob") == 2
    assert "No Kaggle account 'bob'" in capsys.readouterr().err


def test_a_wrong_key_names_the_account_and_never_shows_the_key(kaggle_lab, capsys):
    kaggle_lab.emu.add_account("carol")
    wrong = "0123456789abcdef-wrong"
    kc.add_account("carol", kaggle_json=kaggle_lab.kaggle_json("carol", key=wrong))
    with pytest.raises(kc.KaggleError) as e:
        kaggle_lab.client("carol").quota()
    assert e.value.status == 401 and e.value.account == "carol"
    assert "'carol'" in str(e.value) and "HTTP 401" in str(e.value)
    assert wrong not in str(e.value) and wrong not in repr(e.value)

    kc.remove_account("carol")
    assert accounts("add", "carol", "--kaggle-json", str(kaggle_lab.kaggle_json("carol", key=wrong))) == 2
    out, err = capsys.readouterr()
    assert "'carol'" in err and "not added" in err and wrong not in out + err
    assert "carol" not in [a.name for a in kc.list_accounts()]

    assert accounts("add", "carol", "--kaggle-json", str(kaggle_lab.kaggle_json("carol"))) == 0
    assert "Added account 'carol'" in capsys.readouterr().out


def test_a_token_account_signs_in_with_its_own_bearer_token(kaggle_lab, tmp_path, capsys):
    token = "tok-" + "x" * 30
    kaggle_lab.emu.add_account("tina", token=token)
    token_file = tmp_path / "tina.token"
    token_file.write_text(token + "\n")
    assert accounts("add", "tina", "--token-file", str(token_file)) == 0  # asks Kaggle whose token it is
    out = capsys.readouterr().out
    assert "Kaggle user tina" in out and token not in out
    assert kc.get_account("tina").auth == "token"
    assert kaggle_lab.client("tina").quota().total_s == 30 * 3600
    assert kaggle_lab.emu.recorded("GetAcceleratorQuotaStatistics")[-1]["user"] == "tina"


@pytest.mark.parametrize("trap", ["env", "file", "notebook"])
def test_a_global_token_that_would_make_all_accounts_one_is_refused(kaggle_lab, monkeypatch, tmp_path, trap):
    if trap == "env":
        monkeypatch.setenv("KAGGLE_API_TOKEN", "global-token")
        cause = "KAGGLE_API_TOKEN"
    elif trap == "file":
        kaggle_dir = tmp_path / "user-home" / ".kaggle"
        kaggle_dir.mkdir()
        (kaggle_dir / "access_token").write_text("global-token\n")
        cause = "access_token exists"
    else:
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
        cause = "inside a Kaggle notebook"
    with pytest.raises(UserError, match=cause) as e:
        kc.client_for("alice")
    assert "global-token" not in str(e.value)
    assert kaggle_lab.emu.recorded() == []


def test_accounts_are_isolated_in_one_process(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(queue_s=600), tmp_path, monkeypatch)  # sessions stay QUEUED
    alice, bob = lab.client("alice"), lab.client("bob")
    alice.upload_dataset("alice-private-data", data_folder(tmp_path), "Alice private data")
    alice.push_kernel("shared-name", "shared-name", make_notebook("print(1)"))
    bob.push_kernel("shared-name", "shared-name", make_notebook("print(2)"))
    lab.emu.set_quota("alice", used_s=3600)

    assert lab.emu.kernel_versions("alice", "shared-name") == [1]
    assert lab.emu.kernel_versions("bob", "shared-name") == [1]
    assert [r["user"] for r in lab.emu.recorded("SaveKernel")] == ["alice", "bob"]
    assert (alice.quota().used_s, bob.quota().used_s) == (3600, 0)
    with pytest.raises(kc.KaggleError, match="HTTP 403") as e:
        bob.dataset_status("alice/alice-private-data")
    assert e.value.account == "bob"
    with pytest.raises(kc.KaggleError, match="HTTP 403") as e:
        bob.kernel_status("alice/shared-name")
    assert "Check the slug" in str(e.value)  # another account's kernel: the slug may be wrong
    with pytest.raises(kc.KaggleError) as e:  # the account's own kernel, not there (yet): the slug is right
        alice.kernel_status("never-pushed")
    assert "may not be there yet" in str(e.value) and "slug" not in str(e.value).lower()
    with pytest.raises(UserError, match="belongs to alice"):
        bob.push_kernel("alice/shared-name", "shared-name", make_notebook("print(3)"))


# -- datasets ---------------------------------------------------------------------------------

def test_dataset_upload_becomes_ready_and_a_change_makes_version_2(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(dataset_ready_s=1.0), tmp_path, monkeypatch)
    alice = lab.client("alice")
    folder = data_folder(tmp_path, **{"ckpt.bin": "step 100", "config.json": "{}"})
    assert alice.upload_dataset("run-handoff", folder, "Run hand-off", notes="step 100") == 1
    assert alice.dataset_status("run-handoff") != "READY"  # Kaggle is still processing it
    assert alice.wait_dataset_ready("run-handoff", timeout_s=10, poll_s=0.05) == 1

    (folder / "ckpt.bin").write_text("step 200")
    assert alice.upload_dataset("run-handoff", folder, "Run hand-off", notes="step 200") == 2
    assert alice.wait_dataset_ready("run-handoff", timeout_s=10, poll_s=0.05) == 2
    stored = lab.emu.state_dir / "datasets" / "alice" / "run-handoff"
    assert (stored / "v2" / "ckpt.bin").read_text() == "step 200"
    assert sorted(p.name for p in (stored / "v2").iterdir()) == ["ckpt.bin", "config.json"]
    assert lab.emu.recorded("CreateDataset")[0]["body"]["isPrivate"] is True
    version_body = lab.emu.recorded("CreateDatasetVersion")[0]["body"]["body"]
    assert version_body["versionNotes"] == "step 200"
    # The new version replaces the old (the client's delete_old_versions): storage holds one copy.
    assert version_body["deleteOldVersions"] is True and lab.emu.dataset_versions("alice", "run-handoff") == [2]
    assert not (stored / "v1").exists()
    # What a version holds reads back by name and size.
    assert alice.dataset_files("run-handoff", 2) == {"ckpt.bin": 8, "config.json": 2}
    # Uploads are staged per account: the client keys its resume state by file path.
    assert (lab.home / "accounts" / "alice" / "staging" / "run-handoff" / "ckpt.bin").is_symlink()


def test_a_stuck_dataset_times_out_and_a_failed_one_says_so(kaggle_lab, tmp_path):
    alice = kaggle_lab.client("alice")
    kaggle_lab.emu.set_dataset_behaviour("alice", "stuck-data", "stuck")
    kaggle_lab.emu.set_dataset_behaviour("alice", "failed-data", "failed")
    alice.upload_dataset("stuck-data", data_folder(tmp_path, "a"), "Stuck data")
    alice.upload_dataset("failed-data", data_folder(tmp_path, "b"), "Failed data")
    with pytest.raises(kc.KaggleError, match="still BLOBS_RECEIVED after 0.5 s") as e:
        alice.wait_dataset_ready("stuck-data", timeout_s=0.5, poll_s=0.05)
    assert e.value.retryable
    with pytest.raises(kc.KaggleError, match="could not process dataset alice/failed-data"):
        alice.wait_dataset_ready("failed-data", timeout_s=5, poll_s=0.05)
    # The statuses kagglesdk knows besides: DELETED ends the wait as FAILED does, REPROCESSING is waited out.
    kaggle_lab.emu.set_dataset_behaviour("alice", "deleted-data", "deleted")
    kaggle_lab.emu.set_dataset_behaviour("alice", "redone-data", "reprocessing")
    alice.upload_dataset("deleted-data", data_folder(tmp_path, "c"), "Deleted data")
    alice.upload_dataset("redone-data", data_folder(tmp_path, "d"), "Redone data")
    with pytest.raises(kc.KaggleError, match="dataset alice/deleted-data DELETED") as e:
        alice.wait_dataset_ready("deleted-data", timeout_s=5, poll_s=0.05)
    assert not e.value.retryable and "Upload it again" in str(e.value)
    seen = []
    while (status := alice.dataset_status("redone-data")) != "READY":
        seen.append(status)
        time.sleep(0.05)
    assert "REPROCESSING" in seen and alice.wait_dataset_ready("redone-data", timeout_s=1, poll_s=0.05) == 1


def test_an_upload_over_the_private_storage_is_taken_and_never_shows_which_the_wait_says(make_kaggle_emulator,
                                                                                        tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(private_storage_bytes=100), tmp_path, monkeypatch)
    alice = lab.client("alice")
    assert alice.upload_dataset("too-big-data", data_folder(tmp_path, **{"big.bin": "x" * 200}), "Too big data") == 1
    with pytest.raises(kc.KaggleError, match="still MISSING after 0.5 s") as e:
        alice.wait_dataset_ready("too-big-data", timeout_s=0.5, poll_s=0.05)
    assert "private-storage quota" in str(e.value) and "kaggle-cli#284" in str(e.value)
    assert "lab accounts checkpoints" in str(e.value)


def test_a_dataset_folder_must_be_flat(kaggle_lab, tmp_path):
    folder = data_folder(tmp_path)
    (folder / "sub").mkdir()
    with pytest.raises(UserError, match="subfolders"):
        kaggle_lab.client("alice").upload_dataset("flat-data", folder, "Flat data")


# -- kernels ----------------------------------------------------------------------------------

READ_INPUT_AND_WRITE = """
import os, pathlib
root = pathlib.Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))
text = (root / "input/datasets/alice/train-inputs/data.txt").read_text()
print("read:", text)
work = root / "working"
for i in range(4):
    (work / f"out{i}.txt").write_text(f"{text} {i}")
(work / "ckpt").mkdir()
(work / "ckpt" / "model.bin").write_bytes(bytes(range(256)) * 40)
"""

READ_KERNEL_SOURCE = """
import os, pathlib
root = pathlib.Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))
prev = (root / "input/notebooks/alice/first-run/out0.txt").read_text()
(root / "working/continued.txt").write_text("continued from " + prev)
"""


def test_a_pushed_notebook_runs_and_its_outputs_download(kaggle_lab, tmp_path):
    alice = kaggle_lab.client("alice")
    alice.upload_dataset("train-inputs", data_folder(tmp_path), "Train inputs")
    alice.wait_dataset_ready("train-inputs", timeout_s=10, poll_s=0.05)
    nb = make_notebook(READ_INPUT_AND_WRITE)

    pushed = alice.push_kernel("first-run", "first-run", nb, dataset_sources=["alice/train-inputs"], timeout_s=3600)
    assert pushed.version == 1 and pushed.url.endswith("/code/alice/first-run")
    assert wait_kernel(alice, "first-run") == ("COMPLETE", "")

    files = alice.kernel_output("first-run", tmp_path / "out", page_size=2)
    names = sorted(p.relative_to(tmp_path / "out").as_posix() for p in files)
    assert names == ["ckpt/model.bin", "first-run.log", "out0.txt", "out1.txt", "out2.txt", "out3.txt"]
    assert (tmp_path / "out" / "out3.txt").read_text() == "hello from the dataset 3"
    assert (tmp_path / "out" / "ckpt" / "model.bin").read_bytes() == bytes(range(256)) * 40
    pages = kaggle_lab.emu.recorded("ListKernelSessionOutput")
    assert len(pages) == 3 and all(p["body"]["pageSize"] == 2 for p in pages)
    assert "read: hello from the dataset" in alice.kernel_log("first-run")

    push = kaggle_lab.emu.recorded("SaveKernel")[0]["body"]
    assert push["machineShape"] == "NvidiaTeslaT4" and push["enableGpu"] is True
    assert push["isPrivate"] is True and push["enableInternet"] is False
    assert push["datasetDataSources"] == ["alice/train-inputs"] and push["sessionTimeoutSeconds"] == 3600
    assert (push["slug"], push["newTitle"], push["language"], push["kernelType"]) == (
        "alice/first-run", "first-run", "python", "notebook")
    assert push["text"] == kc.notebook_text(nb) and len(push["text"].encode()) < kc.NOTEBOOK_LIMIT_BYTES
    assert kaggle_lab.emu.account("alice").key not in json.dumps(kaggle_lab.emu.recorded())

    # A second kernel reads the first one's output as a kernel source.
    alice.push_kernel("second-run", "second-run", make_notebook(READ_KERNEL_SOURCE),
                      kernel_sources=["alice/first-run"], gpu=False)
    assert wait_kernel(alice, "second-run") == ("COMPLETE", "")
    alice.kernel_output("second-run", tmp_path / "out2")
    assert (tmp_path / "out2" / "continued.txt").read_text() == "continued from hello from the dataset 0"
    second = kaggle_lab.emu.recorded("SaveKernel")[1]["body"]
    assert second["enableGpu"] is False and "machineShape" not in second
    assert second["dockerImagePinningType"] == "latest"  # every version on the image Kaggle runs now


def test_a_session_stopped_at_its_time_limit_gets_sigterm_first(kaggle_lab, tmp_path):
    bob = kaggle_lab.client("bob")
    # 360 emulated seconds = 6 wall seconds at the tests' time scale.
    bob.push_kernel("slow-run", "slow-run", make_notebook(SAVER_CELL, SLEEP_CELL), timeout_s=360)
    status, failure = wait_kernel(bob, "slow-run", timeout_s=40)
    # Kaggle's runtime cut-off, as two projects saw it: CANCEL_ACKNOWLEDGED, no reason given.
    assert (status, failure) == ("CANCEL_ACKNOWLEDGED", "")
    bob.kernel_output("slow-run", tmp_path / "out")
    assert (tmp_path / "out" / "sigterm.txt").read_text() == "saved at SIGTERM"


def test_a_session_stopped_when_the_quota_runs_out_gets_sigterm_first(kaggle_lab, tmp_path):
    bob = kaggle_lab.client("bob")
    bob.push_kernel("long-run", "long-run", make_notebook(SAVER_CELL, SLEEP_CELL), timeout_s=12 * 3600)
    working = kaggle_lab.emu.session("bob", "long-run").working
    deadline = time.monotonic() + 60
    while not (working / "started.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the notebook's handler is in place, however slow this machine is
    used = kaggle_lab.emu.account("bob").gpu_used_s
    kaggle_lab.emu.set_quota("bob", total_s=used + 60)  # one wall second of GPU left
    status, failure = wait_kernel(bob, "long-run", timeout_s=40)
    assert status == "ERROR" and "quota ran out" in failure
    bob.kernel_output("long-run", tmp_path / "out")
    assert (tmp_path / "out" / "sigterm.txt").read_text() == "saved at SIGTERM"
    assert bob.quota().left_s == 0
    with pytest.raises(kc.KaggleError, match="GPU quota") as e:
        bob.push_kernel("next-run", "next-run", make_notebook("print(1)"))
    assert "another account" in str(e.value)


def test_a_push_over_the_gpu_session_limit_is_a_clear_error(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(queue_s=600), tmp_path, monkeypatch)
    alice = lab.client("alice")
    for slug in ("gpu-run-1", "gpu-run-2"):
        alice.push_kernel(slug, slug, make_notebook("print(1)"))
    with pytest.raises(kc.KaggleError) as e:
        alice.push_kernel("gpu-run-3", "gpu-run-3", make_notebook("print(1)"))
    assert "Maximum batch GPU session count of 2 reached" in str(e.value)
    assert "'alice'" in str(e.value) and "another account" in str(e.value)
    assert lab.emu.kernel_versions("alice", "gpu-run-3") == []
    assert alice.push_kernel("cpu-run-1", "cpu-run-1", make_notebook("print(1)"), gpu=False).version == 1
    assert lab.client("bob").push_kernel("gpu-run-1", "gpu-run-1", make_notebook("print(1)")).version == 1


def test_bursts_of_429_and_5xx_are_retried_and_nothing_is_lost(kaggle_lab, tmp_path):
    emu, alice = kaggle_lab.emu, kaggle_lab.client("alice")
    # A push is repeated only on a readable 429: a 5xx may come after Kaggle took it (unsure: the caller
    # reads the kernel back, tests/machines/test_kaggle_overnight.py).
    faults = [("GetAcceleratorQuotaStatistics", 429, 2), ("GetDatasetStatus", 503, 2), ("StartBlobUpload", 503, 2),
              ("upload", 503, 1), ("CreateDataset", 500, 1), ("GetDataset", 502, 1), ("SaveKernel", 429, 1),
              ("GetKernelSessionStatus", 503, 2), ("ListKernelSessionOutput", 502, 1), ("download", 503, 1)]
    for method, status, count in faults:
        emu.inject_faults(method, status, count, retry_after=0 if status == 429 else None)

    assert alice.quota().total_s == 30 * 3600
    assert alice.upload_dataset("train-inputs", data_folder(tmp_path), "Train inputs") == 1
    alice.wait_dataset_ready("train-inputs", timeout_s=10, poll_s=0.05)
    assert alice.push_kernel("first-run", "first-run", make_notebook(READ_INPUT_AND_WRITE),
                             dataset_sources=["alice/train-inputs"]).version == 1
    assert wait_kernel(alice, "first-run") == ("COMPLETE", "")
    files = alice.kernel_output("first-run", tmp_path / "out", page_size=3)
    assert len(files) == 6 and (tmp_path / "out" / "out2.txt").read_text() == "hello from the dataset 2"

    assert emu.dataset_versions("alice", "train-inputs") == [1]
    assert emu.kernel_versions("alice", "first-run") == [1]
    injected = sum(count for _, _, count in faults)
    assert sum(1 for r in emu.recorded() if r.get("fault")) == injected  # every fault was met, and retried


def test_a_push_whose_reply_is_lost_is_not_repeated(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(queue_s=600), tmp_path, monkeypatch)
    lab.emu.inject_faults("SaveKernel", 500, after=True)  # Kaggle started it; the reply got lost
    with pytest.raises(kc.KaggleError, match="may or may not have done it"):
        lab.client("alice").push_kernel("lost-reply", "lost-reply", make_notebook("print(1)"))
    assert lab.emu.kernel_versions("alice", "lost-reply") == [1]
    assert len(lab.emu.recorded("SaveKernel")) == 1


def test_a_call_that_hangs_times_out_and_a_push_that_hangs_is_not_repeated(make_kaggle_emulator, tmp_path,
                                                                            monkeypatch):
    lab = lab_for(make_kaggle_emulator(queue_s=600), tmp_path, monkeypatch)
    alice = lab.client("alice", timeout_s=0.5)
    lab.emu.inject_delay("GetAcceleratorQuotaStatistics", 2.0)
    started = time.monotonic()
    assert alice.quota().total_s == 30 * 3600  # the first try timed out, the second answered
    assert time.monotonic() - started < 1.8
    lab.emu.inject_delay("SaveKernel", 1.0)
    with pytest.raises(kc.KaggleError, match="may or may not have done it"):
        alice.push_kernel("slow-push", "slow-push", make_notebook("print(1)"))
    time.sleep(1.0)  # Kaggle did finish it: one version, not two
    assert lab.emu.kernel_versions("alice", "slow-push") == [1]


def test_an_unreachable_kaggle_is_retried_then_reported(kaggle_lab, monkeypatch):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    monkeypatch.setenv("LAB_KAGGLE_API_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(kc.KaggleError, match="failed 3 times") as e:
        kaggle_lab.client("alice", retry=kc.RetryPolicy(attempts=3, base_s=0.01)).quota()
    assert e.value.retryable and "try again in a few minutes" in str(e.value)


def test_kaggles_push_refusals_are_clear_errors(make_kaggle_emulator, tmp_path, monkeypatch):
    lab = lab_for(make_kaggle_emulator(queue_s=600), tmp_path, monkeypatch)
    alice, bob = lab.client("alice"), lab.client("bob")
    lab.emu.fail_next_push("alice", "Notebook could not be saved.")
    with pytest.raises(kc.KaggleError, match="refused the push of alice/some-run: Notebook could not be saved"):
        alice.push_kernel("some-run", "some-run", make_notebook("print(1)"))

    bob.upload_dataset("bobs-private-data", data_folder(tmp_path), "Bob private data")
    with pytest.raises(kc.KaggleError) as e:
        alice.push_kernel("some-run", "some-run", make_notebook("print(1)"),
                          dataset_sources=["bob/bobs-private-data"], kernel_sources=["alice/no-such-kernel"])
    assert "bob/bobs-private-data" in str(e.value) and "alice/no-such-kernel" in str(e.value)
    assert e.value.push is not None and e.value.push.version == 1  # Kaggle ran it without them


def test_pushes_kaggle_would_refuse_are_refused_before_sending(kaggle_lab):
    alice = kaggle_lab.client("alice")
    big = make_notebook("x = '" + "a" * 1_100_000 + "'")
    with pytest.raises(UserError, match="1.10 MB; Kaggle takes at most 1 MB"):
        alice.push_kernel("big-run", "big-run", big)
    with pytest.raises(UserError, match="does not make the slug"):
        alice.push_kernel("some-run", "Another title", make_notebook("print(1)"))
    assert kaggle_lab.emu.recorded("SaveKernel") == []


def test_checkpoint_datasets_of_finished_runs_are_listed_with_size_and_removed_on_request(kaggle_lab, tmp_path,
                                                                                        capsys):
    from lab.machines.kaggle.names import ckpt_slug
    from lab.runs import Settled, create_run, updating
    from lab.config import RunConfig
    done, going = create_run(Settled.whole(RunConfig(steps_until=5))), create_run(Settled.whole(RunConfig(steps_until=5)))
    with updating(done.id) as r:
        r.status = "done"
    with updating(going.id) as r:
        r.status = "running"
    alice = kaggle_lab.client("alice")
    for run, size in ((done, 3_000_000), (going, 1_000_000)):
        folder = tmp_path / run.id
        folder.mkdir()
        (folder / "ckpt_00000005.pt").write_bytes(b"w" * size)
        alice.upload_dataset(ckpt_slug(run.id), folder, ckpt_slug(run.id))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not the lab's")
    alice.upload_dataset("my-own-dataset", other, "my own dataset")

    assert accounts("checkpoints") == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("alice")]
    assert len(listed) == 2 and "my-own-dataset" not in out
    assert any(done.id in line and "3.0 MB" in line and "done" in line for line in listed)
    assert any(going.id in line and "1.0 MB" in line and "running" in line for line in listed)
    # Each account's dataset storage, all of it and the lab's (the lab keeps no older versions).
    assert "Dataset storage" in out and "kaggle-cli#284" in out
    assert "alice: 4.0 MB in 3 dataset(s), the lab's 4.0 MB in 2" in out and "bob: 0.0 MB in 0 dataset(s)" in out

    assert accounts("checkpoints", "alice", "--remove", going.id) == 2  # a run going on keeps its hand-off
    assert "cancel it first" in capsys.readouterr().err
    assert accounts("checkpoints", "alice", "--remove-finished") == 0
    assert f"alice/{ckpt_slug(done.id)}" in capsys.readouterr().out
    assert kaggle_lab.emu.dataset_versions("alice", ckpt_slug(done.id)) == []
    assert kaggle_lab.emu.dataset_versions("alice", ckpt_slug(going.id)) == [1]
    assert kaggle_lab.emu.dataset_versions("alice", "my-own-dataset") == [1], "only the lab's checkpoints go"


def test_plain_http_is_taken_only_for_this_computer_so_a_key_never_travels_in_the_clear(monkeypatch):
    for url in ("http://127.0.0.1:8790", "http://localhost:8790/", "http://[::1]:8790", "https://api.kaggle.com",
                "https://proxy.example.org/kaggle"):
        monkeypatch.setenv("LAB_KAGGLE_API_URL", url)
        assert kc.api_url() == url.rstrip("/")
    for url in ("http://api.kaggle.com", "http://10.0.0.5:8790", "http://127.0.0.1.example.org"):
        monkeypatch.setenv("LAB_KAGGLE_API_URL", url)
        with pytest.raises(UserError, match="in the clear"):
            kc.api_url()


def test_a_kaggle_client_older_than_2_2_5_is_refused_with_how_to_upgrade():
    from lab.kaggle.transport import check_kaggle_version
    for ok in ("2.2.5", "2.3.0", "10.0"):
        check_kaggle_version(ok)
    with pytest.raises(UserError, match=r"kaggle>=2.2.5.*pip install -U"):
        check_kaggle_version("1.7.4.5")


def test_kaggle_refuses_a_second_dataset_title_and_an_unknown_licence_and_the_kit_sends_neither(kaggle_lab, tmp_path):
    alice = kaggle_lab.client("alice")
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    alice.upload_dataset("first-dataset", folder, "same title")
    with pytest.raises(kc.KaggleError, match="title .* is already in use"):
        alice.upload_dataset("second-dataset", folder, "same title")
    with pytest.raises(UserError, match="no dataset licence 'CC BY 4.0'"):
        alice.upload_dataset("third-dataset", folder, "third title", licence="CC BY 4.0")
    alice.upload_dataset("third-dataset", folder, "third title", licence="CC-BY-4.0")
    sent = kaggle_lab.emu.recorded("CreateDataset")[-1]["body"]
    assert sent["licenseName"] == "CC-BY-4.0" and sent["isPrivate"] is True
