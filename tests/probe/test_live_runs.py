"""A Kaggle run's live curve while its session runs (the emulator, the real client, the real
training notebook): the driver reads the session's log as it polls, `lab watch` prints the rows,
the monitor's status carries them, and the session's own metrics.jsonl replaces them."""
from __future__ import annotations

import threading
import time

import pytest

from kaggle_fixtures import (fast_driving, kaggle_emulator, kaggle_lab, kaggle_settings, lab_for,  # noqa: F401
                             make_kaggle_emulator)
from lab.config import RunConfig
from lab.kernel.metrics import read_metrics
from lab.machines import control
from lab import settle
from lab.api import runs as api_runs
from lab.machines import driver as machines
from lab.machines.kaggle import host as km
from lab.machines.kaggle import names as kn
from lab.machines.kaggle import data as kd
from lab.machines.live import curve_rows

TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=20, eval_batches=2, lr=3e-3,
            warmup_steps=2, steps_until=120)


@pytest.fixture
def paced(pydoc_data, make_kaggle_emulator, tmp_path, monkeypatch):
    def make(**options):
        lab = lab_for(make_kaggle_emulator(min_step_s=0.04, **options), tmp_path, monkeypatch)
        fast_driving(monkeypatch)
        lab.data = pydoc_data
        return lab
    yield make
    control.spawned.clear()


def _start(lab, monkeypatch, grace_s: float = 300.0):
    cfg = RunConfig(**TINY, data_dir=str(lab.data), constellations=["pydoc"])
    run = settle.register_run(cfg.to_dict(), machine="alice")
    lines: list[str] = []
    kaggle_settings(monkeypatch, kd.KaggleSettings(poll_s=0.2, retry_base_s=0.01, dataset_wait_s=20, allow_cpu=True,
                                                   log_grace_s=grace_s))
    t = threading.Thread(target=machines.drive, args=(run.id,), kwargs=dict(say=lines.append, progress=False),
                         daemon=True)
    t.start()
    return run.id, lines, t


def _while_running(run_id: str, predicate, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = api_runs.status(run_id)
        got = predicate(state)
        if got:
            return state
        if state.status not in ("new", "running", "waiting"):
            raise AssertionError(f"the run ended ({state.status}) before: {state.message} {state.links}")
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_monitor_and_watch_see_a_kaggle_runs_curve_while_its_session_runs(paced, monkeypatch):
    lab = paced()
    run_id, lines, t = _start(lab, monkeypatch)
    state = _while_running(run_id, lambda s: s.live and len(s.live["rows"]) >= 2
                           and s.links[-1].status == "running")
    assert state.live["mode"] in ("waiting", "live") and state.live["note_en"] is None
    from lab.runs import load_run
    run = load_run(run_id)
    assert not read_metrics(run.folder)  # nothing came back yet: the curve is the log's
    assert [r["step"] for r in curve_rows(run)] == [r["step"] for r in state.live["rows"]]
    t.join(180)
    assert not t.is_alive()
    assert any(line.startswith("link 1: step ") and line.endswith("(live)") for line in lines), lines
    final = api_runs.status(run_id)
    assert final.status == "done" and final.live is None
    authoritative = read_metrics(load_run(run_id).folder)
    assert curve_rows(load_run(run_id)) == authoritative and authoritative[-1]["step"] == 120
    live_steps = {r["step"] for r in state.live["rows"]}
    assert live_steps <= {r["step"] for r in authoritative}  # the preview was the same curve


def test_an_account_whose_probe_found_the_log_kept_until_the_end_is_said_so_at_once(paced, monkeypatch):
    from lab.kaggle.probed import store_probe as store
    lab = paced()
    lab.emu.log_while_running = False
    store("alice", {"account": "alice", "at": "2026-11-30T10:00:00+00:00", "can_run": True, "gpu": "2xT4",
                    "log_while_running": False, "nccl_env": {"NCCL_P2P_DISABLE": "1"}})
    run_id, lines, t = _start(lab, monkeypatch, grace_s=3600)  # no waiting an hour: the probe already knows
    state = _while_running(run_id, lambda s: s.live and s.live["note_en"])
    assert "the account's probe found so" in state.live["note_en"]
    t.join(180)
    assert api_runs.status(run_id).status == "done"
    # The NCCL setting the account's probe found working: the push carries it, the session sets it.
    from lab.runs import load_run
    link = load_run(run_id).links[0]
    assert link.detail["kernel"]["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    log = (load_run(run_id).folder / link.detail["folder"] / f"{kn.kernel_slug(run_id, 1)}.log").read_text()
    assert "NCCL NCCL_P2P_DISABLE=1 (the account's probe)" in log
