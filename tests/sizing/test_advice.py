"""What the calculator advises about a size, as `lab size` prints it (issue 40, point 3): a model
too big for its data overfits (it does not "undertrain"), no size is suggested below the embedding
alone, the epochs are the run's own, a tiny run's time is in seconds, and a wrong field is one
error line, not a table of unknowns (point 9)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import lab_here
from lab.sizing.words import format_hours

SMALL_DATA = {"format": 1, "constellations": {"pydoc": {"train_tokens": 10_000, "val_tokens": 1_000}},
              "train_tokens": 10_000, "val_tokens": 1_000, "shortest_val_tokens": 1_000,
              "tokenizer": {"vocab": 512}, "val_set": "abc123"}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def manifest_file(tmp_path: Path, m: dict) -> str:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    return str(path)


def size_json(*args: str) -> dict:
    code, out, err = lab_here("size", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_a_model_too_big_for_its_data_is_said_to_overfit_with_a_size_the_data_suit(tmp_path):
    m = manifest_file(tmp_path, {**SMALL_DATA, "train_tokens": 1_000_000,
                                 "constellations": {"pydoc": {"train_tokens": 1_000_000, "val_tokens": 1_000}}})
    args = ("--manifest", m, "--gpu", "cpu", "--machine", "local", "--layers", "2", "--width", "64", "--heads", "2",
            "--context", "32", "--batch-per-card", "4")
    code, out, err = lab_here("size", *args)
    assert code == 0, err
    # 133 K weights want 2.66 M tokens: the 1 M there would be read over and over
    assert "read the data ~2.7 times over" in out and "it will overfit" in out and "undertrained" not in out
    assert "Pick a size up to ~50.0 K weights" in out  # 1 M tokens / 20, above the embedding's (512 × 64) 32.8 K
    ru = lab_here("size", "--lang", "ru", *args)[1]
    assert "переобучится" in ru and "недообучится" not in ru


def test_no_size_is_suggested_below_the_embedding_alone(tmp_path):
    m = manifest_file(tmp_path, SMALL_DATA)  # 10 K tokens want a 500-weight model: no model of d 100 is that small
    out = size_json("--manifest", m, "--width", "100", "--heads", "4", "--context", "32", "--layers", "2")
    [warning] = [w for w in out["warnings"] if w["field"] == "layers"]
    assert "Pick a size" not in warning["en"] and "the embedding alone (512 × 100) is 51.2 K weights" in warning["en"]
    assert "одно только вложение" in warning["ru"]


def test_the_epochs_are_the_runs_own_passes_over_its_data(tmp_path):
    m = manifest_file(tmp_path, SMALL_DATA)
    args = ("--manifest", m, "--gpu", "cpu", "--machine", "local", "--width", "100", "--heads", "4",
            "--context", "32", "--layers", "2", "--batch-per-card", "4", "--steps-until", "500")
    out = size_json(*args)
    reads = 500 * 4 * 32
    assert out["tokens_planned"]["value"] == reads
    assert out["epochs"]["value"] == pytest.approx(reads / 10_000) == out["tokens_planned"]["epochs"]
    text = lab_here("size", *args)[1]
    assert "epochs                   6.4 " in text and "this run reads them 6.4 time(s)" in text


def test_a_tiny_runs_time_is_in_seconds_not_zero_minutes():
    out = size_json("--gpu", "cpu", "--machine", "local", "--layers", "1", "--width", "32", "--heads", "2",
                    "--context", "32", "--batch-per-card", "1", "--steps-until", "1")
    hours = out["run_hours"]
    assert 0 < hours["value"] < 1 / 60
    text = lab_here("size", "--gpu", "cpu", "--machine", "local", "--layers", "1", "--width", "32", "--heads", "2",
                    "--context", "32", "--batch-per-card", "1", "--steps-until", "1")[1]
    [row] = [line for line in text.splitlines() if "time, whole run" in line]
    assert "min" not in row and f"{format_hours(hours['value'])} (" in row and row.count(" s") >= 3
    assert format_hours(0.0) == "0 min"  # no quota at all stays a plain zero


def test_a_wrong_field_is_one_error_line_and_exit_2_not_a_table_of_unknowns():
    code, out, err = lab_here("size", "--layers", "-3")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["lab size: error: layers must be at least 1 (got -3)"]
