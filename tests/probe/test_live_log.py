"""Live curves of a session still running on (emulated) Kaggle: the log stream, read with the
real `kaggle` client over HTTP while the session runs, and the metrics lines in it."""
from __future__ import annotations

import time

from lab.kaggle.logs import LIVE_ROWS, LiveLog, read_live
from lab.kernel.metrics import echo_metrics, metrics_line, parse_metrics_line
from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator, make_notebook  # noqa: F401

# A notebook that prints a metrics line every 0.2 s for a few seconds, then waits for a file.
PRINTING = """
import json, os, pathlib, time
work = pathlib.Path(os.environ["LAB_KAGGLE_ROOT"]) / "working"
print("started", flush=True)
for step in range(1, 6):
    print("@lab-metrics " + json.dumps({"step": step, "loss": 10.0 / step, "session": 1}), flush=True)
    time.sleep(0.2)
while not (work / "go").exists():
    time.sleep(0.05)
"""


def _wait(predicate, timeout_s: float = 60.0, what: str = "a condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_metrics_line_round_trips_and_other_lines_are_not_rows():
    row = {"step": 40, "tokens": 5120, "loss": 4.25, "lr": 1e-3, "tok_s": 812.5, "elapsed_s": 12.0, "session": 2,
           "sample": "a long sample text"}
    line = metrics_line(row)
    assert "\n" not in line and "sample" not in line
    back = parse_metrics_line("[stdout] " + line)
    assert back == {k: v for k, v in row.items() if k != "sample"}
    assert parse_metrics_line("step 40/100 loss 4.25") is None
    assert parse_metrics_line("@lab-metrics {not json") is None
    assert parse_metrics_line('@lab-metrics {"loss": 1.0}') is None  # a row has its step


def test_the_loop_echoes_a_row_every_few_seconds_and_every_evaluation(capsys):
    printed = [echo_metrics({"step": s, "loss": 1.0, "elapsed_s": s * 1.0, "session": 77}, every_s=10)
               for s in range(1, 31)]
    assert [s for s, p in zip(range(1, 31), printed) if p] == [1, 11, 21]
    assert echo_metrics({"step": 31, "val_loss": 2.0, "elapsed_s": 31.5, "session": 77}, every_s=10)
    assert echo_metrics({"step": 1, "loss": 1.0, "elapsed_s": 0.5, "session": 77}, every_s=10)  # a new run here
    lines = capsys.readouterr().out.splitlines()
    assert [parse_metrics_line(x)["step"] for x in lines] == [1, 11, 21, 31, 1]


def _push(lab, slug: str):
    c = lab.client("alice")
    pushed = c.push_kernel(f"alice/{slug}", slug, make_notebook(PRINTING), gpu=True)
    return c, pushed


def test_a_running_sessions_log_streams_its_metrics_lines_before_it_ends(kaggle_lab, tmp_path):
    c, pushed = _push(kaggle_lab, "live-curve")
    live = LiveLog(c, "alice/live-curve", pushed.version, tmp_path / "link", grace_s=600, retry_s=0.2).start()
    try:
        rows = _wait(lambda: len(live.rows()) == 5 and live.rows(), what="five live rows")
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
        asked = time.monotonic()
        status, _ = c.kernel_status("alice/live-curve", pushed.version)
        assert status == "RUNNING"  # the curve came while the session runs
        assert live.seen_status(status, asked) == "live"
        assert kaggle_lab.emu.recorded("LogsStream")  # through the real client's stream call
        live.stop(wait_s=0.5)
        # A driver after this one: the stream replays from the first line; what was read is skipped,
        # not taken into the curve again (no row twice, and old lines do not make the log "live").
        asked = len(kaggle_lab.emu.recorded("LogsStream"))
        again = LiveLog(c, "alice/live-curve", pushed.version, tmp_path / "link", retry_s=0.1).start()
        assert again.events == live.events and [r["step"] for r in again.rows()] == [1, 2, 3, 4, 5]
        (kaggle_lab.emu.session("alice", "live-curve").working / "go").write_text("")
        kaggle_lab.emu.wait_session("alice", "live-curve")
        # The live stream to its end, then the stored log: each replayed from the first line, and
        # each line handled once over all the connections and both drivers.
        _wait(lambda: len(kaggle_lab.emu.recorded("LogsStream")) > asked + 1, what="the log read again after the end")
        total = sum(1 for _ in c.kernel_log_events("alice/live-curve", pushed.version))
        _wait(lambda: again.events == total, what="the lines after the first driver's")
        assert again.events == total and [r["step"] for r in again.rows()] == [1, 2, 3, 4, 5]
        again.stop(wait_s=0.5)
    finally:
        (kaggle_lab.emu.session("alice", "live-curve").working / "go").write_text("")
        live.stop(wait_s=5)
    state, stored = read_live(tmp_path / "link")
    assert [r["step"] for r in stored] == [1, 2, 3, 4, 5]
    assert len((tmp_path / "link" / LIVE_ROWS).read_text().splitlines()) == 5


def test_a_log_kaggle_keeps_until_the_end_is_said_so_and_then_read(make_kaggle_emulator, tmp_path, monkeypatch):
    from kaggle_fixtures import lab_for
    emu = make_kaggle_emulator()
    emu.log_while_running = False
    lab = lab_for(emu, tmp_path, monkeypatch)
    c, pushed = _push(lab, "silent-log")
    now = [0.0]
    live = LiveLog(c, "alice/silent-log", pushed.version, tmp_path / "link", grace_s=60, retry_s=0.1,
                   clock=lambda: now[0]).start()
    try:
        _wait(lambda: emu.session("alice", "silent-log").status == "RUNNING", what="RUNNING")
        _wait(lambda: emu.recorded("LogsStream"), what="the stream asked")
        assert live.seen_status("RUNNING") == "waiting"
        now[0] = 61.0
        assert live.seen_status("RUNNING") == "at_end"
        assert live.rows() == [] and c.kernel_log("alice/silent-log") == ""
        (emu.session("alice", "silent-log").working / "go").write_text("")
        emu.wait_session("alice", "silent-log")
        _wait(lambda: len(live.rows()) == 5, what="the stored log after the end")
    finally:
        live.stop(wait_s=5)
    assert read_live(tmp_path / "link")[0]["mode"] == "at_end"


def test_a_line_that_came_after_the_status_was_asked_does_not_make_the_log_live(tmp_path):
    now = [10.0]
    live = LiveLog(None, "alice/x", 1, tmp_path, grace_s=60, clock=lambda: now[0])  # not started: fed by hand
    asked = now[0]  # the poll asks; meanwhile the session ends and its stored log arrives
    now[0] = 11.0
    live._take({"stream_name": "stdout", "data": "@lab-metrics {\"step\": 3}\n"})
    assert live.seen_status("RUNNING", asked) == "waiting"
    assert live.seen_status("RUNNING", 12.0) == "live"  # a later poll that still reads RUNNING


# Prints a line, stays silent longer than the client's HTTP timeout (a compile, a mount), prints again.
# Each line is followed by 600 bytes: the real client reads the stream 512 bytes at a time.
SILENT_STRETCH = """
import json, os, pathlib, time
work = pathlib.Path(os.environ["LAB_KAGGLE_ROOT"]) / "working"
print("@lab-metrics " + json.dumps({"step": 1, "loss": 5.0, "session": 1}) + "\\n" + "." * 600, flush=True)
time.sleep(3)
print("@lab-metrics " + json.dumps({"step": 2, "loss": 4.0, "session": 1}) + "\\n" + "." * 600, flush=True)
while not (work / "go").exists():
    time.sleep(0.05)
"""


def test_a_silent_stretch_longer_than_the_http_timeout_does_not_end_the_stream(make_kaggle_emulator, tmp_path,
                                                                              monkeypatch):
    from kaggle_fixtures import lab_for
    emu = make_kaggle_emulator()
    emu.log_keepalive_s = None  # whether Kaggle sends keep-alives is not known: none at all
    lab = lab_for(emu, tmp_path, monkeypatch)
    c = lab.client("alice", timeout_s=1.0)  # every other call gives up after a second of silence
    pushed = c.push_kernel("alice/quiet-run", "quiet-run", make_notebook(SILENT_STRETCH), gpu=True)
    live = LiveLog(c, "alice/quiet-run", pushed.version, tmp_path / "link", grace_s=600, retry_s=0.2).start()
    try:
        _wait(lambda: len(live.rows()) == 2, what="both rows, across the silent stretch")
        assert live.error is None and len(emu.recorded("LogsStream")) == 1, "one connection, never timed out"
    finally:
        (emu.session("alice", "quiet-run").working / "go").write_text("")
        live.stop(wait_s=5)
