"""The loop's parts, one by one: the sync window, the metrics sink, the saver's clock, the progress
line; the stop signals they share with the launcher; and the cheap live plot."""
import json
import os
import signal
import sys
import time

import pytest
import torch

from lab.kernel import sync
from lab.kernel.saver import Saver
from lab.kernel.sync import MetricsSink, Progress, SyncWindow
from lab.kernel.metrics import METRICS_MARK, MetricsTail
from lab.kernel.plots import LiveCurve
from lab.kernel.signals import catching_stop_signals, run_group
from lab.kernel.step import Runtime

ONE = Runtime(0, 1, torch.device("cpu"), "fp32", cards=1)


def test_the_sync_window_reads_its_logged_steps_in_one_go_and_sets_the_next_sync_point():
    window = SyncWindow(ONE, step=10, tokens=1000)
    assert window.due(11) and not window.due(10)
    for step in (11, 12, 13):
        row = {"step": step, "loss": None} if step != 12 else None  # step 12 is not logged
        window.stepped(torch.tensor(float(step)), torch.tensor(0.5), row)
    time.sleep(0.05)
    rows, flags = window.sync(13, 1300, [1.0, 0.0], within_s=10.0)
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in rows] == [(11, 11.0, 0.5), (13, 13.0, 0.5)]
    assert flags == [1.0, 0.0]
    assert 0 < rows[0]["tok_s"] < 300 / 0.05 and rows[0]["tok_s"] == rows[1]["tok_s"]
    assert 0.05 / 3 <= window.step_s < 1.0 and window.apart >= 1 and window.next_sync == 13 + window.apart
    assert window.ahead_s() == pytest.approx(window.step_s * window.apart)
    window.restart(1300)
    assert window.steps == 0 and window.sync(13, 1300, [], within_s=10.0)[0] == []


def test_the_next_sync_point_comes_closer_when_a_save_or_the_limit_is_near():
    window = SyncWindow(ONE, step=0, tokens=0)
    window.step_s = 0.01
    window.sync(0, 0, [], within_s=10.0)
    assert window.apart == 64  # ~a second of steps, at most 64
    window.sync(64, 0, [], within_s=0.05)
    assert window.apart == 5


def test_the_window_counts_the_steps_the_grad_scaler_skipped_logged_or_not():
    window = SyncWindow(ONE, step=0, tokens=0, scaled=True)
    window.stepped(torch.tensor(1.0), torch.tensor(float("inf")), {"step": 1})
    window.stepped(torch.tensor(1.0), torch.tensor(float("nan")), None)
    window.stepped(torch.tensor(1.0), torch.tensor(2.0), {"step": 3})
    rows, _ = window.sync(3, 0, [], within_s=1.0)
    assert rows[0]["skipped"] is True and "skipped" not in rows[1] and window.skipped == 2
    window.stepped(torch.tensor(1.0), torch.tensor(float("inf")), None)
    window.sync(4, 0, [], within_s=1.0)
    assert window.skipped == 3


def test_the_metrics_sink_writes_echoes_and_hands_on_each_row(tmp_path, capsys):
    seen = []
    rows = [{"step": 1, "loss": 2.5, "elapsed_s": 0.1, "session": 7}, {"step": 1, "val_loss": 2.4, "session": 7}]
    with MetricsSink(tmp_path / "metrics.jsonl", seen.append) as sink:
        sink.write(rows)
        assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == rows
        sink.write([])
    assert seen == rows
    assert capsys.readouterr().out.count(METRICS_MARK) == 2
    with MetricsSink(None, seen.append) as other_rank:
        other_rank.write(rows)
    assert len(seen) == 2


def test_the_saver_is_due_on_its_clock_and_measures_what_a_save_costs():
    written = iter([None, "ckpt_2.pt", None])

    def save():
        time.sleep(0.02)
        return next(written)

    saver = Saver(save, weights=10_000_000, every_min=0.001)  # every 60 ms
    assert saver.cost_s == pytest.approx(0.5 + 10_000_000 * 16 / 200e6)  # estimated until one is measured
    assert not saver.due()
    time.sleep(0.07)
    assert saver.due()
    saver.save()
    assert saver.path is None and 0.02 <= saver.cost_s < 1 and not saver.due()
    saver.save()
    saver.save()  # a failed save keeps the newest checkpoint written
    assert saver.path == "ckpt_2.pt"


def test_progress_lines_come_at_once_then_at_most_every_ten_seconds():
    said = []
    progress = Progress(50, said.append)
    row = {"step": 3, "loss": 2.0, "lr": 1e-3, "tok_s": 1234.0, "elapsed_s": 5.0}
    progress.show([{"step": 3, "val_loss": 1.0}])  # no training row: nothing to say
    progress.show([row])
    progress.show([row])
    assert said == ["step 3/50 loss 2.0000 lr 1.00e-03 1,234 tok/s 5s"]
    progress.last -= sync.PROGRESS_EVERY_S
    progress.show([row])
    assert len(said) == 2


# --- stop signals ---------------------------------------------------------------------------

def test_the_first_stop_signal_asks_and_a_second_interrupts():
    asked = []
    with catching_stop_signals(asked.append) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        assert asked == ["SIGTERM"] and caught["signal"] == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_catcher_that_never_abandons_hears_every_signal_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGINT)
    asked = []
    with catching_stop_signals(asked.append, again_interrupts=False):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    assert asked == ["SIGINT", "SIGTERM"] and signal.getsignal(signal.SIGINT) is before


def test_a_timeout_ends_the_whole_process_group_not_only_its_leader(tmp_path):
    """As torchrun's workers are: a child of the command that would outlive a plain kill."""
    pid_file = tmp_path / "child.pid"
    cmd = [sys.executable, "-c",
           "import subprocess, sys, time\n"
           f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
           f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
           "print('started', flush=True)\n"
           "time.sleep(120)\n"]
    proc, timed_out = run_group(cmd, timeout_s=3, grace_s=2)
    assert timed_out and "started" in proc.stdout
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child), "the leader's child was left running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_command_that_finishes_in_time_gives_its_output():
    proc, timed_out = run_group([sys.executable, "-c", "print('hi')"], timeout_s=60)
    assert not timed_out and proc.returncode == 0 and proc.stdout == "hi\n"


# --- the live plot --------------------------------------------------------------------------

def test_the_metrics_tail_reads_only_what_was_appended_and_starts_over_on_a_new_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == ([], False)
    path.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "lo')  # the second line still being written
    assert tail.read() == ([{"step": 1, "loss": 3.0}], True)
    with path.open("a") as f:
        f.write('ss": 2.9}\n{"step": 3, "loss": 2.8}\n')
    assert tail.read() == ([{"step": 2, "loss": 2.9}, {"step": 3, "loss": 2.8}], False)
    assert tail.read() == ([], False)
    replaced = tmp_path / "new.jsonl"
    replaced.write_text('{"step": 1, "loss": 3.0}\n')
    os.replace(replaced, path)  # a resumed session cuts the curve at its checkpoint
    assert tail.read() == ([{"step": 1, "loss": 3.0}], True)


def test_a_long_curve_is_drawn_from_a_few_thousand_points_with_every_evaluation():
    curve = LiveCurve(most=1000)
    rows = [{"step": s, "tokens": s * 10, "loss": 5.0 - s / 100_000, "session": 1 + (s > 60_000)}
            for s in range(1, 100_001)]
    for s in range(1000, 100_001, 1000):
        rows[s - 1] = {**rows[s - 1], "val_loss": 4.0, "val_set": "a"}
    for start in range(0, len(rows), 7_000):  # as the redraws see them: a batch at a time
        curve.add(rows[start:start + 7_000])
    train = [r for r in curve.rows() if "loss" in r]
    assert 500 <= len(train) <= 1000 and sum(r["n"] for r in train) == 100_000
    assert len([r for r in curve.rows() if "val_loss" in r]) == 100
    assert all(r["session"] == 1 for r in train if r["step"] <= 60_000)  # no point mixes two sessions
    assert train[-1]["step"] == 100_000
    assert abs(sum(r["loss"] * r["n"] for r in train) / 100_000 - sum(r["loss"] for r in rows) / 100_000) < 1e-9


def test_a_redraw_reads_the_new_rows_only(tmp_path, monkeypatch):
    from lab.kernel import session
    pytest.importorskip("IPython")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0, "session": 1}) + "\n"
                                                    for s in range(1, 5001)))
    plot = session.LivePlot(tmp_path, every_s=0)
    monkeypatch.setattr(session, "read_metrics", lambda *a: pytest.fail("the whole curve read again"))
    drawn = []
    monkeypatch.setattr(session, "loss_figure", lambda runs, **kw: drawn.append(runs[tmp_path.name]) or _figure())
    plot.update()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5001, "loss": 2.0, "session": 1}) + "\n")
    plot.update()
    assert len(drawn) == 2 and len(drawn[0]) <= 2000 and drawn[1][-1]["step"] == 5001
    assert plot.tail.offset == (tmp_path / "metrics.jsonl").stat().st_size


def _figure():
    from matplotlib.figure import Figure
    return Figure(figsize=(1, 1))
