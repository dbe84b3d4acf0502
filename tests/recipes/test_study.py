"""A real mini-study on the embedded `pydoc` corpus on CPU: tiny WSD runs of three sizes,
each staged with cooldown branches, in this process; then the fit, its plots, the
calculator's prediction, and one branch through `lab branch` and the training notebook."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from lab.config import RunConfig
from tests.conftest import ROOT, lab

# Its module-scoped fixture is made once: every test of the file on one xdist worker.
pytestmark = pytest.mark.xdist_group("study")

SIZES = [(1, 16), (1, 32), (2, 48)]
BASE = dict(context=32, heads=2, batch_per_card=4, eval_every=1000, eval_batches=2, lr=3e-3, warmup_steps=2,
            steps_until=40, machine="local", constellations=["pydoc"], limit_min=30)


@pytest.fixture(scope="module")
def study(recipe_data):
    import torch
    # Tiny models on a shared CPU: one thread each is an order of magnitude faster than many.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _run_study()
    finally:
        torch.set_num_threads(threads)


def _run_study():
    from lab.recipes.runners import InlineRunner
    from lab.recipes.sweep import Sweep, plan_configs
    base = RunConfig.from_dict(BASE)
    tables = []
    sweep = Sweep(plan_configs(base, sizes=SIZES), InlineRunner(), cooldown=[0.25, 0.5, 0.75], say=tables.append,
                  poll_s=0)
    members = sweep.run()
    diverging = Sweep(plan_configs(RunConfig.from_dict({**BASE, "lr": 30.0, "grad_clip": 0.0})), InlineRunner(),
                      say=tables.append, poll_s=0).run()
    return members, diverging, tables


def test_each_size_gives_its_own_end_and_a_point_per_cooldown_branch(study):
    from lab.recipes.points import lab_points
    members, _, tables = study
    assert len(members) == 3 * (1 + 3)
    points = lab_points()
    per_size = {}
    for p in points:
        per_size.setdefault(p.weights, set()).add(p.tokens)
    assert len(per_size) == 3 and all(len(d) == 4 for d in per_size.values())
    assert len({(p.val_set, p.tokenizer) for p in points}) == 1
    assert "diverged" not in tables[-2] and "run" in tables[0]


def test_a_branch_is_a_child_of_its_run_and_its_curve_starts_with_the_parents(study):
    from lab.kernel.metrics import read_metrics
    from lab.recipes.branch import branches_of
    from lab.runs import lineage, load_run
    members, _, _ = study
    parent = load_run(members[0].run_id)
    kids = branches_of(parent.id)
    assert [k.parent["step"] for k in kids] == [10, 20, 30]
    kid = kids[1]
    assert lineage(kid) == [parent.id, kid.id]
    assert kid.cfg.decay_start == 20 and kid.cfg.steps_until == 25 and kid.status == "done"
    theirs = [r for r in read_metrics(parent.folder) if r["step"] <= 20 and "loss" in r]
    mine = [r for r in read_metrics(kid.folder) if r["step"] <= 20 and "loss" in r]
    assert mine == theirs and mine[-1]["step"] == 20
    assert parent.step == 40 and parent.cfg.steps_until == 40


def test_a_diverging_run_is_stopped_early_marked_and_no_point(study):
    from lab.recipes.points import diverged_why, lab_points, run_point
    from lab.runs import load_run
    _, diverging, tables = study
    run = load_run(diverging[0].run_id)
    assert diverged_why(run.folder)
    assert run_point(run) == (None, "diverged")
    assert run.id not in {p.run for p in lab_points()}
    assert "diverged" in tables[-1]
    from lab.kernel.metrics import read_metrics
    assert read_metrics(run.folder)[-1]["step"] < 40  # stopped early


@pytest.fixture(scope="module")
def fitted(study, recipe_home) -> dict:
    return json.loads(lab("fit", "--json").stdout)


def test_lab_fit_fits_the_study_saves_the_fit_and_writes_its_plots(fitted):
    out = fitted
    assert out["points"] == 12 and out["fit_file"]
    names = {p.rsplit("/", 1)[-1] for p in out["plots"]}
    assert {"loss-vs-tokens.png", "isoloss.png", "residuals.png"} <= names
    assert any(n.startswith("branches-") for n in names)
    for path in out["plots"]:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_calculator_predicts_the_val_loss_from_the_fit_without_numpy(fitted):
    args = ["--constellation", "pydoc", "--width", "32", "--layers", "1", "--context", "32", "--heads", "2",
            "--batch-per-card", "4", "--steps-until", "40", "--gpu", "cpu"]
    out = json.loads(lab("size", *args, "--json").stdout)
    pred = out["predicted_val_loss"]
    assert pred["kind"] == "fitted" and 3 < pred["value"] < 7
    low, high = pred["interval"]
    assert low <= high and pred["compute_optimal_weights"] > 0
    from lab.api.runs import preview
    from lab.ui.calc import calculator_html
    cfg = RunConfig(width=32, layers=1, context=32, heads=2, batch_per_card=4, gpu="cpu", steps_until=40)
    html = calculator_html(preview(cfg.to_dict()).estimate, cfg, None, None, [], [])
    assert "lab-calc-predicted_val_loss" in html and "lab-kind-fitted" in html
    code = ("import sys; from lab.api.runs import preview; "
            "e = preview(dict(width=32, layers=1, context=32, heads=2, gpu='cpu', steps_until=40)).estimate; "
            "assert e.predicted_val_loss is not None; print('numpy' in sys.modules, 'scipy' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.split() == ["False", "False"]


def test_lab_branch_runs_a_branch_through_the_training_notebook(study, recipe_home):
    from lab.runs import load_run
    members, _, _ = study
    from lab.api.runs import branch_points
    parent = load_run(members[2].run_id)  # its decay began at 32: a branch from there would only repeat it
    proc = lab("branch", parent.id, "--at", "32", check=False)
    assert proc.returncode == 2 and "would only repeat the run" in proc.stderr
    at = branch_points()[parent.id][-1]  # the newest checkpoint it kept through its constant phase
    proc = lab("branch", parent.id, "--at", str(at), "--decay-frac", "0.25", "--machine", "local", "--wait")
    kid = load_run(proc.stdout.split()[1].rstrip(":"))
    assert kid.parent["run"] == parent.id and kid.parent["step"] == at < 32
    assert kid.status == "done" and kid.step == math.ceil(at / 0.75) and kid.links[0].machine == "local"
    assert (kid.folder / "loss.png").exists()
    proc = lab("branch", parent.id, "--at", "10", check=False)
    assert proc.returncode == 2 and "no checkpoint at step 10" in proc.stderr


def test_the_control_notebook_panel_shows_the_fit_its_plots_and_offers_branches(fitted):
    from lab.ui.recipes import RecipePanel
    from lab.ui.text import lang, set_language
    panel = RecipePanel()
    assert panel.data.value
    assert "α" in panel.summary.value and "lab-recipes-params" in panel.summary.value
    assert len(panel.plots.children) >= 3
    assert panel.branching.steps_of  # WSD runs with checkpoints in their constant phase
    assert panel.branching.run.value in panel.branching.steps_of and panel.branching.step.value is not None
    before = lang()
    set_language("en" if before == "ru" else "ru")
    try:
        assert panel.fit_button.description == ("Fit the law" if before == "ru" else "Подогнать закон")
    finally:
        set_language(before)
