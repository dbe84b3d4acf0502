"""The run's fields, defined once: every command, the form and the checks follow the definition."""
from __future__ import annotations

import argparse
import importlib

import pytest

from lab.config import ConfigError, RunConfig, check, coerce, field_choices, field_kind, field_names
from lab.fields import field_help, field_label, flag_specs


def options_of(configure) -> set[str]:
    parser = argparse.ArgumentParser()
    configure(parser)
    return {o for action in parser._actions for o in action.option_strings}


# `lab train` is the loop itself: where the run goes (`machine`) is no business of it.
@pytest.mark.parametrize("command, not_taken", [("lab.cli.size", ()), ("lab.cli.train", ("machine",)),
                                                ("lab.cli.runs", ())])
def test_every_command_takes_every_run_fields_flag(command, not_taken):
    given = options_of(importlib.import_module(command).configure)
    missing = {opts[0] for opts, _ in flag_specs(exclude=not_taken) if not set(opts) <= given}
    assert not missing, f"{command} lacks {sorted(missing)}"


def test_flags_are_named_after_the_fields_and_typed_by_them():
    parser = argparse.ArgumentParser()
    for opts, kw in flag_specs():
        parser.add_argument(*opts, **kw)
    args = parser.parse_args(["--batch-per-card", "4", "-c", "pydoc", "-c", "notes", "--lr", "3e-3",
                              "--resume", "runs/a"])
    values = {k: coerce(k, v) for k, v in vars(args).items() if v is not None}
    assert values == {"batch_per_card": 4, "constellations": ["pydoc", "notes"], "lr": 0.003, "resume_from": "runs/a"}
    with pytest.raises(ConfigError, match="batch_per_card: '4.5' is not a valid int"):
        coerce("batch_per_card", "4.5")


def test_every_field_has_a_label_and_help_in_english_and_russian():
    for name in field_names():
        texts = [field_label(name, "en"), field_label(name, "ru"), field_help(name, "en"), field_help(name, "ru")]
        assert all(texts), name
        assert field_label(name, "en") != field_label(name, "ru") or name in ("lr",), name
    assert field_label("heads", "ru") == "Головы"
    assert "512 / 8" in field_help("heads", "ru") and "на голову" in field_help("heads", "ru")


def test_a_value_outside_a_fields_choices_is_an_error_in_both_languages():
    assert field_choices("schedule") == ("wsd", "cosine", "linear", "inv_sqrt")
    for name in ("schedule", "gpu", "parallel", "precision"):
        problems = check(RunConfig(**{name: "nope"}))
        assert [p.field for p in problems] == [name]
        assert "nope" in problems[0].en and "nope" in problems[0].ru


def test_field_kinds_follow_the_declared_types():
    assert [field_kind(n) for n in ("layers", "lr", "gpu", "constellations")] == ["int", "float", "str", "list"]
