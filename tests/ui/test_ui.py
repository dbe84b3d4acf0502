"""The control notebook's widgets driven from Python: set fields, read the calculator.

Each test has its own fresh lab home. Runs and checkpoints are written by hand (a sidecar
`ckpt_*.json` is all the form reads), so nothing here trains; the notebook and browser
tests start real runs.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time

import ipywidgets as widgets
import pytest

from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)
from lab import sizing, ui
from lab.api import curves
from lab.api import machines as api_machines
from lab.api import runs as api_runs
from lab.ui import console
from lab.config import RunConfig, UserError, field_choices, field_kind
from lab.runs import Link, Settled, create_run, updating
from lab.ui.text import hours

GUIDE_ORDER = ["Прогон", "Продолжить с чекпоинта", "Созвездия в обучении", "Контекст n", "Ширина d", "Головы",
               "Слои", "Видеокарта", "Машина", "Батч на карту", "Шагов до", "Лимит, мин"]
TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A fresh lab home, Russian, no cached machines; widgets of the test closed after it."""
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "lab-home"))
    console.machines.forget()
    ui.set_language("ru")
    yield tmp_path / "lab-home"
    ui.set_language("ru")
    from lab.ui.monitor import _monitors
    for m in _monitors:
        m.close()


def text(html: str) -> str:
    """What a person reads in a widget's HTML."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'").replace("&quot;", '"').strip()


def calc(form) -> str:
    form.settle()
    return text(form.calc.value)


def figure(form, key: str) -> str:
    form.settle()
    found = re.search(rf"class='lab-calc-{key}'>([^<]*)<", form.calc.value)
    return found.group(1) if found else ""


def fake_run(cfg: RunConfig, step: int, metrics: list[dict] | None = None, parent: dict | None = None,
             status: str = "done"):
    """A finished run as the registry keeps it: run.json, a checkpoint sidecar, metrics."""
    run = create_run(Settled.whole(cfg), parent=parent)
    ck = run.folder / "checkpoints"
    ck.mkdir()
    (ck / f"ckpt_{step:08d}.pt").write_bytes(b"")
    (ck / f"ckpt_{step:08d}.json").write_text(json.dumps({"step": step, "tokens": step * 128, "config": cfg.to_dict()}))
    with updating(run.id) as r:
        r.links.append(Link(n=1, machine="local", status=status, from_step=(parent or {}).get("step", 0),
                            to_step=step, reason="steps_until reached"))
        r.status = status
    rows = metrics if metrics is not None else curve(0, step)
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in rows))
    return run


def walk(widget):
    """A widget and everything inside it."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def curve(start: int, end: int, val_set: str = "a", every: int = 10) -> list[dict]:
    rows = []
    for s in range(start + 1, end + 1):
        rows.append({"step": s, "tokens": s * 128, "loss": 8.0 / (1 + s / 50), "session": 1, "tok_s": 1000.0})
        if s % every == 0:
            rows.append({"step": s, "tokens": s * 128, "val_loss": 8.2 / (1 + s / 50), "val_set": val_set})
    return rows


# ---------------------------------------------------------------------------------------
# The form


def test_fields_are_the_guides_in_its_order_words_and_help():
    form = ui.NewRunForm()
    labels = [text(form.rows[n].label.value) for n in form.rows if n not in ("schedule", "lr", "warmup_steps", "eval_every")]
    assert labels == GUIDE_ORDER
    assert "d делится на головы без остатка: 512 / 8 = 64 на голову" in form.rows["heads"].help.value
    assert "630 минут оставляют запас до лимита сессии Kaggle" in form.rows["limit_min"].help.value
    more = form.more.children[0]
    assert [c for c in more.children] == [form.rows[n].box for n in ("schedule", "lr", "warmup_steps", "eval_every")]
    assert form.more.get_title(0).startswith("Ещё")


def test_a_fresh_lab_home_gives_a_working_form(home):
    form = ui.NewRunForm()
    assert form.config() == RunConfig(), (form._general, form._constellation_names, os.environ.get("LAB_HOME"))  # the guide's current values
    options = dict((v, k) for k, v in form.inputs["constellations"].options)
    assert "pydoc" in options and "не подготовлено" in options["pydoc"]
    assert form.inputs["resume_from"].options[0][0].startswith("— чекпоинтов пока нет")
    assert [v for _, v in form.inputs["machine"].options] == ["auto", "local"]
    assert figure(form, "weights") == "27 738 112"  # the guide's number (vocab 4000: no data yet)
    assert not form.start_button.disabled  # "no prepared data" is a warning: Start prepares it
    assert "прогон подготовит данные сам" in form.rows["constellations"].message.value
    assert "Авто выберет этот компьютер" in calc(form)


def test_layers_8_to_12_changes_the_weights_at_once():
    form = ui.NewRunForm()
    form.set(layers=12)
    assert form.estimate.weights.value == 12 * 12 * 512**2 + 4000 * 512 + 1024 * 512
    assert figure(form, "weights") == "40 321 024"
    form.inputs["layers"].value = 24  # as the browser sets it
    assert form.estimate.weights.value == 12 * 24 * 512**2 + 4000 * 512 + 1024 * 512


def test_the_calculator_marks_each_figure_exact_measured_or_estimate():
    form = ui.NewRunForm(gpu="2xT4")  # the guide's reference size on its measured card
    html = form.calc.value
    assert re.search(r"lab-calc-weights'>27 738 112</b> <span class=\"lab-kind lab-kind-exact", html)
    assert re.search(r"lab-calc-tok_s'>102 000 ток/с</b> <span class=\"lab-kind lab-kind-measured", html)
    assert "lab-calc-tokens_per_step'>12 288<" in html
    form.set(layers=12)
    assert re.search(r"lab-calc-tok_s'>[^<]+</b> <span class=\"lab-kind lab-kind-estimate", form.calc.value)
    for row in ("weights", "tokens_per_step", "tokens_wanted", "tokens_available", "tok_s", "run_hours", "memory",
                "quota"):
        assert f"lab-calc-row-{row}" in form.calc.value


def test_invalid_fields_are_shown_at_the_field_and_start_waits_for_the_fix():
    form = ui.NewRunForm()
    assert not form.start_button.disabled
    form.set(heads=7)
    assert form.start_button.disabled
    assert "ширина 512 не делится на головы 7" in form.rows["heads"].message.value
    assert form.inputs["heads"].layout.border.startswith("2px solid #d32f2f")
    assert form.rows["layers"].message.layout.display == "none"
    form.set(heads=8, batch_per_card=0, limit_min=0)
    assert form.start_button.disabled
    assert "должно быть не меньше 1" in form.rows["batch_per_card"].message.value
    assert "лимит должен быть больше нуля" in form.rows["limit_min"].message.value
    assert form.start() is None  # a disabled Start does nothing
    form.set(batch_per_card=6, limit_min=630)
    assert not form.start_button.disabled
    assert form.inputs["heads"].layout.border is None
    form.set(constellations=[])
    assert form.start_button.disabled and "выберите хотя бы одно созвездие" in form.rows["constellations"].message.value


def test_a_batch_that_will_not_fit_gets_a_clear_oom_warning():
    form = ui.NewRunForm(gpu="T4", batch_per_card=120)
    assert "Не поместится — CUDA out of memory" in calc(form)
    assert "lab-oom" in form.calc.value
    assert "вероятна нехватка памяти" in form.rows["batch_per_card"].message.value
    assert form.inputs["batch_per_card"].layout.border.startswith("2px solid #ef6c00")  # a warning: orange
    form.set(batch_per_card=6)
    assert "lab-oom" not in form.calc.value


def test_continuing_locks_the_model_fields_and_fills_them_from_the_checkpoint():
    parent = fake_run(RunConfig(**TINY, steps_until=300), step=300)
    form = ui.NewRunForm()
    form.set(mode="resume")
    assert all(form.inputs[n].disabled for n in ("context", "width", "heads", "layers"))
    assert form.start_button.disabled and "выберите чекпоинт" in form.rows["resume_from"].message.value
    label, path = form.inputs["resume_from"].options[1]
    assert parent.id in label and "шаг 300" in label and path.endswith("ckpt_00000300.pt")
    form.inputs["resume_from"].value = path  # as the picker sets it
    assert {n: form.inputs[n].value for n in TINY if n != "batch_per_card"} == {"context": 32, "width": 32,
                                                                               "heads": 2, "layers": 2}
    assert form.resume() == path
    assert form.estimate.weights.value == 12 * 2 * 32**2 + 4000 * 32 + 32 * 32
    form.set(layers=12)  # locked: the checkpoint's shape stays
    assert form.inputs["layers"].value == 2
    form.set(steps_until=200)
    assert form.start_button.disabled
    assert "не больше шага чекпоинта 300" in form.rows["steps_until"].message.value
    form.set(steps_until=600)
    assert not form.start_button.disabled
    form.set(mode="scratch")
    assert not any(form.inputs[n].disabled for n in ("context", "width", "heads", "layers"))
    assert form.resume() is None


def whole_checkpoint(run, step: int, cfg: RunConfig):
    """A checkpoint whose sidecar vouches for its bytes, as registration verifies it."""
    import hashlib
    ck = run.folder / "checkpoints"
    ck.mkdir(exist_ok=True)
    (ck / f"ckpt_{step:08d}.pt").write_bytes(b"weights")
    (ck / f"ckpt_{step:08d}.json").write_text(json.dumps({
        "step": step, "tokens": step * 128, "config": cfg.to_dict(), "bytes": 7,
        "sha256": hashlib.sha256(b"weights").hexdigest()}))
    return str(ck / f"ckpt_{step:08d}.pt")


@pytest.mark.parametrize("batch", ["left as the checkpoint's", "the default chosen"])
def test_continue_registers_the_very_run_the_calculator_sized(batch):
    """The form's Continue shows the checkpoint's run in every field; Start registers what the
    form shows, so a field left as shown keeps the checkpoint's value and a default chosen on
    purpose is the default, and the calculator sized exactly the run that is registered."""
    from lab.settle import register_run
    cfg = RunConfig(**{**TINY, "batch_per_card": 12}, steps_until=300, lr=3e-3, seed=7)
    parent = create_run(Settled.whole(cfg))
    ckpt = whole_checkpoint(parent, 300, cfg)
    form = ui.NewRunForm(mode="resume", resume_from=ckpt, steps_until=600)
    assert form.inputs["batch_per_card"].value == 12 and form.inputs["lr"].value == 3e-3
    if batch == "the default chosen":
        form.set(batch_per_card=RunConfig().batch_per_card)
    want = 12 if batch == "left as the checkpoint's" else RunConfig().batch_per_card
    assert form.estimate.tokens_per_step.value == want * form.estimate.cards * 32, "the calculator sized this batch"
    run = register_run(form.given(), form.resume(), form.given()["machine"])  # what Start registers
    assert run.cfg.batch_per_card == want == form.config().batch_per_card
    assert (run.cfg.seed, run.cfg.lr, run.cfg.layers, run.cfg.steps_until) == (7, 3e-3, 2, 600)
    assert "batch_per_card" in run.settled.given and run.settled.start.step == 300


def test_auto_says_which_machine_it_picks_and_why(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_HOME", str(tmp_path))  # no other test's runs calibrate the speeds meanwhile
    seen = []

    def choose(cfg, need_hours):
        seen.append(need_hours)
        return api_machines.Choice("alice", "alice: its 29.0 h of quota cover the whole run (1.7 h)",
                                 "alice: квоты 29,0 ч хватит на весь прогон (1,7 ч)")
    monkeypatch.setattr(console.machines, "choose", choose)
    form = ui.NewRunForm()
    assert "Авто выберет alice alice: квоты 29,0 ч хватит на весь прогон" in calc(form)
    assert seen[-1] == pytest.approx(form.estimate.quota_hours.value)
    ui.set_language("en")
    assert "Auto picks alice alice: its 29.0 h of quota cover the whole run" in calc(form)
    form.set(machine="local")
    assert "Auto picks" not in calc(form)


def add_kaggle_account(name: str) -> None:
    from lab.kaggle.accounts import add_account
    add_account(name, token="KGAT_0123456789abcdef0123456789abcdef", username=name)


def picks(machine: str, seen: list | None = None):
    """A stand-in for Auto's pick (its rule is tested in tests/machines) that records the need."""
    def choose(cfg, need_hours):
        if seen is not None:
            seen.append(need_hours)
        return api_machines.Choice(machine, f"{machine}: picked ({need_hours:.1f} h)", f"{machine}: выбран ({need_hours:.1f} ч)")
    return choose


def test_the_quota_line_follows_the_machine_auto_picks(monkeypatch):
    add_kaggle_account("bob")
    monkeypatch.setattr(console.machines, "choose", picks("bob"))
    form = ui.NewRunForm(gpu="cpu", **TINY, steps_until=2000)  # sized for a CPU, run where Auto says
    shown = calc(form)
    assert "Авто выберет bob" in shown
    assert "не тратит квоту" not in shown and figure(form, "quota") != "0\u00a0мин"
    assert "на bob:" in shown
    monkeypatch.setattr(console.machines, "choose", picks("local"))
    form = ui.NewRunForm(gpu="cpu", **TINY, steps_until=2000)
    shown = calc(form)
    assert "Авто выберет этот компьютер" in shown
    assert figure(form, "quota") == "0\u00a0мин" and "этот компьютер не тратит квоту Kaggle" in shown


def test_time_quota_and_autos_need_are_one_number_for_the_whole_run(monkeypatch):
    add_kaggle_account("alice")
    seen = []
    monkeypatch.setattr(console.machines, "choose", picks("alice", seen))
    form = ui.NewRunForm(gpu="2xT4", layers=12, width=768, heads=12, batch_per_card=12, steps_until=100_000)
    shown = calc(form)
    whole = form.estimate.run_hours
    assert whole.extra["sessions"] >= 2
    assert figure(form, "run_hours") == figure(form, "quota") == hours(seen[-1])
    assert text(f"сессий {whole.extra['sessions']}, каждая до {hours(whole.extra['session_hours'])} (лимит)") in shown
    assert "Время всего прогона" in shown and "Квота Kaggle на весь прогон" in shown


def test_the_hints_numbers_follow_the_form():
    form = ui.NewRunForm(layers=12, width=768, heads=12)
    shown = calc(form)
    assert "Для 12 слоёв, d 768, словаря 4000 и n 1024 это 88 793 088" in shown
    assert "88,8 млн весов хотят ≈ 1,78 млрд токенов" in shown
    assert "36 слоёв примерно в" in shown and "медленнее 12" in shown
    assert "27,7 млн" not in shown and "24 слоя" not in shown
    ui.set_language("en")
    form.set(layers=2, width=64, heads=2, context=64)
    shown = calc(form)
    assert "For 2 layers, d 64, vocab 4000 and n 64 that is 358,400" in shown
    assert "6 layers are about" in shown


def test_no_lab_prepare_where_start_prepares_the_data_itself():
    form = ui.NewRunForm()
    shown = calc(form) + text(form.rows["constellations"].message.value)
    assert "lab prepare" not in shown
    assert "прогон подготовит данные" in shown


def test_the_english_switch_relabels_everything_and_keeps_the_values():
    form = ui.NewRunForm(layers=12)
    form.inputs["mode"].value = "resume"
    switch = ui.language_switch()
    assert [v for _, v in switch.options] == ["ru", "en"] and switch.value == "ru"
    switch.value = "en"  # as a click does
    assert text(form.rows["layers"].label.value) == "Layers"
    assert "Depth: how many times in a row" in form.rows["layers"].help.value
    assert form.inputs["mode"].value == "resume" and form.inputs["layers"].value == 12
    assert figure(form, "weights") == "40,321,024"
    assert form.start_button.description == "Start"
    switch.value = "ru"
    assert text(form.rows["layers"].label.value) == "Слои" and form.start_button.description == "Старт"


def test_hints_can_be_hidden():
    form = ui.NewRunForm()
    form.hints.value = False
    assert all(r.help.layout.display == "none" for r in form.rows.values())
    assert form.rows["layers"].label.tooltip.startswith("Глубина")  # still on hover


def test_unknown_fields_are_refused_clearly():
    with pytest.raises(Exception, match="the form has no field"):
        ui.NewRunForm(depth=3)
    with pytest.raises(Exception, match="unknown constellation"):
        ui.NewRunForm(constellations=["nope"])


# ---------------------------------------------------------------------------------------
# Start and the monitor


def test_start_launches_in_the_background_and_says_where_it_went(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=30), step=30, status="running")
    calls, release = [], threading.Event()

    def start(given, resume=None, machine=None):  # a start that lasts until the test lets it end
        calls.append((given, machine, resume))
        release.wait(10)
        return run.id
    monkeypatch.setattr(api_runs, "start", start)
    form = ui.NewRunForm(**TINY, steps_until=30, machine="local")
    started = []
    form.on_started(started.append)
    form.start()
    assert form.start_button.disabled and "Запускается" in form.where.value  # no double start
    release.set()
    form._start_thread.join(5)
    assert form.run_id == run.id and started == [run.id]
    assert form.launch.wait(10) == "started"  # its link runs: Start says where it went
    assert run.id in form.where.value and "этот компьютер" in form.where.value
    given, machine, resume = calls[0]
    assert machine == "local" and resume is None and given["layers"] == 2
    assert not form.start_button.disabled


def test_a_start_that_fails_says_why(monkeypatch):
    def start(given, resume=None, machine=None):
        raise UserError("Kaggle account 'alice': quota is used up. Pick another machine.")
    monkeypatch.setattr(api_runs, "start", start)
    form = ui.NewRunForm()
    form.start(wait=True)
    assert form.run_id is None and "quota is used up" in form.where.value
    assert not form.start_button.disabled


def test_the_monitor_shows_links_and_the_loss_plot_in_steps_or_tokens():
    rows = curve(0, 40, "a") + curve(40, 80, "b")  # new data at step 40: val starts again
    run = fake_run(RunConfig(**TINY, steps_until=80), step=80, metrics=rows)
    m = ui.Monitor(run_id=run.id)
    try:
        assert run.id in m.state.value and "готово" in m.state.value and "80 / 80" in m.state.value
        assert "этот компьютер" in m.links.value and "дошёл до «Шагов до»" in m.links.value
        assert bytes(m.plot.value).startswith(b"\x89PNG") and m.plot.layout.display is None
        steps_png = bytes(m.plot.value)
        m.x.value = "tokens"
        assert bytes(m.plot.value).startswith(b"\x89PNG") and bytes(m.plot.value) != steps_png
    finally:
        m.close()


def test_the_monitor_follows_a_run_the_form_starts_and_refreshes_while_it_runs(monkeypatch):
    run = fake_run(RunConfig(**TINY, steps_until=100), step=10, metrics=curve(0, 10), status="running")
    monkeypatch.setattr(api_runs, "start", lambda given, resume=None, machine=None: run.id)
    form = ui.NewRunForm(**TINY)
    m = ui.Monitor(form, every_s=0.2)
    try:
        form.start(wait=True)
        assert m.run_id == run.id and "идёт" in m.state.value
        first = bytes(m.plot.value)
        (run.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(0, 60)))
        deadline = time.monotonic() + 10
        while bytes(m.plot.value) == first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bytes(m.plot.value) != first, "the timer did not redraw the plot of a running run"
    finally:
        m.close()


# ---------------------------------------------------------------------------------------
# Runs and machines


def test_the_runs_table_shows_lineage_overlays_runs_and_says_when_to_grow():
    parent = fake_run(RunConfig(**TINY, steps_until=300), step=300, metrics=curve(0, 300, every=25))
    ckpt = str(parent.folder / "checkpoints" / "ckpt_00000300.pt")
    child = fake_run(RunConfig(**TINY, steps_until=600), step=600, metrics=curve(300, 600, every=25),
                     parent={"run": parent.id, "checkpoint": ckpt, "step": 300})
    panel = ui.RunsPanel()
    table = text(panel.table.value)
    assert parent.id in table and child.id in table and f"{child.id} готово 600 / 600" in table
    assert parent.id in table.split(child.id, 1)[1]  # the child's row names its parent
    assert len(panel.choose.value) == 1  # the newest run
    panel.choose.value = (child.id,)
    assert [r["step"] for r in curves.lineage_rows(child.id) if "loss" in r] == list(range(1, 601))
    one = bytes(panel.plot.value)
    panel.choose.value = (child.id, parent.id)
    assert bytes(panel.plot.value).startswith(b"\x89PNG") and bytes(panel.plot.value) != one
    assert "Когда расти" in panel.verdict.value and parent.id in panel.verdict.value  # the run picked last
    assert "val ещё падает" in panel.verdict.value  # a falling 1/(1+t) curve: train longer


def test_the_runs_table_shows_each_runs_speed_beside_its_prediction():
    from lab.sizing.calibration import record_prediction
    cfg = RunConfig(**TINY, gpu="cpu", precision="fp32", steps_until=300)
    run = fake_run(cfg, step=300)
    predicted = record_prediction(run.folder, cfg)["tok_s"]
    (run.folder / "config.json").write_text(cfg.to_json())  # as the training notebook writes them
    (run.folder / "device.json").write_text(json.dumps({"gpu": "cpu", "device": "cpu", "precision": "fp32"}))
    panel = ui.RunsPanel()  # curve() measured 1,000 tok/s
    assert "ток/с (прогноз)" in text(panel.table.value)
    assert f"1 000 (прогноз {sizing.format_number(round(predicted), 'ru')}, " \
           f"{predicted / 1000 - 1:+.0%})" in text(panel.table.value)


def test_the_machines_panel_on_a_fresh_lab_home_shows_this_computer():
    panel = ui.MachinesPanel()
    shown = " ".join(text(w.value) for w in walk(panel.box) if isinstance(getattr(w, "value", None), str))
    assert "Этот компьютер" in shown and "Аккаунтов Kaggle пока нет" in shown


def test_kaggle_accounts_show_their_quota_and_no_widget_holds_a_secret(kaggle_lab):
    panel = ui.MachinesPanel()
    bars = {c: w for w in walk(panel.box) for c in w._dom_classes if c.startswith("lab-quota-")}
    assert set(bars) == {"lab-quota-alice", "lab-quota-bob"}
    assert bars["lab-quota-alice"].max == pytest.approx(30.0, abs=0.5)
    machines = {m.name: m for m in panel.machines}
    assert machines["alice"].quota_total_h == pytest.approx(30.0, abs=0.5)
    form = ui.NewRunForm()
    assert {"alice", "bob"} <= {v for _, v in form.inputs["machine"].options}
    form.settle()
    assert form.choice is not None, form.choice_error
    assert form.choice.machine in ("alice", "bob")
    ui.Monitor(form).close()
    ui.RunsPanel()
    ui.SetupPanel()
    from ipywidgets.widgets.widget import _instances  # every widget alive: what a notebook saves
    states = json.dumps([w.get_state() for w in list(_instances.values())], default=str)
    assert "alice" in states
    for name in ("alice", "bob"):
        assert kaggle_lab.emu.account(name).key not in states


def test_the_forms_inputs_follow_the_run_fields_kinds_and_choices():
    form = ui.NewRunForm()
    expected = {"int": widgets.IntText, "float": widgets.FloatText, "list": widgets.SelectMultiple}
    for name, widget in form.inputs.items():
        if name == "mode":
            continue
        kind = field_kind(name)
        if kind in expected:
            assert isinstance(widget, expected[kind]), name
        elif field_choices(name):
            assert [v for _, v in widget.options] == list(field_choices(name)), name
    ui.set_language("en")
    try:
        assert text(form.rows["heads"].label.value) == "Heads"
    finally:
        ui.set_language("ru")


def test_a_box_is_in_the_machine_list_with_its_cards_and_the_calculator_sizes_for_them(home):
    """A box checked with two RTX 3090s: the form offers it, and with GPU "auto" the figures are
    those of its own cards (bf16 from Ampere on, its memory, its check's measured burst)."""
    from lab.machines.remote.client import Address
    from lab.machines.remote.store import write_check
    from lab.machines.ssh.boxes import add_box
    add_box("gpu1", [Address("me@gpu1.lab")])
    card = {"host": "me@gpu1.lab", "name": "NVIDIA GeForce RTX 3090", "memory_gb": 24.0, "capability": "8.6",
            "count": 2}
    write_check("gpu1", {"format": 1, "machine": "gpu1", "at": "2026-12-01T10:00:00+00:00", "can_run": True,
                         "cards": [card], "gpu": "2xNVIDIA GeForce RTX 3090", "tok_s": 250_000.0, "hosts": []})
    add_box("cpu1", [Address("cpu1.lab")])  # not checked yet: listed without cards
    form = ui.NewRunForm()
    labels = dict((v, k) for k, v in form.inputs["machine"].options)
    assert labels["gpu1"] == "Машина: gpu1 (2xNVIDIA GeForce RTX 3090)" and labels["cpu1"] == "Машина: cpu1"
    form.set(machine="gpu1")
    form.settle()
    est = form.estimate
    assert est.gpu == "2xNVIDIA GeForce RTX 3090" and est.cards == 2 and est.precision == "bf16"
    assert not [p for p in form.problems() if p.severity == "error"], form.problems()
    assert est.tok_s.value == 250_000 and est.tok_s.kind == "measured"  # the check's burst, at the reference size
    assert est.max_batch_per_card.value > sizing.estimate(RunConfig(gpu="T4")).max_batch_per_card.value
    assert est.quota_hours.value in (None, 0) or est.quota_hours.kind == "unknown"  # a box spends no Kaggle quota
