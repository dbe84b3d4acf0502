"""The control notebook in a real browser, against the Kaggle emulator: JupyterLab on 127.0.0.1,
headless Debian Chromium driven by Playwright. A person with a fresh lab home runs every cell,
sizes a model (Layers 8 → 12, a bad Heads), adds two accounts by uploading their kaggle.json
(and sees a broken one refused beside the field), probes one and, while it runs, declares a
constellation from a folder (and sees a folder with no text refused) and prepares it (the bar
moves), sees the probe's result in its row, starts a run on Auto, sees its live curve, presses
Stop, which the monitor asks about first (a Kaggle session cannot save: what it loses is said,
then gone once the session ended), presses Continue, watches the run go on on the other account
once the first one's quota ends, branches a cooldown from one of the steps the finished run kept
through its stable phase (never from where its decay began: that branch would only repeat it)
and, while that runs, continues the run with more steps (a Steps until below its step is refused
beside the field), sees the branch's curve with its ancestor's and beside its parent's (its end
its own), finds no button or label cut off at 1,400 px, and switches to English (no Russian left,
no session's path). No key is in the page, in its screenshots' text or in the notebook saved with
its widget state. Screenshots go to artifacts/screenshots/ (their paths are printed).

Needs `scripts/install-browser-test-deps` (Chromium, JupyterLab, Playwright); skips without them.
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import time

import pytest

from conftest import ROOT
from kaggle_fixtures import make_kaggle_emulator  # noqa: F401 (fixture)
from lab_server import browser, jupyterlab_server, missing

SHOTS = ROOT / "artifacts" / "screenshots"
WEIGHTS_12 = 12 * 12 * 512**2 + 4000 * 512 + 1024 * 512  # 40,321,024
TINY = [("context", "32"), ("width", "32"), ("heads", "2"), ("layers", "2"), ("batch_per_card", "4"),
        ("steps_until", "400")]
MORE = [("eval_every", "25"), ("lr", "0.003"), ("warmup_steps", "5")]
STEP_S = 0.04  # the emulated card: a training step takes at least this long, whatever this machine
# Emulated seconds per wall second: slower than the README trial's 60, so a probe's session (20
# emulated minutes, a minute here) outlasts its real work while JupyterLab and Chromium share the CPU.
TIME_SCALE = 20.0

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"browser test: {missing()}")


class Person:
    """The browser page, with what a person does and looks at; each screenshot is checked for keys."""

    def __init__(self, page, keys: list[str]):
        self.page, self.keys, self.shots = page, keys, []
        self.started, self.took = time.monotonic(), []  # (screenshot, seconds since the start)

    def no_key_in_page(self) -> None:
        seen = self.page.content() + self.page.evaluate("document.body.innerText")
        leaked = [k for k in self.keys if k in seen]
        assert not leaked, "a Kaggle key is in the page"

    def shot(self, selector: str | None, name: str) -> None:
        self.no_key_in_page()
        path = SHOTS / name
        if selector:
            self.page.locator(selector).first.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path))
        self.shots.append(str(path))
        self.took.append((name, time.monotonic() - self.started))

    def wait_text(self, selector: str, pattern: str, timeout_s: float = 60) -> str:
        """Waits until the first element matching `selector` reads `pattern` (a regex); its text."""
        self.page.wait_for_function("([s, p]) => { const e = document.querySelector(s);"
                                    " return e && new RegExp(p).test(e.textContent); }",
                                    arg=[selector, pattern], timeout=timeout_s * 1000)
        return self.page.locator(selector).first.inner_text()

    def fill(self, selector: str, value: str) -> None:
        self.page.locator(selector).first.fill(value)

    def select(self, selector: str, starts: str) -> None:
        """Picks the option whose label starts with `starts` in the drop-down or list at `selector`."""
        labels = self.page.locator(f"{selector} option").all_inner_texts()
        label = next((t for t in labels if t.strip().startswith(starts)), None)
        assert label is not None, f"no option {starts!r} in {selector}: {labels}"
        self.page.locator(selector).first.select_option(label=label)

    def click(self, selector: str) -> None:
        self.page.locator(selector).first.click()

    def plot_src(self, cls: str) -> str:
        return self.page.locator(f"img.{cls}").first.get_attribute("src") or ""

    def plot_changed(self, cls: str, before: str, timeout_s: float = 30) -> None:
        self.page.wait_for_function("([c, b]) => { const i = document.querySelector('img.' + c);"
                                    " return i && i.getAttribute('src') !== b; }", arg=[cls, before],
                                    timeout=timeout_s * 1000)

    def plot_shown(self, cls: str, timeout_s: float = 60) -> None:
        self.page.wait_for_function("c => { const i = document.querySelector('img.' + c);"
                                    " return i && i.naturalWidth > 0 && i.offsetParent !== null; }",
                                    arg=cls, timeout=timeout_s * 1000)


def test_the_whole_lab_from_the_control_notebook_in_a_browser(make_kaggle_emulator, tmp_path, capsys, monkeypatch):
    started = time.monotonic()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the emulator's sessions train on one thread: fast beside the browser
    SHOTS.mkdir(parents=True, exist_ok=True)
    emu = make_kaggle_emulator(min_step_s=STEP_S, time_scale=TIME_SCALE)
    keys = [emu.account(n).key for n in ("alice", "bob")]
    root, home, files = tmp_path / "root", tmp_path / "lab-home", tmp_path / "files"
    for p in (root, files, tmp_path / "user-home"):
        p.mkdir()
    shutil.copy(ROOT / "notebooks" / "control.ipynb", root / "control.ipynb")
    env = {"LAB_HOME": str(home), "LAB_KAGGLE_API_URL": emu.url, "HOME": str(tmp_path / "user-home"),
           "LAB_KAGGLE_POLL_S": "0.3", "LAB_DRIVER_POLL_S": "0.3", "OMP_NUM_THREADS": "1",
           "LAB_KAGGLE_ALLOW_CPU": "1"}  # the emulator's sessions have no GPU: they train on their CPU
    person = None
    try:
        with jupyterlab_server(root, tmp_path, env, unset=("KAGGLE_API_TOKEN", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_USERNAME", "KAGGLE_KEY")) \
                as (base, token), browser((1600, 1800)) as page:
            person = Person(page, keys)
            try:
                open_and_run_all(person, base, token)
                the_form_sizes_as_you_type(person)
                add_accounts(person, emu, files)
                probe(person)
                declare_and_prepare(person, files)
                probed(person)
                run_id = start_on_auto(person)
                stop_on_kaggle(person, page)
                continue_across_accounts(person, emu, home, run_id)
                child = branch_and_more_steps(person, home, run_id)
                compare_with_ancestors(person, home, child)
                in_english(person)
                saved = save_with_widget_state(person, root)
            except Exception:
                page.screenshot(path=str(SHOTS / "failed-here.png"), full_page=True)  # what the person saw
                raise
    finally:
        with capsys.disabled():
            print("\nscreenshots (seconds into the scenario):\n  "
                  + "\n  ".join(f"{p} ({t:.0f} s)" for p, t in zip(person.shots, [t for _, t in person.took]))
                  if person else "")
            print(f"the browser scenario took {time.monotonic() - started:.0f} s")
        stop_drivers(home)
    assert "application/vnd.jupyter.widget-state+json" in saved  # the widget state was saved...
    assert not [k for k in keys if k in saved]  # ...and holds no key
    for path in SHOTS.glob("*.png"):
        assert not [k for k in keys if k.encode() in path.read_bytes()]


# ---------------------------------------------------------------------------------------
# The scenario's steps


def open_and_run_all(person: Person, base: str, token: str) -> None:
    page = person.page
    page.goto(f"{base}/lab/tree/control.ipynb?token={token}")
    page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell').length >= 12", timeout=90_000)
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=90_000)  # the kernel is up
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.locator(".lab-recipes").first.wait_for(timeout=90_000)  # the last cell ran


def the_form_sizes_as_you_type(person: Person) -> None:
    person.wait_text(".lab-calc-weights", "^27 738 112$")  # the guide's size: 12·8·512² + 4000·512 + 1024·512
    person.fill(".lab-field-layers input", "12")
    person.wait_text(".lab-calc-weights", "^40 321 024$")
    person.fill(".lab-field-heads input", "7")  # invalid: Start waits for the fix
    person.wait_text(".lab-message-heads", "не делится")
    person.page.wait_for_function("document.querySelector('.lab-start').disabled === true", timeout=10_000)
    person.shot(".lab-new-run", "01-form-invalid-heads.png")


def add_accounts(person: Person, emu, files) -> None:
    broken = files / "broken-kaggle.json"
    broken.write_text('{"username": "carol", "key": ')
    add_account(person, "carol", broken)
    person.wait_text(".lab-account-message-file", "не kaggle.json")  # beside the field, no traceback
    person.shot(".lab-add-account", "02-broken-kaggle-json.png")
    for name in ("alice", "bob"):
        good = files / f"{name}-kaggle.json"
        good.write_text(json.dumps({"username": name, "key": emu.account(name).key}))
        add_account(person, name, good)
        person.wait_text(".lab-account-message-done", f"Аккаунт {name} .*добавлен")
        person.wait_text(f".lab-probe-{name}", "пробы ещё не было")
    person.shot(".lab-machines", "03-two-accounts.png")


def add_account(person: Person, name: str, kaggle_json) -> None:
    person.fill(".lab-account-name input", name)
    with person.page.expect_file_chooser() as chooser:  # the upload button opens the file dialog
        person.click(".lab-account-upload")
    chooser.value.set_files(str(kaggle_json))
    person.wait_text(".lab-account-upload", r"\(1\)")  # the browser has read the file
    person.click(".lab-account-add")


def probe(person: Person) -> None:
    person.click(".lab-do-probe-alice")
    person.wait_text(".lab-machines", "Проба займёт около")  # the cost, before anything is spent
    person.shot(".lab-machines", "04-probe-cost.png")
    person.click(".lab-confirm-probe-alice")  # it runs on Kaggle while the person goes on to the data


def probed(person: Person) -> None:
    person.wait_text(".lab-probe-alice", r"\d \d{3} ток/с", timeout_s=120)  # the result, drawn in the row
    person.shot(".lab-machines", "07-probed.png")


def declare_and_prepare(person: Person, files) -> None:
    from lab.corpus.builtin import BUILTINS
    empty, books = files / "no-text", files / "books"
    empty.mkdir()
    (empty / "cover.png").write_bytes(b"\x89PNG")
    books.mkdir()
    for i, (_, text) in enumerate(BUILTINS["pydoc"].documents()):  # 0.5 MB, four times: a bar to watch
        for copy in range(4):
            (books / f"{i:03d}-{copy}.txt").write_text(f"{copy}\n{text}", encoding="utf-8")
    tales = files / "tales"  # one's own six short texts beside the large folder
    tales.mkdir()
    for i in range(6):
        (tales / f"сказка-{i}.txt").write_text("\n".join(f"Жили-были дед и баба, и было у них {n} курочек «Ряба» "
                                                         f"номер {i}." for n in range(40)), encoding="utf-8")
    person.fill(".lab-data-name input", "books")
    person.fill(".lab-data-sources textarea", str(empty))
    person.click(".lab-data-save")
    person.wait_text(".lab-data-message-sources", "не подходит ни одного из текстовых файлов")
    person.shot(".lab-constellation-form", "05-folder-with-no-text.png")
    person.fill(".lab-data-sources textarea", f"{books}\n{tales}")
    person.fill(".lab-data-licence input", "PSF License")
    person.click(".lab-data-save")
    person.wait_text(".lab-data-done", "books записано")
    person.select(".lab-prepare-pick select", "books")
    person.page.evaluate("""() => { window.labBar = []; const bar = document.querySelector('.lab-prepare-bar');
        new MutationObserver(() => { const b = bar.querySelector('.progress-bar');
            if (b) window.labBar.push(parseFloat(b.style.width)); })
        .observe(bar, {attributes: true, subtree: true, attributeFilter: ['style']}); }""")
    person.click(".lab-prepare")
    person.wait_text(".lab-prepare-stage", "Подготовлено", timeout_s=120)
    widths = person.page.evaluate("window.labBar")
    assert any(0 < w < 100 for w in widths) and widths[-1] == 100, widths  # the bar moved
    person.wait_text(".lab-field-constellations", r"books\s—\s[\d,]+\sмлн\sтокенов")  # the form's list, no re-run
    # Each source's share, held out in proportion: the six tales train too, and give val their part.
    splits = person.page.locator(".lab-source-split").all_inner_texts()
    said = next(s for s in splits if "tales" in s)
    assert re.search(r"обучение [1-9][\d\u00a0 ]* байт .* val [1-9][\d\u00a0 ]* байт", said), splits
    person.shot(".lab-data", "06-prepared.png")


def start_on_auto(person: Person) -> str:
    page = person.page
    for name, value in TINY:
        person.fill(f".lab-field-{name} input", value)
    person.select(".lab-field-constellations select", "books")
    page.locator(".lab-more").get_by_text("Ещё").first.click()
    for name, value in MORE:
        person.fill(f".lab-field-{name} input", value)
    person.wait_text(".lab-auto-machine", "alice|bob")
    page.wait_for_function("document.querySelector('.lab-start').disabled === false", timeout=10_000)
    person.click(".lab-start")
    person.wait_text(".lab-where", "готовится|✔")
    person.wait_text(".lab-where", "✔ Прогон .* → Kaggle: (alice|bob)", timeout_s=90)  # ✔ once it runs
    run_id = page.locator(".lab-where .lab-run-id").first.inner_text()
    person.shot(".lab-new-run", "08-started-on-auto.png")
    person.plot_shown("lab-monitor-plot", 90)  # the live curve, from the session's log
    person.wait_text(".lab-run-step", r"^([3-9]\d|[1-3]\d\d) / 400$", timeout_s=60)  # thirty steps and more: a val point too
    person.wait_text(".lab-monitor-status", "идёт")
    shown = page.locator(".lab-monitor").first.inner_text()
    assert "@lab-metrics" not in shown and "в очереди" not in shown  # it trains: what it does is said so
    person.shot(".lab-monitor", "09-live-curve.png")
    return run_id


def stop_on_kaggle(person: Person, page) -> None:
    """Stop on Kaggle: its API cannot ask a session to save (its kernel is deleted), so the monitor
    says what that loses and asks first; once the session has ended, no advice about it stays."""
    person.click(".lab-stop")
    person.wait_text(".lab-stop-question", "пропадёт.*Всё равно остановить")  # what it loses, before anything
    person.shot(".lab-monitor", "10-stop-asks-first.png")
    person.click(".lab-stop-confirm")
    person.wait_text(".lab-monitor-answer", "без сохранения")
    person.wait_text(".lab-run-status", "отменён", timeout_s=60)
    page.wait_for_function("() => !document.querySelector('.lab-monitor-answer').textContent.trim()",
                           timeout=30_000)  # the session ended: what Stop said is old news
    person.shot(".lab-monitor", "11-stopped.png")


def continue_across_accounts(person: Person, emu, home, run_id: str) -> None:
    person.click(".lab-continue")
    record = wait_record(home, run_id, lambda r: len(r["links"]) >= 2 and r["links"][1]["status"] == "running", 60)
    first = record["links"][1]["machine"]
    # That account's quota ends 6 s from now: its session starts, trains a little, and is stopped.
    emu.set_quota(first, used_s=emu.account(first).gpu_total_s - 6 * TIME_SCALE)
    other = "alice" if first == "bob" else "bob"
    person.wait_text(".lab-monitor-links", rf"3\s*{other}", timeout_s=90)  # link 3, on the other account
    person.wait_text(".lab-run-status", "готово", timeout_s=120)
    person.wait_text(".lab-run-step", "^400 / 400$")
    why = person.page.locator(".lab-link-why").all_inner_texts()
    assert len(why) == 3 and all(why), why  # every pick says why, in one line
    assert "Продолжаю с чекпоинта" not in person.page.locator(".lab-monitor").first.inner_text()  # two links later
    person.shot(".lab-monitor", "12-done-across-accounts.png")


def branch_and_more_steps(person: Person, home, run_id: str) -> str:
    """A cooldown branch from the finished run's checkpoint in its constant phase and, while it
    runs, the run itself continued with more steps: two sessions side by side."""
    person.click(".lab-runs-refresh")
    person.wait_text(".lab-branch-run", run_id)
    person.wait_text(".lab-branch-step", r"\d")
    # Several steps of its stable phase (a WSD run keeps its quarters), none from where its decay began (320).
    offered = [int(re.sub(r"\D", "", t)) for t in person.page.locator(".lab-branch-step option").all_inner_texts()]
    assert len(offered) >= 2 and max(offered) < 320, offered
    not_cut(person, "Ветка охлаждения")
    person.shot(".lab-runs", "13-branch-row.png")  # its run and step shown, a fraction box wide enough
    person.click(".lab-branch")
    said = person.wait_text(".lab-recipes-branch", "Ветка .* запущена")
    child = re.search(r"\d{8}-\d{6}-\S+", said).group(0)
    person.select(".lab-more-run select", run_id)
    person.fill(".lab-more-steps input", "300")  # below the run's step: beside the field
    person.wait_text(".lab-message-more-steps", "не больше шага")
    person.page.wait_for_function("document.querySelector('.lab-more-go').disabled === true", timeout=10_000)
    person.shot(".lab-runs", "14-more-steps-below.png")
    person.fill(".lab-more-steps input", "500")
    person.page.wait_for_function("document.querySelector('.lab-more-go').disabled === false", timeout=10_000)
    person.click(".lab-more-go")
    # A finished WSD run grows from its stable phase: a run of its own, from the checkpoint before its decay.
    grown = re.search(r"Прогон (\S+) продолжает", person.wait_text(".lab-more-done", "до шага 500")).group(1)
    record = wait_record(home, grown, lambda r: r["status"] == "done" and r["settled"]["config"]["steps_until"] == 500,
                         120)
    assert record["parent"]["run"] == run_id and record["parent"]["step"] < 400
    person.wait_text(".lab-run-step", "^500 / 500$", timeout_s=30)  # the monitor follows the newest start
    return child


def compare_with_ancestors(person: Person, home, child: str) -> None:
    wait_record(home, child, lambda r: r["status"] == "done", 120)
    person.click(".lab-runs-refresh")
    person.wait_text(".lab-runs-table", child)
    chosen = person.page.locator(".lab-runs-choose select").first.evaluate(
        "s => [...s.selectedOptions].map(o => o.textContent.trim())")
    if chosen != [child]:  # the parent was chosen when the branch started: its curve is drawn now
        before = person.plot_src("lab-runs-plot")
        person.select(".lab-runs-choose select", child)
        person.plot_changed("lab-runs-plot", before)  # the child's, its parent's part drawn in up to the branch step
    person.plot_shown("lab-runs-plot")
    assert person.page.locator(".lab-runs input[type=checkbox]").first.is_checked()  # with ancestors
    person.wait_text(".lab-grow-run", child)  # drawn after the plot: the plot is the child's
    person.page.wait_for_function("() => { const i = document.querySelector('img.lab-runs-plot');"
                                  " return i && i.complete && i.naturalWidth > 0; }", timeout=10_000)
    person.shot(".lab-runs", "15-runs-plot-with-ancestors.png")  # titled with the child's id, ending at its step
    branch_differs_from_its_parent(person, home, child)


def branch_differs_from_its_parent(person: Person, home, child: str) -> None:
    """The branch decayed where its parent still trained at its full rate: its end is its own, drawn
    beside the parent's curve (the comparison's y axis where the two lie)."""
    parent = json.loads((home / "runs" / child / "run.json").read_text())["parent"]["run"]
    end = json.loads((home / "runs" / child / "run.json").read_text())["settled"]["config"]["steps_until"]
    losses = {run: {r["step"]: r["loss"] for r in map(json.loads, (home / "runs" / run / "metrics.jsonl").read_text()
                                                             .splitlines()) if "loss" in r} for run in (child, parent)}
    assert losses[child][end] != losses[parent][end], (end, losses[child][end])  # not its parent's loss, repeated
    before = person.plot_src("lab-runs-plot")
    person.page.locator(".lab-runs-choose select").first.select_option(label=[child, parent])
    person.plot_changed("lab-runs-plot", before)
    person.page.wait_for_function("() => { const i = document.querySelector('img.lab-runs-plot');"
                                  " return i && i.complete && i.naturalWidth > 0; }", timeout=10_000)
    person.shot(".lab-runs", "16-branch-beside-its-parent.png")


def not_cut(person: Person, *words: str) -> None:
    """At 1,400 px wide, no button or label of the lab's cells is cut to "П…": each shows its whole
    words (`words`: some that must be among them)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    page = person.page
    size = page.viewport_size
    page.set_viewport_size({"width": 1400, "height": size["height"]})
    try:
        page.wait_for_timeout(300)  # the notebook lays its cells out anew
        # A panel redrawn in the other language (the runs panel's on its next refresh) comes a little later.
        with contextlib.suppress(PlaywrightTimeout):  # the assertion below names the words not seen
            page.wait_for_function("words => words.every(w => document.body.innerText.includes(w))",
                                   arg=list(words), timeout=15_000)
        cut = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .widget-button, '
            + '.jp-Notebook .widget-toggle-button, .jp-Notebook .widget-label, .jp-Notebook .widget-label-basic')]
            .filter(e => e.offsetParent !== null && e.textContent.trim() && e.scrollWidth > e.clientWidth + 1)
            .map(e => e.textContent.trim())""")
        seen = page.evaluate("document.body.innerText")
    finally:
        page.set_viewport_size(size)
    assert not cut, f"cut off at 1,400 px: {cut}"
    assert all(w in seen for w in words), words


def in_english(person: Person) -> None:
    page = person.page
    starts = page.evaluate("[...document.querySelectorAll('.jp-Notebook .widget-button')]"
                           ".filter(b => b.textContent.trim() === 'Старт').length")
    assert starts == 1 and "⏳" not in page.evaluate("document.body.innerText")  # the form's own; a glyph Chromium has
    not_cut(person, "Проба", "Удалить", "с предками")
    page.locator(".lab-language").first.get_by_text("EN", exact=True).click()
    page.locator(".lab-new-run").get_by_text("Layers", exact=True).wait_for(timeout=10_000)
    person.wait_text(".lab-monitor-status", "done")
    person.wait_text(".lab-machines", "Add a Kaggle account")
    person.wait_text(".lab-more-info", "From its checkpoint at step")
    person.wait_text(".lab-account-message-done", "Added bob")
    english = page.evaluate("document.body.innerText")
    for russian in ("С его чекпоинта", "добавлен", "{'step'"):
        assert russian not in english, russian  # no Russian left in the English view, no raw result
    ending = page.locator(".lab-log").first.inner_text().split("stopped at step")[-1]
    assert "its checkpoint is checkpoints/ckpt_" in ending and "/kaggle/working" not in ending  # in the run folder
    not_cut(person, "with ancestors", "Cooldown branch")
    person.shot(None, "17-page-in-english.png")


def save_with_widget_state(person: Person, root) -> str:
    page = person.page
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        saved = (root / "control.ipynb").read_text(encoding="utf-8")
        if "widget-state" in saved:
            return saved
        time.sleep(0.3)
    return (root / "control.ipynb").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------
# Reading the lab's own records while the browser plays


def wait_record(home, run_id: str, condition, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            record = json.loads((home / "runs" / run_id / "run.json").read_text())
            if condition(record):
                return record
        except (OSError, ValueError, KeyError, IndexError):
            record = None
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id}: timed out; last record: {record}")
        time.sleep(0.2)


def stop_drivers(home) -> None:
    """Cancels every run still driven in the background (the test leaves no process behind)."""
    import os
    if not (home / "runs").is_dir():
        return
    old = os.environ.get("LAB_HOME")
    os.environ["LAB_HOME"] = str(home)
    try:
        from lab.api import runs as api_runs
        for folder in (home / "runs").iterdir():
            if (folder / "run.json").is_file() and api_runs.driven(folder.name):
                api_runs.cancel(folder.name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(api_runs.driven(f.name) for f in (home / "runs").iterdir()
                                                   if (f / "run.json").is_file()):
            time.sleep(0.3)
    finally:
        if old is None:
            os.environ.pop("LAB_HOME", None)
        else:
            os.environ["LAB_HOME"] = old

