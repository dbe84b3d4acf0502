"""The newcomer's second hour (issue 33), the control notebook's part: a run that waits says what
for and until when, the monitor shows no run's plot under another's header, Auto's accounts say
what they lack, the cooldown branch and Prepare have the fields they lacked, the live curve and
the machines' figures tell the truth, and the words are the view's language's.

Each test has its own fresh lab home (tests/ui/test_ui.py's fixture). Nothing here trains: runs,
their links and the driver's words are written by hand, as the driver writes them.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import lab, wait_for
from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)
from lab import sizing, ui
from lab.api import data as api_data
from lab.api import runs as api_runs
from lab.api.machines import STALE_S
from lab.config import RunConfig
from lab.machines.control import DriverLock, logged, set_control
from lab.machines.live import curve_rows, even_live
from lab.probe.account import ProbePlan, cost_line
from lab.runs import Link, Settled, create_run, load_run, updating
from lab.ui import console
from lab.ui.parts import tell
from test_ui import TINY, curve, fake_run, home, text  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]


def driven(run_id: str) -> DriverLock:
    """The run's driver lock held here, as a background driver holds it (status() then passes on
    the driver's own message)."""
    lock = DriverLock(run_id)
    assert lock.acquire()
    return lock


# ---------------------------------------------------------------------------------------
# 4. Waiting said as waiting


def test_start_and_the_monitor_say_what_a_waiting_run_waits_for_and_until_when(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=30)))
    monkeypatch.setattr(api_runs, "start", lambda given, resume=None, machine=None: run.id)
    form = ui.NewRunForm(**TINY, steps_until=30, machine="local")
    monitor = ui.Monitor(every_s=3600)
    lock = driven(run.id)
    try:
        form.start(wait=True)
        assert "готовится" in text(form.where.value)
        until = (datetime.now(timezone.utc) + timedelta(days=3, hours=2, minutes=30)).isoformat()
        set_control(run.id, waiting_until=until,
                    message="No Kaggle account can take the run now (alice: 0.2 h of quota left (12 min); ...).",
                    message_ru="Ни один аккаунт Kaggle сейчас не может взять прогон (alice: осталось 0,2 ч квоты ...).")
        with updating(run.id) as r:
            r.status = "waiting"
        assert form.launch.wait(10, until=("waiting",)) == "waiting"
        shown = text(form.where.value)
        assert "готовится" not in shown and "ждёт машину до" in shown and "через 3 дн 2 ч" in shown
        assert "Ни один аккаунт Kaggle сейчас не может взять прогон (alice: осталось 0,2 ч" in shown
        monitor.refresh()
        head = text(monitor.state.value)
        assert "ждёт машину до" in head and "через 3 дн 2 ч" in head and "alice: осталось 0,2 ч" in head
        ui.set_language("en")
        assert "waits for a machine until" in text(form.where.value) and "(in 3 d 2 h)" in text(form.where.value)
        assert "waits for a machine until" not in text(monitor.state.value)  # its own words: "waiting until"
        assert "until " in text(monitor.state.value) and "alice: 0.2 h of quota left" in text(monitor.state.value)
        with updating(run.id) as r:  # the quota came back: the run runs
            r.links.append(Link(n=1, machine="alice", kind="kaggle", status="running"))
            r.status = "running"
        assert form.launch.wait(10) == "started" and "✔" in form.where.value
    finally:
        lock.release()


def test_the_monitor_never_shows_the_previous_runs_plot_under_a_new_runs_header():
    old = fake_run(RunConfig(**TINY, steps_until=300), step=300, metrics=curve(0, 300))
    monitor = ui.Monitor(run_id=old.id, every_s=3600)
    assert monitor.plot.layout.display is None and bytes(monitor.plot.value).startswith(b"\x89PNG")
    new = create_run(Settled.whole(RunConfig(**TINY, steps_until=300)))
    monitor.follow(new.id)
    assert new.id in text(monitor.state.value)
    assert monitor.plot.layout.display == "none" and bytes(monitor.plot.value) == b""
    monitor.picker.value = old.id  # picked back: its own plot again
    assert monitor.plot.layout.display is None and bytes(monitor.plot.value).startswith(b"\x89PNG")


# ---------------------------------------------------------------------------------------
# 5. The notebook's dead ends


def test_a_cooldown_branch_goes_to_the_machine_picked_beside_it(monkeypatch):
    started = []
    monkeypatch.setattr(api_runs, "spawn_driver", started.append)  # registered for real, not driven here
    parent = fake_run(RunConfig(**TINY, steps_until=3000, schedule="wsd"), step=1500)
    sidecar = parent.folder / "checkpoints" / "ckpt_00001500.json"  # whole, as a save commits it
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "bytes": 0, "sha256": hashlib.sha256().hexdigest()}))
    row = ui.RunsPanel().branching
    assert [v for _, v in row.machine.options][:2] == ["auto", "local"] and row.machine.value == "auto"
    assert "lab-branch-machine" in row.machine._dom_classes and row.machine.description == "Машина"
    assert [label for label, _ in row.step.options] == ["1\u00a0500"]  # a no-break space: never "1 ⏎ 500"
    row.machine.value = "local"
    row.go.click()
    assert "✔" in row.out.value and len(started) == 1
    branch = load_run(started[0])
    assert branch.cfg.machine == "local" and branch.parent["run"] == parent.id


def _tiny_text(home: Path) -> str:
    folder = home / "texts" / "tales"
    folder.mkdir(parents=True)
    words = ["лиса", "ёлка", "заяц", "сказка", "зима", "снег", "лес", "дом"]
    rng = random.Random(7)
    for i in range(3):
        (folder / f"tale-{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(300)), encoding="utf-8")
    return "texts/tales"


def test_prepare_has_a_vocabulary_field_and_says_the_size_that_fits_a_small_text(home):
    source = _tiny_text(home)
    api_data.add("tales", [source])
    panel = ui.DataPanel()
    prep = panel.preparing
    assert prep.vocab.value == "auto" and "auto" in prep.vocab.options and "Словарь" == prep.vocab.description
    assert "кит подберёт размер под текст" in text(prep.vocab_help.value)
    prep.pick.value = ("tales",)
    prep.vocab.value = "сто"
    prep.start()
    assert "✖" in prep.stage.value and "укажите целое число" in text(prep.stage.value)
    prep.vocab.value = "4000"  # more than these few words hold
    prep.start()
    wait_for(lambda: not prep.go.disabled, 60, "the prepare")
    fits = int(prep.vocab.value)
    assert 300 <= fits < 4000, prep.stage.value
    assert f"Словарь 4000 слишком велик для этого текста: в нём помещается не больше {fits}" in text(prep.stage.value)
    prep.start()  # the field now holds the size that fits
    wait_for(lambda: "✔" in prep.stage.value or "✖" in prep.stage.value, 60, "the second prepare")
    assert "✔" in prep.stage.value, prep.stage.value
    manifest = json.loads(next((home / "data").glob("tales-*/manifest.json")).read_text())
    assert manifest["tokenizer"]["vocab"] == fits


def test_auto_vocabulary_leaves_the_choice_to_the_corpus(monkeypatch):
    asked = []
    monkeypatch.setattr(api_data, "prepare_data", lambda names, progress=False, **kw: asked.append(kw) or Path("x"))
    api_data.prepare(["pydoc"], False, vocab=None)
    api_data.prepare(["pydoc"], False, vocab=512)
    assert asked == [{}, {"vocab": 512}]


# ---------------------------------------------------------------------------------------
# 6. Live figures that lie for a moment


def test_the_live_curve_draws_the_mean_the_final_curve_will_draw_not_single_noisy_steps():
    rng = random.Random(3)
    final = [{"step": s, "loss": 4.0 + 2.0 * math.exp(-s / 300) + rng.gauss(0, 0.25), "session": 1}
             for s in range(1, 2001)]
    final[999]["loss"] = 5.6  # one noisy step, at an evaluation: the log shows it, as it shows every evaluation's
    shown = {s for s in range(1, 2001) if s % 40 == 0 or s % 250 == 0}  # a row every few seconds, and each evaluation
    live = [dict(final[s - 1]) for s in sorted(shown)]
    smooth, avg = {}, 0.0  # the final plot's line: the debiased EMA (lab.kernel.plots)
    for i, r in enumerate(final):
        avg = 0.9 * avg + 0.1 * r["loss"]
        smooth[r["step"]] = avg / (1 - 0.9 ** (i + 1))
    evened = even_live(live)
    assert [r["step"] for r in evened] == [r["step"] for r in live]
    assert [r["loss_sample"] for r in evened] == [r["loss"] for r in live]  # the step's own loss is kept
    off = lambda rows: max(abs(r["loss"] - smooth[r["step"]]) for r in rows if r["step"] > 100)  # noqa: E731
    assert off(evened) < 0.6 * off(live)
    spike = next(r for r in evened if r["step"] == 1000)
    assert spike["loss"] < 4.0 + 2.0 * math.exp(-1000 / 300) + 0.5 < 5.6  # no spike the final curve lacks
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=2000)))
    rows = curve_rows(run, {"rows": live, "mode": "live"})
    assert [r["loss"] for r in rows] == [r["loss"] for r in evened]


def test_a_hand_off_says_what_the_lab_is_doing_while_the_step_stands_still():
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=9000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", kind="kaggle", status="running", from_step=0)]
        r.status = "running"
    lock = driven(run.id)
    say = logged(run.id, lambda line: None)
    try:
        monitor = ui.Monitor(run_id=run.id, every_s=3600)
        steps = [("link 1: step 4,500/9,000 loss 3.1000 (live, from the session's log)", "сессия идёт (шаг 4 500 из 9 000"),
                 ("link 1: alice/lab-x-l1 COMPLETE", "звено 1: сессия кончилась (COMPLETE); её результаты скачиваются"),
                 ("link 1: downloaded 7 files into /x/links/001-alice", "результаты скачаны (файлов: 7)"),
                 ("link 1: stopped at step 4500 (time limit)", "звено 1 кончилось на шаге 4500; лаба выбирает машину"),
                 ("link 2 on bob (limit 630 min): bob: its 30.0 h of GPU quota cover the whole run (2.0 h).",
                  "звено 2 — на bob: туда загружаются данные и чекпоинт"),
                 ("bob: uploading bob/lab-ckpt-x (private)", "bob: загружаю bob/lab-ckpt-x"),
                 ("link 2: pushed bob/lab-x-l2 version 1", "звено 2: блокнот отправлен; Kaggle запускает сессию")]
        for line, words in steps:
            say(line)
            monitor.refresh()
            doing = text(monitor.state.value)
            assert words in doing and "только что" in doing, (line, doing)
        ui.set_language("en")
        assert "link 2: its notebook is pushed; Kaggle starts its session (just now)" in text(monitor.state.value)
        say("something the monitor does not know")
        monitor.refresh()
        assert "Kaggle starts" not in text(monitor.state.value)  # an old step is not said as if it were now
    finally:
        lock.release()


def test_the_machines_panel_shows_when_its_figures_were_read_and_never_redraws_stale_ones(kaggle_lab):
    panel = ui.MachinesPanel()
    assert "30,0 ч из 30,0 ч" in _rows(panel)
    read = text(panel.read.value)
    assert re.search(r"квота и сессии — по данным на \d\d:\d\d:\d\d", read)
    kaggle_lab.emu.set_quota("alice", used_s=29.8 * 3600)
    console.machines.machines(refresh=True)  # the form's Auto read them since
    ui.set_language("en")
    assert "12 min of 30.0 h" in _rows(panel)  # not what the panel itself read first
    kaggle_lab.emu.set_quota("alice", used_s=0.0)
    console.machines.forget()  # a run started: who is busy, and the quota, may have changed
    ui.set_language("ru")
    wait_for(lambda: "30,0 ч из 30,0 ч" in _rows(panel).split("bob ·")[0], 30, "the figures asked anew")
    assert "спрашиваю заново" not in text(panel.read.value)
    panel.probing["alice"] = ["alice/lab-probe RUNNING"]
    panel.render()
    alice = _rows(panel).split("alice · Kaggle")[1].split("bob")[0]
    assert "идёт проба" in alice and "свободна" not in alice and "alice/lab-probe: идёт" in alice
    ui.set_language("en")
    alice = _rows(panel).split("alice · Kaggle")[1].split("bob")[0]
    assert "probing" in alice and "free" not in alice and "alice/lab-probe RUNNING" in alice


def _rows(panel) -> str:
    from lab.ui.parts import walk
    return " ".join(text(w.value) for w in walk(panel.list) if hasattr(w, "value") and isinstance(w.value, str))


def test_auto_picks_anew_when_the_machines_change_and_says_when_it_read_them(kaggle_lab):
    kaggle_lab.emu.set_quota("alice", used_s=30 * 3600)
    kaggle_lab.emu.set_quota("bob", used_s=30 * 3600)
    form = ui.NewRunForm(**TINY, steps_until=30)
    form.settle()
    assert form.choice.machine is None and "Ни один аккаунт Kaggle" in text(form.calc.value)
    assert re.search(r"машины по данным на \d\d:\d\d:\d\d", text(form.calc.value))
    kaggle_lab.emu.set_quota("bob", used_s=0.0)
    tell("runs")  # a run ended somewhere (the monitor says so): no Refresh pressed
    form.settle()
    assert form.choice.machine == "bob" and "bob" in text(form.calc.value)
    kaggle_lab.emu.set_quota("bob", used_s=30 * 3600)
    kaggle_lab.emu.set_quota("alice", used_s=0.0)
    console.machines.read_at -= STALE_S + 1  # five minutes went by
    form.set(steps_until=31)
    form.settle()
    assert form.choice.machine == "alice"


# ---------------------------------------------------------------------------------------
# 7. Words


def test_the_probes_progress_is_said_in_the_views_language_and_after_a_switch(kaggle_lab, monkeypatch):
    from lab.api import accounts as api_accounts
    from lab.kaggle.probed import store_probe
    gate, done = [], []

    def probe(name, say):  # the real one pushes a session (tests/probe run it); its lines are its own
        say(f"{name}: {api_accounts.probe_cost()[0]}")
        say(f"{name}: uploaded the probe's input {name}/lab-probe-input; waiting until Kaggle has it ready")
        say(f"{name}: pushed {name}/lab-probe version 3; waiting for it to end")
        wait_for(lambda: gate, 30, "the test")
        done.append(name)
        return store_probe(name, {"account": name, "at": "2026-01-01T00:00:00+00:00", "can_run": True, "gpu": "cpu"})
    monkeypatch.setattr(api_accounts, "probe", probe)
    panel = ui.MachinesPanel()
    panel._ask("alice", "probe")
    assert "Проба займёт около 2,6 мин" in _rows(panel) and "не измерен" in _rows(panel)
    panel._confirmed("alice", "probe")
    wait_for(lambda: "отправлена alice/lab-probe, версия 3; жду, пока она кончится" in _rows(panel), 30,
             "the probe's line, in Russian")
    ui.set_language("en")
    assert "pushed alice/lab-probe version 3; waiting for it to end" in _rows(panel)
    gate.append(True)
    wait_for(lambda: done and "alice" not in panel.probing, 30, "the probe's end")


def test_a_refused_new_key_says_the_account_was_not_added_and_nothing_to_remove(kaggle_lab):
    kaggle_lab.emu.add_account("carol")
    wrong = kaggle_lab.kaggle_json("carol", key="0123-wrong")
    proc = lab("accounts", "add", "carol", "--kaggle-json", str(wrong), check=False)
    assert proc.returncode == 2 and "not added" in proc.stderr and "lab accounts remove" not in proc.stderr
    panel = ui.MachinesPanel()
    panel.adding.name.value = "dave"
    panel.adding.upload.value = ({"name": "kaggle.json", "type": "application/json", "size": 10,
                                  "content": memoryview(Path(wrong).read_bytes()),
                                  "last_modified": datetime.now(timezone.utc)},)
    panel.adding.submit()
    shown = text(panel.adding.messages["file"].value)
    assert "Kaggle не принял его ключ или токен" in shown and "Аккаунт не добавлен" in shown
    assert "lab accounts remove" not in shown


def test_no_lab_watch_command_beside_the_continue_button():
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=9000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="local", kind="local", status="stopped", to_step=1500, reason="time limit")]
        r.status = "stopped"
    set_control(run.id, message=f"run {run.id} stopped at step 1,500 (time limit); `lab watch {run.id}` continues it",
                message_ru=f"прогон {run.id} остановлен на шаге 1 500 (time limit); `lab watch {run.id}` продолжит его")
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert monitor.continue_button.layout.display is None
    head = text(monitor.state.value)
    assert "lab watch" not in head and "остановлен на шаге 1 500 (time limit). Кнопка «Продолжить» продолжит его." in head
    ui.set_language("en")
    assert "stopped at step 1,500 (time limit). Continue below goes on with it." in text(monitor.state.value)
    from lab.ui.doing import with_continue_button
    for said in (f"run x failed. Then `lab watch x` continues the run.", "прогон x отменён на шаге 3: `lab watch x` продолжит его"):
        assert "lab watch" not in with_continue_button(said)


def test_russian_numbers_are_written_one_way_and_the_checkpoint_list_follows_a_switch(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=3000), step=1500,
                   metrics=[{"step": 1500, "tokens": 1, "loss": 3.88512}, {"step": 1500, "val_loss": 4.0012, "val_set": "a"}])
    runs = ui.RunsPanel()
    row = text(runs.table.value)
    assert "1 500 / 3 000" in row and "3,885" in row and "4,001" in row and "1,500" not in row and "3.885" not in row
    monitor = ui.Monitor(run_id=run.id, every_s=3600)
    assert "0 → 1 500" in text(monitor.links.value)
    model = ui.TryModel(run.id)
    assert [label for label, _ in model.checkpoint.options] == ["шаг 1\u00a0500"]
    ui.set_language("en")
    assert [label for label, _ in model.checkpoint.options] == ["step 1,500"]  # not the Russian it was built in
    assert "1,500 / 3,000" in text(runs.table.value)


def test_the_calculators_words_fit_a_tiny_run():
    form = ui.NewRunForm(context=32, width=32, heads=2, layers=2, batch_per_card=4, steps_until=20, gpu="cpu",
                         machine="local")
    form.settle()
    calc = text(form.calc.value)
    assert "%" not in re.sub(r"\d+% запаса", "", calc.split("Память")[0])  # seconds, not "+99%"
    assert re.search(r"20 шагов при [\d ]+ токенов/с: [\d,]+ с обучения и [\d,]+ (с|мин) на оценки", calc), calc
    assert not re.search(r"(\d+ мин)–\1\b", calc) and not re.search(r"([\d,]+ с)–\1", calc)
    assert "0,00 млн" not in calc and "0.00 M" not in calc
    assert "512 / 8" not in form.rows["heads"].help.value and "32 / 2 = 16 на голову" in form.rows["heads"].help.value
    form.set(width=100, heads=3)
    assert "100 / 3 даёт остаток 1" in form.rows["heads"].help.value
    assert sizing.format_count(3_200) == "3.20 K" and sizing.format_count(400, "ru") == "400"


def test_when_to_grow_says_val_rose_rather_than_a_plateau():
    rows = [{"step": s, "tokens": s * 1000, "val_loss": 3.0 + (0.0 if s <= 400 else (s - 400) / 400 * 0.55)
             + (0.02 if s % 200 else -0.02), "val_set": "a"} for s in range(100, 1300, 100)]
    v = sizing.when_to_grow(rows, None, RunConfig())
    assert not v.grow and v.plateau is False and v.fall < -v.noise
    assert v.reason_en.startswith("val rose: by ") and "plateau" in v.reason_en and "no plateau" in v.reason_en
    assert "add data" in v.reason_en and "вырос" in v.reason_ru and "не плато" in v.reason_ru


# ---------------------------------------------------------------------------------------
# 8. Small things: the probe's cost said as measured


def test_the_probes_cost_line_and_the_readme_say_the_measured_figure():
    about, most = ProbePlan().cost_min()
    assert (about, most) == (2.6, 20.0)
    line, line_ru = cost_line(ProbePlan()), cost_line(ProbePlan(), ru=True)
    assert "about 2.6 min" in line and "not measured" in line and "at most 20 min" in line
    assert "около 2,6 мин" in line_ru and "не измерен" in line_ru
    readme = (ROOT / "docs" / "kaggle.md").read_text(encoding="utf-8")  # the probe's page, linked from the README
    section = readme.split("**What it costs:**")[1].split("**What it finds out:**")[0]
    assert f"about {about} minutes" in section and "not measured" in section and "emulator" in section


def test_the_data_panel_says_where_each_sources_text_went(monkeypatch):
    """Point 1: beside a prepared constellation's tokens, each source's train and val share, so a
    person sees that six short tales train too and are not held out whole; a vocabulary the
    prepare lowered to fit the text is said once it is done."""
    from lab.corpus.manifests import SourceSplit
    splits = [SourceSplit("mine", "texts/tales/", 23_652, 22_470, 1_182, 6_900, 360, 6, 0, 6),
              SourceSplit("mine", "texts/big.txt", 900_000, 855_000, 45_000, 260_000, 13_700, 1, 0, 1)]
    monkeypatch.setattr(api_data, "constellations", lambda: [
        api_data.Constellation("mine", "", ["texts/tales/", "texts/big.txt"], "", "", 266_900, splits)])
    panel = ui.DataPanel()
    shown = [text(s) for s in re.findall(r"<div class='lab-source-split'>(.*?)</div>", panel.table.value)]
    assert len(shown) == 2 and shown[0].startswith("texts/tales/: обучение 22") and "val 1" in shown[0]
    ui.set_language("en")
    assert "texts/big.txt: train 855,000 bytes" in text(panel.table.value)
