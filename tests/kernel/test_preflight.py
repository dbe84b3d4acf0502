"""The session's first checks (lab.kernel.preflight): the cards it was pushed for, the image, NCCL."""
from __future__ import annotations

import json
import os
import time

import pytest

from lab.kernel.preflight import NO_GPU, PREFLIGHT, TIMELINE, NoCards, cards_missing, preflight

T4 = {"name": "Tesla T4", "capability": "7.5", "memory_gb": 15.8}
P100 = {"name": "Tesla P100-PCIE-16GB", "capability": "6.0", "memory_gb": 17.1}


def test_two_cards_of_capability_seven_or_more_make_gpu_t4_x2():
    assert cards_missing("2xT4", [T4, T4]) is None
    assert "it has 1" in cards_missing("2xT4", [T4])
    # A P100 has no kernels in the image's torch (sm_70 and up): it does not count.
    assert "it has 1 of 2 found" in cards_missing("2xT4", [T4, P100])
    assert "it has 0" in cards_missing("2xT4", [])
    assert cards_missing("", []) is None  # nothing expected: a session on this computer


def test_a_session_without_its_cards_stops_with_what_it_found_unless_the_cpu_is_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_COMMIT", "abc123")
    monkeypatch.setenv("BUILD_DATE", "20261201-000000")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "0")  # restored after: preflight sets it in this process
    started = time.time()
    with pytest.raises(NoCards, match="NO GPU: pushed for 2xT4"):
        preflight("2xT4", False, {}, tmp_path / "stopped", started)
    found = json.loads((tmp_path / "stopped" / NO_GPU).read_text())
    assert found["expected"] == "2xT4" and found["found"] == [] and found["image"]["git_commit"] == "abc123"
    assert json.loads((tmp_path / "stopped" / TIMELINE).read_text())["first_cell"] == started

    timeline = preflight("2xT4", True, {"NCCL_P2P_DISABLE": "1"}, tmp_path / "cpu", started)
    assert not (tmp_path / "cpu" / NO_GPU).exists() and os.environ["NCCL_P2P_DISABLE"] == "1"
    facts = json.loads((tmp_path / "cpu" / PREFLIGHT).read_text())
    assert facts["allow_cpu"] and facts["image"]["build_date"] == "20261201-000000" and facts["image"]["torch"]
    timeline.mark("inputs_checked")
    marks = json.loads((tmp_path / "cpu" / TIMELINE).read_text())
    assert marks["first_cell"] <= marks["cards_checked"] <= marks["inputs_checked"]


def test_the_start_line_says_the_image_where_there_is_one_and_nothing_unknown_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    monkeypatch.delenv("BUILD_DATE", raising=False)
    preflight("", False, {}, tmp_path / "here", time.time())  # this computer: no image files, no card
    line, cards = capsys.readouterr().out.splitlines()[:2]
    assert "?" not in line and "None" not in line and line.startswith("software   python ") and "torch " in line
    assert cards == "cards      none: the CPU"

    monkeypatch.setenv("GIT_COMMIT", "abc123")
    monkeypatch.setenv("BUILD_DATE", "20261201-000000")
    preflight("", False, {}, tmp_path / "kaggle", time.time())
    assert capsys.readouterr().out.splitlines()[0].startswith("image      abc123 (20261201-000000), python ")
