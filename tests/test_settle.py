"""A run settled once (`lab.settle.register_run`): from scratch, the same run going on, a new run
from a checkpoint; a model field against the checkpoint's is an error naming it; and the form,
`lab run` and `lab sweep` register the same config for the same fields.

Each test has its own lab home; the data is the session's prepared `pydoc`, given by folder.
Checkpoints are written by hand (a file and its sidecar, as a save leaves them), so nothing here
trains; where a caller would start a background driver, the test only records that it was asked."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace

import pytest

from conftest import lab_here
from lab import settle
from lab.config import ConfigError, RunConfig, UserError
from lab.runs import Settled, create_run, list_runs, load_run

TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=10, eval_batches=2,
            lr=3e-3, warmup_steps=2, steps_until=20, constellations=["pydoc"])


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "lab-home"))
    return tmp_path / "lab-home"


@pytest.fixture
def spawned(monkeypatch) -> list[str]:
    """The runs a caller asked a background driver for (none is started)."""
    from lab.api import runs as api_runs
    from lab.machines import control
    asked: list[str] = []

    def spawn(run_id: str, resume: bool = False) -> int:
        asked.append(run_id)
        return 0
    monkeypatch.setattr(control, "spawn_driver", spawn)
    monkeypatch.setattr(api_runs, "spawn_driver", spawn)
    return asked


def saved_run(cfg: RunConfig, step: int):
    """A run with one whole checkpoint at `step` (its file and its sidecar) and no driver. At step 10
    of TINY's 20 the run is still in its stable phase: more steps go on from there as they are (a run
    past its decay grows by its own rules: tests/test_grow.py)."""
    run = create_run(Settled.whole(cfg))
    folder = run.folder / "checkpoints"
    folder.mkdir()
    weights = f"the weights of {run.id} at {step}".encode()
    (folder / f"ckpt_{step:08d}.pt").write_bytes(weights)
    (folder / f"ckpt_{step:08d}.json").write_text(json.dumps({
        "step": step, "tokens": step * 128, "sha256": hashlib.sha256(weights).hexdigest(), "bytes": len(weights),
        "config": cfg.to_dict()}))
    return load_run(run.id), folder / f"ckpt_{step:08d}.pt"


def test_a_run_from_scratch_is_the_fields_given_and_its_machine_is_checked_first(home, pydoc_data):
    fields = {**TINY, "data_dir": str(pydoc_data), "limit_min": 700}
    with pytest.raises(UserError, match="no machine 'alice' in the lab"):
        settle.register_run(fields, machine="alice")
    assert list_runs() == [], "a refused start leaves no run behind"
    warned = []
    run = settle.register_run(fields, warn=warned.append)
    assert run.cfg == RunConfig.from_dict(fields)  # the machine too: "auto" when none is given
    assert run.status == "new" and run.parent is None and run.links == []
    assert warned == [], "Auto in a lab without Kaggle accounts meets no Kaggle rule"
    from lab.kaggle.accounts import add_account
    add_account("alice", token="KGAT_0123456789abcdef0123456789abcdef", username="alice")
    settle.register_run({**fields, "limit_min": 800}, warn=warned.append)
    # With an account, Auto caps its links there: a note, not an error (a box takes the 800 minutes whole).
    assert [(p.field, p.severity) for p in warned] == [("limit_min", "note")]


def test_data_not_prepared_yet_is_left_to_the_driver_and_prepared_data_is_checked(home, pydoc_data):
    run = settle.register_run(TINY, machine="local")  # this home has no data prepared for pydoc
    assert run.cfg.data_dir == ""
    with pytest.raises(ConfigError, match="context 100000 is longer than the data's shortest split"):
        settle.register_run({**TINY, "context": 100_000, "data_dir": str(pydoc_data)}, machine="local")
    with pytest.raises(UserError, match=r"unknown constellation\(s\): not-a-constellation"):
        settle.register_run({**TINY, "constellations": ["not-a-constellation"]}, machine="local")


def test_the_same_run_goes_on_from_its_checkpoint_with_what_is_given_on_top(home, pydoc_data):
    from lab.machines.control import cancel_flag
    run, _ = saved_run(RunConfig.from_dict({**TINY, "data_dir": str(pydoc_data), "machine": "local"}), 10)
    cancel_flag(run.id).write_text("cancelled")
    going = settle.register_run({"steps_until": 50, "lr": 1e-3}, run.id, "local")
    assert going.id == run.id and len(list_runs()) == 1
    assert going.cfg == replace(run.cfg, steps_until=50, lr=1e-3)
    assert going.status == "new" and not cancel_flag(run.id).exists(), "asking to go on forgets the cancel"
    with pytest.raises(ConfigError, match="steps_until 10 is not above the checkpoint's step 10"):
        settle.register_run({"steps_until": 10}, run.id, "local")


def test_a_new_run_from_a_checkpoint_goes_on_as_that_run_was_and_names_a_model_field_it_cannot_take(
        home, pydoc_data):
    parent, ckpt = saved_run(RunConfig.from_dict({**TINY, "data_dir": "/kaggle/input/elsewhere",
                                                  "machine": "alice"}), 10)
    with pytest.raises(ConfigError) as e:
        settle.register_run({"width": 64, "steps_until": 40}, str(ckpt), "local")
    assert "width is locked when continuing: the checkpoint has width=32, the run asks for 64" in str(e.value)
    assert [p.field for p in e.value.problems] == ["width"]
    assert len(list_runs()) == 1, "nothing registered"
    run = settle.register_run({"steps_until": 40, "data_dir": str(pydoc_data)}, str(ckpt), "local")
    assert run.id != parent.id and run.parent == {"run": parent.id, "checkpoint": str(ckpt), "step": 10}
    # Every field not given is the checkpoint's run's; where it ran (machine, data folder) is not carried.
    assert run.cfg == RunConfig.from_dict({**TINY, "steps_until": 40, "data_dir": str(pydoc_data),
                                           "machine": "local"})


FORM = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=10, lr=0.002, warmup_steps=2,
            steps_until=20, constellations=["pydoc"])  # fields the form shows
FORM_FLAGS = ["--context", "32", "--width", "32", "--heads", "2", "--layers", "2", "--batch-per-card", "4",
              "--eval-every", "10", "--lr", "0.002", "--warmup-steps", "2", "--steps-until", "20", "-c", "pydoc"]


def lab_run_detached(*flags: str) -> str:
    code, out, err = lab_here("run", "--machine", "local", "--detach", *flags)
    assert code == 0, err
    return re.search(r"^run (\S+):", out, re.M).group(1)  # "run ID: FOLDER", after any note on the fields


def test_the_form_lab_run_and_lab_sweep_register_the_same_config_for_the_same_fields(home, spawned):
    from lab.recipes.runners import LocalRunner
    from lab.recipes.sweep import Sweep, plan_configs
    from lab.ui import NewRunForm
    direct = settle.register_run(FORM, machine="local").cfg
    by_form = NewRunForm(**FORM, machine="local").start(wait=True)
    by_cli = lab_run_detached(*FORM_FLAGS)
    by_sweep = Sweep(plan_configs(RunConfig.from_dict({**FORM, "machine": "local"})), LocalRunner(),
                     say=lambda s: None).members[0].run_id
    assert load_run(by_form).cfg == load_run(by_cli).cfg == load_run(by_sweep).cfg == direct
    assert direct.data_dir == "", "nothing prepared in this home: the driver prepares it"
    assert spawned == [by_form, by_cli], "the form and `lab run --detach` spawn its driver; the sweep runs it itself"
    from lab.sizing.calibration import read_predictions
    for rid in (by_form, by_cli, by_sweep):  # each has the calculator's word on it, on this computer's card
        assert read_predictions(load_run(rid).folder)["cpu"]["tok_s"] > 0, rid


def test_a_new_run_from_a_checkpoint_is_the_same_from_the_form_and_from_lab_run(home, pydoc_data, spawned):
    from lab.ui import NewRunForm
    _, ckpt = saved_run(RunConfig.from_dict({**TINY, "data_dir": str(pydoc_data), "machine": "local"}), 10)
    form = NewRunForm(resume_from=str(ckpt), steps_until=40, lr=0.002, machine="local")
    assert form.config().width == 32 and form.inputs["width"].disabled  # locked to the checkpoint's
    by_form = load_run(form.start(wait=True)).cfg
    by_cli = load_run(lab_run_detached("--resume", str(ckpt), "--steps-until", "40", "--lr", "0.002")).cfg
    assert by_form == by_cli
    # Given: steps_until and lr; the rest is the checkpoint's run (its batch 4, not the form's default 6).
    assert by_cli == RunConfig.from_dict({**TINY, "steps_until": 40, "lr": 0.002, "machine": "local"})
    assert len(spawned) == 2
