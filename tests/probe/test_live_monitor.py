"""The control notebook's monitor and machines panel with what the log and the probe told:
the live curve of a session still running elsewhere, the note when its log comes only at the
end, and each account's probe result with its age."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from lab import ui
from lab.config import RunConfig
from lab.kaggle.logs import LIVE_ROWS, LIVE_STATE
from lab.kaggle.probed import store_probe as store
from lab.api import machines as api_machines
from lab.runs import Link, Settled, create_run, updating
from lab.ui import console


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "lab-home"))
    console.machines.forget()
    ui.set_language("ru")
    yield
    from lab.ui.monitor import _monitors
    for m in _monitors:
        m.close()


def text(html: str) -> str:
    import html as html_lib
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip())


def running_kaggle_run(mode: str, rows: list[dict]):
    """A run whose second link runs on a Kaggle account; the first link's curve is back."""
    run = create_run(Settled.whole(RunConfig(context=32, width=32, heads=2, layers=2, steps_until=100)))
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 9.0 - s / 10}) + "\n"
                                                      for s in range(1, 41)))
    folder = run.folder / "links" / "002-alice"
    folder.mkdir(parents=True)
    (folder / LIVE_STATE).write_text(json.dumps({"mode": mode, "grace_s": 300, "rows": len(rows)}))
    (folder / LIVE_ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", status="stopped", from_step=0, to_step=40),
                   Link(n=2, machine="alice", kind="kaggle", status="running", from_step=40,
                        detail={"folder": "links/002-alice"})]
        r.status = "running"
    return run


def test_the_monitor_draws_a_running_sessions_curve_from_its_log():
    run = running_kaggle_run("live", [{"step": s, "loss": 4.0 - s / 100} for s in (50, 60, 70)])
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert monitor.status.live["rows"][-1]["step"] == 70
    assert monitor.plot.layout.display is None and bytes(monitor.plot.value).startswith(b"\x89PNG")
    before = bytes(monitor.plot.value)
    with open(run.folder / "links" / "002-alice" / LIVE_ROWS, "a") as f:
        f.write(json.dumps({"step": 80, "loss": 3.1}) + "\n")
    monitor.refresh()
    assert bytes(monitor.plot.value) != before  # the curve moved while the session runs
    assert "журнал" not in text(monitor.state.value)


def test_the_monitor_says_when_kaggle_shows_the_log_only_at_the_end():
    run = running_kaggle_run("at_end", [])
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert "не показывает журнал" in text(monitor.state.value)
    ui.set_language("en")
    assert "does not show this session's log until it ends" in text(monitor.state.value)


def test_the_machines_panel_shows_each_accounts_probe_and_its_age(monkeypatch):
    from lab.machines.auto import Machine
    monkeypatch.setattr(console.machines, "machines", lambda refresh=False: [
        Machine("alice", "kaggle", "2xT4", quota_left_h=20, quota_total_h=30),
        Machine("bob", "kaggle", "2xT4", quota_left_h=30, quota_total_h=30),
        Machine("carol", "kaggle", "2xT4", quota_left_h=30, quota_total_h=30)])
    at = (datetime.now(timezone.utc) - timedelta(hours=3)).isoformat(timespec="seconds")
    from lab.home import accounts_dir
    for name in ("alice", "bob"):
        (accounts_dir() / name).mkdir(parents=True)
    store("alice", {"account": "alice", "at": at, "can_run": True, "gpu": "2xT4", "tok_s": 101500.0,
                    "all_reduce": {"ok": True}, "log_while_running": True})
    store("bob", {"account": "bob", "at": at, "can_run": False, "why": "Kaggle refused a GPU session: phone",
                  "why_ru": "Kaggle отказал в сессии GPU: телефон"})
    panel = ui.MachinesPanel()
    lines = {c: w for w in _walk(panel.box) for c in getattr(w, "_dom_classes", ()) if c.startswith("lab-probe-")}
    assert set(lines) == {"lab-probe-alice", "lab-probe-bob", "lab-probe-carol"}
    assert "2xT4, 101 500 ток/с, all-reduce ок" in text(lines["lab-probe-alice"].value)
    assert "3 ч назад" in text(lines["lab-probe-alice"].value)
    assert "не может" in text(lines["lab-probe-bob"].value) and "#d32f2f" in lines["lab-probe-bob"].value
    assert "пробы ещё не было" in text(lines["lab-probe-carol"].value)  # "проба" is feminine: no "не проверен"
    ui.set_language("en")
    panel.render()
    lines = {c: w for w in _walk(panel.box) for c in getattr(w, "_dom_classes", ()) if c.startswith("lab-probe-")}
    assert "101,500 tok/s" in text(lines["lab-probe-alice"].value) and "3 h ago" in text(lines["lab-probe-alice"].value)


def _walk(w):
    yield w
    for child in getattr(w, "children", ()):
        yield from _walk(child)
