"""The law past its data where a person uses it: `lab fit --predict` prints each prediction with
its 95% interval, "when to grow" ends with the law's prediction for the next size and the same
interval, and the recipe panel shows the sizes 3× and 20× past the largest fitted."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from lab.api import recipes as api_recipes
from lab.cli.fit import _weights_tokens
from lab.config import RunConfig
from lab.recipes.fit import fit_law, save_fit
from lab.recipes.points import write_points_file
from lab.sizing import weight_count, when_to_grow
from tests.conftest import lab_here
from tests.recipes.test_fit_coverage import made_up_law

VAL_SET, TOKENIZER = "abc123", "tok-sha"
MANIFEST = {"format": 1, "train_tokens": 2_000_000_000, "val_set": VAL_SET,
            "tokenizer": {"vocab": 4000, "sha256": TOKENIZER}}


@pytest.fixture(scope="module")
def law_points():
    truth, points = made_up_law(3)
    for p in points:
        p.val_set, p.tokenizer = VAL_SET, TOKENIZER
    return truth, points


@pytest.fixture(scope="module")
def saved(recipe_home, law_points):
    fit = fit_law(law_points[1])
    save_fit(fit)
    return fit


def test_lab_fit_predict_prints_each_prediction_with_an_interval_that_widens(tmp_path, recipe_home, law_points):
    path = tmp_path / "points.jsonl"
    write_points_file(path, law_points[1])
    largest = max(p.weights for p in law_points[1])
    asked = [f"{f * largest:g}:{20 * f * largest:g}" for f in (1, 3, 20)]
    code, out, err = lab_here("fit", "--points", str(path), "--json", *sum((["--predict", a] for a in asked), []))
    assert code == 0, err
    out = json.loads(out)
    preds = out["predictions"]
    assert [set(p) >= {"weights", "tokens", "loss", "interval"} for p in preds] == [True] * 3
    widths = [(p["interval"][1] - p["interval"][0]) / p["loss"] for p in preds]
    assert widths[0] < widths[1] < widths[2]
    assert all(p["interval"][0] < p["loss"] < p["interval"][1] for p in preds)
    text = lab_here("fit", "--points", str(path), "--predict", asked[2])[1]
    assert "20× the largest size fitted" in text and f"{preds[2]['interval'][0]:.4f}–{preds[2]['interval'][1]:.4f}" in text
    with pytest.raises(SystemExit) as bad:  # argparse's own exit, in this process
        lab_here("fit", "--points", str(path), "--predict", "1e7")
    assert bad.value.code == 2
    with pytest.raises(argparse.ArgumentTypeError, match="give WEIGHTS:TOKENS, both above 0"):
        _weights_tokens("1e7")  # argparse's one line says this


def test_when_to_grow_ends_with_the_laws_prediction_for_the_next_size(saved):
    losses = [5.0 - 0.3 * i for i in range(8)] + [2.6 + 0.002 * ((-1) ** i) for i in range(12)]
    history = [{"step": i, "tokens": (i + 1) * 10_000_000, "val_loss": v, "val_set": VAL_SET}
               for i, v in enumerate(losses)]
    v = when_to_grow(history, MANIFEST, RunConfig())
    nxt = weight_count(12, 512, 4000, 1024)
    tokens = 20 * nxt  # the data suffice for what it wants
    low, high = saved.predict_interval(nxt, tokens)
    assert v.next_loss == pytest.approx(saved.predict(nxt, tokens), abs=1e-4)
    assert v.next_loss_interval == [pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4)]
    assert f"(95%: {low:.3f}–{high:.3f}" in v.reason_en and "Закон лабы" in v.reason_ru
    assert when_to_grow(history, {**MANIFEST, "val_set": "other"}, RunConfig()).next_loss is None  # no law for that data


def test_the_recipe_panel_shows_the_law_past_its_data(saved, law_points, monkeypatch):
    from lab import ui
    from lab.ui.recipes import RecipePanel
    key = f"{VAL_SET}|{TOKENIZER}"
    monkeypatch.setattr(api_recipes, "groups", lambda runs=None: {key: law_points[1]})
    monkeypatch.setattr(api_recipes, "figures", lambda *a: [])  # the plots are tests/recipes/test_plots.py's
    ui.set_language("en")
    try:
        panel = RecipePanel()
        html = panel.summary.value
    finally:
        ui.set_language("ru")
    assert "lab-recipes-grow" in html
    for p in api_recipes.beyond(saved):
        assert f"{p.interval[0]:.3f}–{p.interval[1]:.3f}" in html
        assert f"{p.beyond:g}× the largest" in html
    assert math.isclose(api_recipes.beyond(saved)[1].beyond, 20.0)
