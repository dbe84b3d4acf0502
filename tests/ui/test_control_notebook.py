"""notebooks/control.ipynb executed headless (nbclient) in a temporary lab home, as committed.

Headless runs fill the notebook's `parameters` cell the way papermill does: a cell after it
that sets `form_values`, `press_start`, `wait_minutes`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

from conftest import ROOT, lab
from lab.notebooks import CONTROL_NOTEBOOK, control_notebook_text
from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)

NOTEBOOK = CONTROL_NOTEBOOK
TINY_RUN = {"context": 32, "width": 32, "heads": 2, "layers": 2, "batch_per_card": 4, "steps_until": 30,
            "eval_every": 10, "lr": 0.003, "warmup_steps": 2, "machine": "local", "gpu": "cpu"}


def execute(parameters: str = "", cwd=None) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    if parameters:
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(parameters))
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(cwd or ROOT)}}).execute()
    return nb


def outputs(nb, source_start: str) -> list[dict]:
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(source_start))
    return cell.outputs


def widget_texts(nb) -> str:
    """Every string a saved widget holds (what a person would see), joined."""
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return "\n".join(str(v) for model in state.values() for v in model["state"].values() if isinstance(v, str))


def errors(nb) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"]


def test_the_committed_notebook_has_no_outputs_and_is_what_the_generator_writes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    assert all(len(c.source.splitlines()) <= 5 for c in code), "cells stay short: each calls lab"
    assert all("ui." in c.source for c in code if "parameters" not in c.metadata.get("tags", []))
    assert NOTEBOOK.read_text(encoding="utf-8") == control_notebook_text(), \
        "notebooks/control.ipynb is stale: run scripts/make-control-notebook"


def test_the_notebook_runs_top_to_bottom_on_a_fresh_lab_home(tmp_path, monkeypatch):
    home = tmp_path / "lab-home"
    monkeypatch.setenv("LAB_HOME", str(home))
    nb = execute('form_values = {"layers": 12}', cwd=tmp_path)
    assert errors(nb) == []
    for start in ("from lab import ui", "ui.machines()", "form = ui.new_run", "monitor = ", "ui.runs()"):
        shown = outputs(nb, start)
        assert len(shown) == 1 and "application/vnd.jupyter.widget-view+json" in shown[0]["data"], start
    starts = [c for c in nb.cells if c.cell_type == "code" and "ui.start(" in c.source]
    assert len(starts) == 1 and starts[0].source.startswith("form = ui.new_run")  # one Start: the form's own
    texts = widget_texts(nb)
    assert str(home) in texts  # the setup cell names the lab home
    assert "lab-calc-weights'>40 321 024<" in texts  # 12·12·512² + 4000·512 + 1024·512
    assert "Авто выберет" in texts and "Прогонов пока нет" in texts
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # nothing started


def test_the_notebook_starts_a_tiny_local_run_and_shows_its_loss(tmp_path, monkeypatch):
    home = tmp_path / "lab-home"
    monkeypatch.setenv("LAB_HOME", str(home))
    nb = execute(f"form_values = {TINY_RUN!r}\npress_start = True\nwait_minutes = 3", cwd=ROOT / "notebooks")
    assert errors(nb) == []
    runs = [p for p in (home / "runs").iterdir() if (p / "run.json").is_file()]
    assert len(runs) == 1
    record = json.loads((runs[0] / "run.json").read_text())
    assert record["status"] == "done" and record["links"][0]["machine"] == "local"
    assert record["settled"]["config"]["layers"] == 2 and record["settled"]["config"]["steps_until"] == 30
    shown = outputs(nb, "monitor = ")
    html = "".join(o["data"].get("text/html", "") for o in shown if o["output_type"] == "display_data")
    assert runs[0].name in html and "готово" in html and "30 / 30" in html
    assert any("image/png" in o.get("data", {}) for o in shown), "the monitor shows the loss plot"
    assert runs[0].name in widget_texts(nb)  # Start said where the run went
    listing = lab("runs").stdout  # the command, from the repository's root, in the same lab home
    assert runs[0].name in listing and f"lab home: {home} ($LAB_HOME)" in listing


def test_one_lab_home_wherever_the_notebook_or_the_command_is_started(tmp_path):
    """Without $LAB_HOME the notebook (its kernel starts in notebooks/) and the command (the demo's,
    from the repository's root, or from anywhere) use the kit's own lab-home beside lab/, and say so."""
    env = {k: v for k, v in os.environ.items() if k != "LAB_HOME"}
    kit = ROOT / "lab-home"
    setup = subprocess.run([sys.executable, "-c", "from lab.ui.panels import SetupPanel; print(SetupPanel().info.value)"],
                           cwd=ROOT / "notebooks", env=env, capture_output=True, text=True, check=True).stdout
    assert f"<code class='lab-home'>{kit}</code>" in setup and "свой у кита" in setup
    for cwd in (ROOT, tmp_path):
        told = subprocess.run([sys.executable, "-m", "lab.cli", "--help"], cwd=cwd, env=env, capture_output=True,
                              text=True, check=True).stdout
        assert f"lab home: {kit} (the kit's own" in " ".join(told.split())
    assert "LAB_HOME=" not in (ROOT / "scripts" / "demo").read_text()  # the demo takes the kit's own too


def test_the_notebook_shows_kaggle_accounts_from_the_emulator_and_saves_no_secret(kaggle_lab, tmp_path):
    nb = execute("", cwd=tmp_path)
    assert errors(nb) == []
    texts = widget_texts(nb)
    assert "<b>alice</b>" in texts and "<b>bob</b>" in texts
    assert "30,0 ч" in texts  # each account's weekly quota: left of total
    saved = nbformat.writes(nb)
    for name in ("alice", "bob"):
        assert kaggle_lab.emu.account(name).key not in saved
