"""The calculator's advice as the form's widgets show it (issue 40, point 3): a model too big for
its data overfits, the epochs are the run's own and the same as `lab size` says, a wrong field
leaves Auto and the quota claiming nothing, a tiny run's time is in seconds."""
from __future__ import annotations

import json
import re

import pytest

from lab import ui
from lab.api import machines as api_machines
from lab.ui import console

TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "lab-home"))
    console.machines.forget()
    ui.set_language("en")
    yield tmp_path / "lab-home"
    ui.set_language("ru")


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'").replace("&quot;", '"').strip()


def row(form, key: str) -> str:
    """What a person reads in one row of the calculator."""
    form.settle()
    found = re.search(rf"<tr class='lab-calc-row-{key}'>(.*?)</tr>", form.calc.value, re.S)
    return text(found.group(1)).replace("\u00a0", " ") if found else ""


def figure(form, key: str) -> str:
    form.settle()
    found = re.search(rf"class='lab-calc-{key}'>([^<]*)<", form.calc.value)
    return found.group(1) if found else ""


def prepared(home, train_tokens: int) -> None:
    """Prepared pydoc data of `train_tokens` (a manifest is all the calculator reads)."""
    folder = home / "data" / "pydoc-1"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({
        "format": 1, "created": "2026-01-01T00:00:00+00:00", "constellations": {"pydoc": {"train_tokens": train_tokens,
                                                                                          "val_tokens": 10_000}},
        "train_tokens": train_tokens, "val_tokens": 10_000, "shortest_val_tokens": 10_000,
        "tokenizer": {"vocab": 512}, "val_set": "abc123"}))


def covers_all(monkeypatch) -> None:
    """Auto's pick as its rule words it for an account whose quota covers the run (its rule is
    tests/machines'): what the calculator must not show for a run whose fields are wrong."""
    def choose(cfg, need_hours):
        return api_machines.Choice("bob", f"bob: its 30.0 h of GPU quota cover the whole run ({need_hours:.1f} h)",
                                   f"bob: его 30,0 ч квоты GPU хватит на весь прогон ({need_hours:.1f} ч)")
    monkeypatch.setattr(console.machines, "choose", choose)


def test_a_wrong_field_leaves_auto_and_the_quota_claiming_no_coverage(monkeypatch):
    covers_all(monkeypatch)
    form = ui.NewRunForm(**TINY, steps_until=2000)
    assert "cover the whole run" in text(form.calc.value) or figure(form, "quota")  # a right form: Auto speaks
    form.set(steps_until=0)
    form.settle()
    shown = text(form.calc.value)
    assert "cover the whole run" not in shown and "(0.0 h)" not in shown
    assert "fix the fields first" in shown and figure(form, "quota") == "—"


def test_a_tiny_runs_time_reads_seconds_not_zero_minutes():
    form = ui.NewRunForm(gpu="cpu", machine="local", **TINY, steps_until=1)
    shown = figure(form, "run_hours")
    assert re.fullmatch(r"[\d.]+\u00a0s", shown), shown
    assert "min" not in row(form, "run_hours")


def test_a_model_too_big_for_its_data_overfits_and_the_epochs_are_the_runs_own(home):
    prepared(home, 10_000)
    form = ui.NewRunForm(gpu="cpu", machine="local", **TINY, steps_until=500)
    data = row(form, "tokens_available")
    assert "the model will overfit" in data and "undertrained" not in data
    warning = text(form.rows["layers"].message.value)  # the field's own warning says it too
    assert "it will overfit" in warning and "undertrained" not in warning
    epochs = form.estimate.epochs.value
    assert epochs == pytest.approx(500 * 4 * 32 / 10_000)  # what the run reads over what the data hold
    assert f"this run reads them {epochs:g} time(s)" in data
    ui.set_language("ru")
    assert "переобучится" in row(form, "tokens_available") and "недообучится" not in row(form, "tokens_available")
