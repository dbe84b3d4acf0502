"""A person's first day (issue 40), the control notebook's part: a cooldown branch that could only
repeat its parent is neither offered nor started, the monitor says where the session is now (not
where it was), each view speaks its own language with the form's labels and unbroken numbers, and
the small things: one Start, buttons as wide as their words, a glyph Chromium has.

Each test has its own fresh lab home (tests/ui/test_ui.py's fixture). Nothing here trains: runs,
links, checkpoints and the driver's words are written by hand, as the lab writes them.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest

from lab import ui
from lab.api import accounts as api_accounts
from lab.api import runs as api_runs
from lab.config import RunConfig, UserError
from lab.machines.control import DriverLock, logged
from lab.runs import Link, Settled, create_run, updating
from lab.ui.parts import walk
from test_ui import TINY, curve, fake_run, home, text  # noqa: F401 (the fixture)

NBSP = "\u00a0"


def wsd_run_with_stable_checkpoints(steps: tuple[int, ...] = (600, 1200, 1800, 2400, 3000)):
    """A finished WSD run of 3,000 steps (its decay begins at 2,400) that kept these checkpoints, whole."""
    cfg = RunConfig(**TINY, steps_until=3000, schedule="wsd", warmup_steps=10)
    run = fake_run(cfg, step=3000, metrics=curve(0, 30))
    for step in steps:
        pt = run.folder / "checkpoints" / f"ckpt_{step:08d}.pt"
        pt.write_bytes(b"")
        pt.with_suffix(".json").write_text(json.dumps({"step": step, "tokens": step * 128, "config": cfg.to_dict(),
                                                       "bytes": 0, "sha256": hashlib.sha256().hexdigest()}))
    return run


def driven(run_id: str) -> DriverLock:
    lock = DriverLock(run_id)
    assert lock.acquire()
    return lock


# ---------------------------------------------------------------------------------------
# 1. A cooldown branch that is its parent


def test_a_branch_that_could_only_repeat_its_parent_is_neither_offered_nor_started(monkeypatch):
    run = wsd_run_with_stable_checkpoints()
    row = ui.RunsPanel().branching
    assert row.run.value == run.id and [s for _, s in row.step.options] == [600, 1200, 1800]  # not 2,400 nor 3,000
    assert "лишь повторила бы прогон" in text(row.title.value)  # why, beside the row
    started = []
    monkeypatch.setattr(api_runs, "spawn_driver", started.append)
    with pytest.raises(UserError, match="would only repeat the run") as refused:
        api_runs.branch(run.id, 2400)  # where its decay began: `lab branch --at 2400` is refused too
    assert "лишь повторит прогон" in refused.value.ru and started == []
    row.step.options = [("2 400", 2400)]  # a step the row does not offer, pressed anyway
    row.go.click()
    assert "✖" in row.out.value and "лишь повторит прогон" in text(row.out.value) and started == []
    ui.set_language("en")
    assert "would only repeat the run" in text(row.title.value)


# ---------------------------------------------------------------------------------------
# 4. The monitor's state is the session's


def test_the_monitor_says_where_the_session_is_now_not_where_it_was(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=3000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", kind="kaggle", status="running", from_step=0)]
        r.status = "running"
    live = {"mode": "live", "rows": []}
    monkeypatch.setattr(api_runs, "live_curve", lambda run: live)
    lock, say = driven(run.id), logged(run.id, lambda line: None)
    try:
        say("link 1: alice/lab-x-l1 QUEUED")
        monitor = ui.Monitor(run_id=run.id, every_s=3600)
        assert "сессия в очереди Kaggle" in text(monitor.state.value)
        live["rows"] = [{"step": s, "tokens": s * 128, "loss": 5.0, "session": 1} for s in range(10, 760, 10)]
        monitor.refresh()  # the session trains: its log shows it, the driver has said nothing since
        head = text(monitor.state.value)
        assert f"шаг 750 / 3{NBSP}000" in monitor.state.value.replace("<span class='lab-run-step'>", "")
        assert "в очереди" not in head and "сессия обучает (шаг 750)" in head
        with updating(run.id) as r:  # its machine's own record, newer than the driver's line
            r.links[0].state, r.links[0].state_at = "collecting", datetime.now(timezone.utc).isoformat()
        monitor.refresh()
        assert "сессия кончилась; её результаты скачиваются (только что)" in text(monitor.state.value)
        ui.set_language("en")
        assert "link 1: its session ended; its outputs are coming back (just now)" in text(monitor.state.value)
    finally:
        lock.release()


def test_stops_and_continues_answer_goes_once_the_session_it_speaks_of_has_moved_on(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=3000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="bob", kind="kaggle", status="running")]
        r.status = "running"
    cancelled, live = [], {"mode": "live", "rows": [{"step": s, "tokens": s, "loss": 6.0, "session": 1} for s in (1, 2)]}
    monkeypatch.setattr(api_runs, "live_curve", lambda run: live if run.links[0].status == "running" else None)
    monkeypatch.setattr(api_runs, "cancel_loses", lambda run_id: ("what it trained since step 0 is lost",
                                                                   "обученное после шага 0 пропадёт"))
    monkeypatch.setattr(api_runs, "cancel", lambda run_id: cancelled.append(run_id) or "ended")
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    monitor.stop_button.click()  # a session that cannot save first: what it loses, asked before anything
    assert cancelled == [] and "обученное после шага 0 пропадёт. Всё равно остановить?" in text(monitor.lose_words.value)
    ui.set_language("en")
    assert "what it trained since step 0 is lost. Stop it anyway?" in text(monitor.lose_words.value)
    monitor.lose_yes.click()
    assert cancelled == [run.id] and monitor.asking.layout.display == "none"
    assert "ended without saving" in text(monitor.said.value)
    monitor.refresh()  # the session is still being ended: the answer stands
    assert "ended without saving" in text(monitor.said.value)
    assert monitor.plot.layout.display is None  # its live curve, while it is being ended
    with updating(run.id) as r:  # the session ended
        r.links[0].status, r.status = "cancelled", "cancelled"
    monitor.refresh()
    assert monitor.said.value == "" and monitor.plot.layout.display == "none"  # no curve of work that was lost
    monkeypatch.setattr(api_runs, "continue_run", lambda run_id, given=None, machine=None: run_id)
    monitor.continue_button.click()
    assert "Continuing from the checkpoint" in text(monitor.said.value)
    with updating(run.id) as r:  # the next link is pushed, then runs: the answer's news is old
        r.links.append(Link(n=2, machine="alice", kind="kaggle", status="starting", from_step=100))
        r.status = "running"
    monitor.refresh()
    assert "Continuing from the checkpoint" in text(monitor.said.value)
    with updating(run.id) as r:
        r.links[1].status = "running"
    monitor.refresh()
    assert monitor.said.value == ""


# ---------------------------------------------------------------------------------------
# 5. The Russian view speaks Russian, the English view English


def test_the_monitors_end_line_is_the_views_and_names_the_checkpoint_in_the_run_folder(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=3000), step=3000, metrics=curve(0, 30))
    tail = ("step 3,000/3,000 loss 0.4327\nstopped at step 3,000 (steps_until reached); checkpoint "
            "/tmp/x/sessions/10/kaggle/working/run/checkpoints/ckpt_00003000.pt\n"
            "plot       /tmp/x/sessions/10/kaggle/working/loss.png")
    real = api_runs.status
    monkeypatch.setattr(api_runs, "status", lambda run_id: __import__("dataclasses").replace(real(run_id),
                                                                                           log_tail=tail))
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    log = text(monitor.log.value)
    assert f"остановлен на шаге 3 000 (дошёл до «Шагов до»); чекпоинт — checkpoints/ckpt_00003000.pt в папке прогона" \
        in log and "график — loss.png в папке прогона" in log and "/kaggle/working" not in log
    ui.set_language("en")
    assert "stopped at step 3,000 (steps_until reached); its checkpoint is checkpoints/ckpt_00003000.pt in the run " \
           "folder" in text(monitor.log.value)


def test_errors_name_fields_by_the_forms_labels_in_either_language():
    form = ui.NewRunForm(**TINY, steps_until=0)
    form.settle()
    said = text(form.rows["steps_until"].message.value)
    assert "«Шагов до» должно быть не меньше 1" in said and "steps_until" not in said
    ui.set_language("en")
    said = text(form.rows["steps_until"].message.value)
    assert "“Steps until” must be at least 1" in said and "steps_until" not in said


def test_what_a_panel_said_follows_a_switch_of_language(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=3000), step=3000, metrics=curve(0, 30))
    more = ui.RunsPanel().more
    assert f"С его чекпоинта на шаге 3{NBSP}000" in more.info.value
    monkeypatch.setattr(api_runs, "continue_run", lambda run_id, given=None, machine=None: run_id)
    more.steps.value = 4000
    more.submit()
    assert f"до шага 4{NBSP}000" in more.done.value
    machines = ui.MachinesPanel()
    got = api_accounts.Added("carol", "carol", 30.0, 30.0, stored_as="as its key", stored_as_ru="как ключ")
    monkeypatch.setattr(api_accounts, "add", lambda *a, **kw: got)
    machines.adding.name.value, machines.adding.token.value = "carol", "KGAT_x"
    machines.adding.submit()
    assert "Аккаунт carol (пользователь Kaggle carol) добавлен" in text(machines.adding.messages["done"].value)
    ui.set_language("en")
    assert "From its checkpoint at step 3,000" in text(more.info.value) and "С его" not in more.info.value
    assert f"Run {run.id} goes on to step 4,000" in text(more.done.value)
    added = text(machines.adding.messages["done"].value)
    assert "Added carol (Kaggle user carol): 30.0 h of 30.0 h of GPU quota left" in added and "добавлен" not in added


# ---------------------------------------------------------------------------------------
# 9. Small things


def test_one_start_buttons_as_wide_as_their_words_and_no_glyph_chromium_lacks():
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=3000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="local", kind="local", status="running")]
        r.status = "new"
    form = ui.new_run()
    assert ui.start(form) is None  # the form's own Start is the one: nothing is shown again
    panels = [form, ui.Monitor(run_id=run.id, every_s=3600), ui.RunsPanel(), ui.MachinesPanel()]
    widgets = [w for p in panels for w in walk(p.box)]
    assert sum(getattr(w, "description", "") == "Старт" for w in widgets) == 1
    buttons = [w for w in widgets if type(w).__name__ == "Button" and w is not form.start_button]
    assert buttons and all(b.layout.flex == "0 0 auto" for b in buttons)  # never squeezed to "П…"
    assert "⏳" not in form.where.value + panels[1].state.value + form.launch.where.value
    assert panels[2].ancestors.layout.min_width  # "with ancestors" whole beside the toggle
