""""Try the model" driven from Python, on the session's tiny trained run: pick a run and a
checkpoint, generate streamed text, see wrong settings beside their field; and the runs
panel's val bits per byte."""
from __future__ import annotations

import re
import shutil

import pytest

from lab import ui
from lab.config import RunConfig
from lab.runs import Settled, create_run
from lab.api import runs as api_runs
from lab.ui.trymodel import TryModel


@pytest.fixture(autouse=True)
def home(trained, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(trained.home))
    ui.set_language("ru")
    yield trained.home
    ui.set_language("ru")


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'").replace("&quot;", '"').strip()


def test_it_offers_the_runs_with_a_checkpoint_and_their_checkpoints_newest_first(trained):
    bare = create_run(Settled.whole(RunConfig(context=32, width=32, heads=2, layers=2)))  # no checkpoint: not offered
    panel = TryModel(trained.run.id)
    assert trained.run.id in panel.run.options and bare.id not in panel.run.options
    assert panel.run.options == tuple(api_runs.with_checkpoints())
    assert panel.checkpoint.label == "шаг 40" and panel.checkpoint.value.endswith("ckpt_00000040.pt")
    assert panel.generate_button.description == "Сгенерировать"


def test_generate_streams_the_same_text_as_lab_sample_and_repeats_by_seed(loaded):
    from lab.models.sampling import Settings, sample
    panel = TryModel()
    panel.prompt.value = "Ёжик в тумане: «Лошадка!» 🦔"
    panel.inputs["tokens"].value, panel.inputs["seed"].value = 30, 4
    first = panel.generate(wait=True)
    assert first == panel.prompt.value + sample(loaded, panel.prompt.value, Settings(tokens=30, seed=4))
    assert panel.prompt.value in text(panel.output.value)
    assert "cpu fp32" in text(panel.run_message.value) and "шаг 40" in text(panel.run_message.value)
    assert panel.generate(wait=True) == first
    assert not panel.generate_button.disabled and panel.stop_button.disabled


def test_several_samples_follow_one_another_each_with_the_next_seed(loaded):
    from lab.models.sampling import Settings, sample
    panel = TryModel()
    panel.prompt.value = "The "
    panel.inputs["tokens"].value, panel.inputs["samples"].value, panel.inputs["seed"].value = 20, 2, 9
    out = panel.generate(wait=True)
    s = Settings(tokens=20, seed=9)
    assert out == f"The {sample(loaded, 'The ', s)}\n\n———\n\nThe {sample(loaded, 'The ', s, index=1)}"


def test_a_wrong_setting_is_said_beside_its_field_and_nothing_runs():
    panel = TryModel()
    panel.inputs["temperature"].value = -0.5
    assert "температура -0.5 должна быть 0 (жадно" in text(panel.messages["temperature"].value)
    assert panel.generate(wait=True) is None and panel.output.value == ""
    ui.set_language("en")
    assert "temperature -0.5 must be 0 (greedy" in text(panel.messages["temperature"].value)
    assert panel.generate_button.description == "Generate"
    panel.inputs["temperature"].value = 0.8
    assert panel.messages["temperature"].value == ""


def test_a_checkpoint_that_went_away_is_said_beside_the_run_and_refresh_finds_the_new_one(trained):
    clone = create_run(Settled.whole(trained.run.cfg))
    shutil.copytree(trained.run.folder / "checkpoints", clone.folder / "checkpoints")
    panel = TryModel(clone.id)
    assert panel.run.value == clone.id
    old = clone.folder / "checkpoints" / "ckpt_00000040"
    for suffix in (".pt", ".json"):  # the run trained on: its step-40 checkpoint pruned, a step-50 one saved
        old.with_suffix(suffix).rename(old.with_name(f"ckpt_00000050{suffix}"))
    assert panel.generate(wait=True) is None
    assert "чекпоинта ckpt_00000040.pt уже нет" in text(panel.run_message.value)
    panel.refresh_button.click()
    assert panel.checkpoint.label == "шаг 50"


def test_a_lab_home_without_checkpoints_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "empty-home"))
    panel = TryModel()
    assert panel.run.label == "— ни у одного прогона пока нет чекпоинта —"
    assert panel.generate_button.disabled and panel.generate(wait=True) is None
    ui.set_language("en")
    assert panel.run.label == "— no run has a checkpoint yet —"


def test_the_runs_panel_shows_val_bits_per_byte_beside_val_loss(trained):
    from lab.kernel.metrics import read_metrics
    from lab.models.bpb import last_val, val_bpb
    panel = ui.RunsPanel()
    row = last_val(read_metrics(trained.run.folder))
    table = text(panel.table.value)
    assert "val бит/байт" in table
    assert f"{row['val_loss']:.3f} {val_bpb(row, trained.run.cfg):.3f}".replace(".", ",") in table  # Russian decimals


def test_export_writes_the_checkpoint_and_shows_the_lines_that_load_it_in_transformers(trained):
    from lab.models.hf import FILES
    panel = TryModel(trained.run.id)
    assert panel.export_button.description == "Экспорт"
    panel.export(wait=True)
    folder = trained.home / "exports" / f"{trained.run.id}-step40"
    try:
        assert {p.name for p in folder.iterdir()} >= {"model.safetensors", "README.md", *FILES}
        shown = text(panel.export_message.value)
        assert f"записано в {folder}" in shown and "AutoModelForCausalLM.from_pretrained" in shown
        assert not panel.export_button.disabled
        panel.export(wait=True)  # once more: the folder is there
        assert "уже есть: удалите эту папку" in text(panel.export_message.value)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
