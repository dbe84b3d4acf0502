"""The control notebook in a real browser: JupyterLab on 127.0.0.1, headless Debian Chromium
driven by Playwright. Runs all cells, changes Layers from 8 to 12 and sees the weights change,
starts a tiny run on this computer and sees its loss plot. Screenshots go to
artifacts/screenshots/ (their paths are printed).

Needs `scripts/install-browser-test-deps` (Chromium, JupyterLab, Playwright); skips without them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

from lab_server import browser, jupyterlab_server, missing
from conftest import ROOT

SHOTS = ROOT / "artifacts" / "screenshots"
WEIGHTS_12 = 12 * 12 * 512**2 + 4000 * 512 + 1024 * 512  # 40,321,024
TINY = [("context", "32"), ("width", "32"), ("heads", "2"), ("layers", "2"), ("batch_per_card", "4"),
        ("steps_until", "30")]
MORE = [("eval_every", "10"), ("lr", "0.003"), ("warmup_steps", "2")]

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"browser test: {missing()}")


def weights_are(page, value: int, timeout_ms: int = 20_000) -> None:
    page.wait_for_function("v => { const e = document.querySelector('.lab-calc-weights');"
                           " return e && e.textContent.replace(/\\D/g, '') === v; }", arg=str(value), timeout=timeout_ms)


def test_the_control_notebook_in_a_browser(tmp_path, capsys):
    SHOTS.mkdir(parents=True, exist_ok=True)
    root, home = tmp_path / "root", tmp_path / "lab-home"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / "control.ipynb", root / "control.ipynb")
    shots: list[str] = []

    def shot(locator, name: str) -> None:
        path = SHOTS / name
        locator.screenshot(path=str(path))
        shots.append(str(path))

    run_id = None
    try:
        with jupyterlab_server(root, tmp_path, {"LAB_HOME": str(home)}) as (base, token), \
                browser((1600, 2000)) as page:
            page.goto(f"{base}/lab/tree/control.ipynb?token={token}")
            page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell').length >= 10", timeout=90_000)
            page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=90_000)  # the kernel is up

            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            page.locator(".lab-runs").first.wait_for(timeout=90_000)  # the last cell ran
            weights_are(page, 27_738_112)  # the guide's size: 12·8·512² + 4000·512 + 1024·512
            shot(page.locator(".lab-new-run").first, "01-new-run-form.png")

            layers = page.locator(".lab-field-layers input")
            assert layers.input_value() == "8"
            layers.fill("12")
            weights_are(page, WEIGHTS_12)
            assert page.locator(".lab-calc-weights").first.inner_text() == "40 321 024"
            shot(page.locator(".lab-new-run").first, "02-layers-12.png")

            page.locator(".lab-field-heads input").fill("7")  # invalid: Start waits for the fix
            page.locator(".lab-message-heads").get_by_text("не делится").wait_for(timeout=10_000)
            page.wait_for_function("document.querySelector('.lab-start').disabled === true", timeout=10_000)
            shot(page.locator(".lab-new-run").first, "03-invalid-heads.png")

            for name, value in TINY:
                page.locator(f".lab-field-{name} input").fill(value)
            page.locator(".lab-field-machine select").select_option(label="Этот компьютер")
            page.locator(".lab-field-gpu select").select_option(label="CPU")
            page.locator(".lab-more").get_by_text("Ещё").first.click()
            for name, value in MORE:
                page.locator(f".lab-field-{name} input").fill(value)
            weights_are(page, 12 * 2 * 32**2 + 4000 * 32 + 32 * 32)
            page.wait_for_function("document.querySelector('.lab-start').disabled === false", timeout=10_000)
            shot(page.locator(".lab-new-run").first, "04-tiny-run.png")

            page.locator(".lab-start").first.click()
            page.locator(".lab-where .lab-run-id").first.wait_for(timeout=60_000)
            run_id = page.locator(".lab-where .lab-run-id").first.inner_text()
            page.wait_for_function("(() => { const i = document.querySelector('img.lab-monitor-plot');"
                                   " return i && i.naturalWidth > 0 && i.offsetParent !== null; })()", timeout=150_000)
            shot(page.locator(".lab-monitor").first, "05-monitor-loss-plot.png")
            page.wait_for_function("(() => { const s = document.querySelector('.lab-run-status');"
                                   " return s && /готово|упал|остановлен/.test(s.textContent); })()", timeout=150_000)
            assert "готово" in page.locator(".lab-run-status").first.inner_text()
            shot(page.locator(".lab-monitor").first, "06-monitor-done.png")
            page.locator(".lab-runs button").first.click()  # Refresh: the run is in the table
            page.locator(".lab-runs").get_by_text(run_id).first.wait_for(timeout=20_000)
            page.wait_for_function("(() => { const i = document.querySelector('img.lab-runs-plot');"
                                   " return i && i.naturalWidth > 0 && i.offsetParent !== null; })()", timeout=30_000)
            shot(page.locator(".lab-runs").first, "07-runs.png")
            page.screenshot(path=str(SHOTS / "08-page.png"))
            shots.append(str(SHOTS / "08-page.png"))

            page.locator(".lab-language").first.get_by_text("EN", exact=True).click()  # the English switch
            page.locator(".lab-new-run").get_by_text("Layers", exact=True).wait_for(timeout=10_000)
            page.wait_for_function("document.querySelector('.lab-calc-weights').textContent === '153,600'",
                                   timeout=10_000)  # English digit grouping
            assert page.locator(".lab-field-layers input").input_value() == "2"  # values stay
            shot(page.locator(".lab-new-run").first, "09-english.png")
    finally:
        with capsys.disabled():
            print("\nscreenshots:\n  " + "\n  ".join(shots))
        if run_id:
            _stop(home, run_id)
    record = json.loads((home / "runs" / run_id / "run.json").read_text())
    assert record["status"] == "done" and record["links"][0]["machine"] == "local"
    assert (home / "runs" / run_id / "metrics.jsonl").is_file()


def _stop(home, run_id: str, wait_s: float = 60.0) -> None:
    """Waits for the run's background driver to finish; cancels the run if it does not."""
    old = os.environ.get("LAB_HOME")
    os.environ["LAB_HOME"] = str(home)
    try:
        from lab.machines import driver as machines
        deadline = time.monotonic() + wait_s
        while machines.driver_alive(run_id) and time.monotonic() < deadline:
            time.sleep(0.5)
        if machines.driver_alive(run_id):
            machines.cancel(run_id)
    finally:
        if old is None:
            os.environ.pop("LAB_HOME", None)
        else:
            os.environ["LAB_HOME"] = old
