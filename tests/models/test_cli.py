"""`lab sample`: streamed text as a person runs it, and bad input said in one line, exit 2."""
from __future__ import annotations

import pytest

from lab.config import RunConfig
from lab.runs import Settled, create_run
from tests.conftest import lab, lab_here
from tests.models.test_sampling import RUSSIAN


def test_lab_sample_prints_the_prompt_and_its_continuations_repeatably(trained):
    args = ("sample", trained.run.id, "--prompt", RUSSIAN, "--tokens", "30", "--num-samples", "2", "--seed", "3")
    first = lab(*args)
    assert first.stdout.startswith(RUSSIAN) and first.stdout.count("\n---\n") == 1
    assert first.stdout.split("\n---\n")[1].startswith(RUSSIAN)
    assert "step 40" in first.stderr and "cpu fp32" in first.stderr
    assert lab(*args).stdout == first.stdout


def test_lab_sample_reads_a_prompt_file_and_takes_a_checkpoint_file(trained, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The for statement", encoding="utf-8")
    ckpt = sorted((trained.run.folder / "checkpoints").glob("ckpt_*.pt"))[-1]
    code, out, err = lab_here("sample", str(ckpt), "--prompt-file", str(prompt), "--tokens", "5")
    assert code == 0, err
    assert out.startswith("The for statement")


@pytest.mark.parametrize("args,words", [
    (["--temperature", "-0.5"], "temperature -0.5 must be 0 (greedy: the likeliest token) or above"),
    (["--top-p", "0"], "top-p 0.0 must be in (0, 1]"),
    (["--tokens", "0"], "at least 1 new token"),
])
def test_bad_sampling_settings_are_one_clear_line(trained, args, words):
    code, out, err = lab_here("sample", trained.run.id, *args)
    assert code == 2 and words in err and out == ""


def test_an_empty_prompt_file_is_refused(trained, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    code, _, err = lab_here("sample", trained.run.id, "--prompt-file", str(empty))
    assert code == 2 and "is empty" in err


def test_a_run_with_no_checkpoint_is_refused_for_sample_eval_and_export(trained, tmp_path):
    fresh = create_run(Settled.whole(RunConfig(context=32, width=32, heads=2, layers=2)))
    (tmp_path / "t.txt").write_text("text", encoding="utf-8")
    for args in (["sample", fresh.id], ["eval", fresh.id, "--text", str(tmp_path / "t.txt")], ["export", fresh.id]):
        code, _, err = lab_here(*args)
        assert code == 2, args
        assert f"run {fresh.id} has no usable checkpoint yet" in err and "Traceback" not in err


def test_an_unknown_run_is_refused(trained):
    code, _, err = lab_here("sample", "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err
