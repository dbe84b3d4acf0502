"""More steps for a finished run: grown from its stable phase, or re-warmed, never a jump to the peak."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN
from lab.config import RunConfig, UserError
from lab.kernel import checkpoint
from lab.kernel.schedule import lr_for_config
from lab.kernel.train import train
from lab.settle import preview
from lab.settle.grow import FROM_STABLE, REWARM, grow_plan

# 60 steps, warmup 6, the decay over the last 12 (from step 48): a WSD run that reaches its end.
RUN = {**TINY_RUN, "steps_until": 60, "warmup_steps": 6, "eval_every": 30}


def rates(folder: Path) -> dict[int, float]:
    """The rate each logged step trained at (a row's `lr` took the model to its step)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def finished(pydoc_data, tmp_path_factory) -> tuple[RunConfig, Path]:
    """A WSD run trained to its end, with the checkpoints the kernel keeps."""
    cfg = RunConfig(**{**RUN, "data_dir": str(pydoc_data)})
    out = tmp_path_factory.mktemp("finished")
    train(cfg, out, pydoc_data, log=lambda s: None)
    return cfg, out


def grow(plan, old: RunConfig, data: Path, out: Path) -> dict[int, float]:
    """Trains the grown run in a folder of its own (a child, as a cooldown branch is)."""
    train(plan.config(old), out, data, resume=plan.checkpoint, log=lambda s: None)
    return rates(out)


def test_the_kernel_saves_where_the_decay_begins_and_keeps_it(finished):
    _, out = finished  # with the stable phase's other quarters (12, 24, 36), for cooldown branches
    assert [checkpoint.checkpoint_step(p) for p in checkpoint.list_checkpoints(out / "checkpoints")] == [12, 24, 36, 48, 60]


def test_a_finished_run_grows_from_its_stable_phase_without_a_jump(finished, pydoc_data, tmp_path):
    old, out = finished
    before = rates(out)
    naive = RunConfig.from_dict({**old.to_dict(), "steps_until": 120})
    assert lr_for_config(60, naive) / before[60] > 5  # going on from step 60 the naive way: back to the peak

    plan = grow_plan(out, old, 120)
    assert (plan.mode, plan.step, plan.set_aside) == (FROM_STABLE, 48, (out / "checkpoints" / "ckpt_00000060.pt",))
    assert "step 48" in plan.words_en and "шага 48" in plan.words_ru
    grown = grow(plan, old, pydoc_data, tmp_path / "grown")
    assert {s: r for s, r in grown.items() if s <= 48} == {s: r for s, r in before.items() if s <= 48}  # one curve
    assert grown[49] == before[48] == old.lr  # the first new step: the stable rate, as before the decay began
    assert all(grown[s] == old.lr for s in range(49, 97))  # the new decay starts at 96, a fifth before 120
    tail = [grown[s] for s in range(97, 121)]
    assert all(b < a for a, b in zip(tail, tail[1:])) and tail[-1] < 0.15 * old.lr  # down to its floor at the new end
    assert all(torch.isfinite(torch.tensor(v)) for v in grown.values())


def test_without_its_pre_decay_checkpoint_a_finished_run_rewarms_from_its_final_rate(finished, pydoc_data, tmp_path):
    old, out = finished
    kept = tmp_path / "run" / "checkpoints"  # the run as a kit that kept only the newest two left it
    kept.mkdir(parents=True)
    for part in ("ckpt_00000060.pt", "ckpt_00000060.json"):
        (kept / part).write_bytes((out / "checkpoints" / part).read_bytes())
    (tmp_path / "run" / "metrics.jsonl").write_bytes((out / "metrics.jsonl").read_bytes())
    before = rates(out)

    plan = grow_plan(tmp_path / "run", old, 120)
    assert (plan.mode, plan.step, plan.fields["rewarm_at"], plan.fields["rewarm_steps"]) == (REWARM, 60, 60, 6)
    assert "rises over 6 steps" in plan.words_en and "за 6 шагов" in plan.words_ru
    grown = grow(plan, old, pydoc_data, tmp_path / "grown")
    rise = [grown[s] for s in range(61, 68)]
    assert rise[0] == pytest.approx(before[60])  # the first new step: the rate the run had reached
    assert all(b > a for a, b in zip(rise, rise[1:])) and rise[-1] == old.lr  # then gradually up to the stable rate
    assert max(grown.values()) == pytest.approx(old.lr)  # never above it (the first warmup reaches it too)

    # A later session of the grown run re-warms the same: its checkpoint's config carries the fields.
    [ckpt] = [p for p in checkpoint.list_checkpoints(tmp_path / "grown" / "checkpoints") if p.name.endswith("120.pt")]
    again = preview({}, str(ckpt)).cfg  # as a later session settles it from that checkpoint
    assert [lr_for_config(s, again) for s in range(60, 120)] == [lr_for_config(s, plan.config(old)) for s in range(60, 120)]


def checkpoints_at(folder: Path, cfg: RunConfig, steps: list[int]) -> Path:
    for step in steps:
        checkpoint.save_checkpoint({"step": step, "model": {"w": torch.zeros(2)}, "config": cfg.to_dict()}, folder,
                                   keep=len(steps))
    return folder


def test_a_run_still_in_its_stable_phase_goes_on_from_its_newest_checkpoint(tmp_path):
    cfg = RunConfig(schedule="wsd", steps_until=1000, warmup_steps=100)
    plan = grow_plan(checkpoints_at(tmp_path, cfg, [300, 600]), cfg, 2000)
    assert (plan.mode, plan.step, plan.set_aside) == (FROM_STABLE, 600, ())
    assert lr_for_config(600, plan.config(cfg)) == lr_for_config(599, cfg) == cfg.lr


def test_a_cosine_run_has_no_stable_phase_and_rewarms(tmp_path):
    cfg = RunConfig(schedule="cosine", steps_until=1000, warmup_steps=100)
    plan = grow_plan(checkpoints_at(tmp_path, cfg, [500, 1000]), cfg, 2000)
    grown = plan.config(cfg)
    assert (plan.mode, plan.step) == (REWARM, 1000) and "no stable phase" in plan.words_en
    assert lr_for_config(1000, grown) == pytest.approx(lr_for_config(999, cfg))
    assert lr_for_config(1100, grown) == pytest.approx(lr_for_config(1100, RunConfig.from_dict(
        {**cfg.to_dict(), "steps_until": 2000})))  # after the re-warm, the stretched cosine


def test_an_explicit_decay_start_moves_with_the_end_and_a_rewarm_never_decays_inside_itself(tmp_path):
    branch = RunConfig(schedule="wsd", steps_until=1250, decay_start=1000, warmup_steps=100)
    plan = grow_plan(checkpoints_at(tmp_path / "b", branch, [1000, 1250]), branch, 2500)
    assert (plan.mode, plan.step, plan.fields["decay_start"]) == (FROM_STABLE, 1000, 2250)
    short = RunConfig(schedule="wsd", steps_until=1000, warmup_steps=100)
    plan = grow_plan(checkpoints_at(tmp_path / "s", short, [1000]), short, 1010)  # 10 more steps
    grown = plan.config(short)
    assert plan.mode == REWARM and grown.decay_start == 1000 + grown.rewarm_steps
    assert lr_for_config(1000, grown) == pytest.approx(lr_for_config(999, short))


def test_steps_until_must_be_above_the_runs_step(tmp_path):
    cfg = RunConfig(schedule="wsd", steps_until=1000)
    with pytest.raises(UserError, match="not above the run's step 1,000") as e:
        grow_plan(checkpoints_at(tmp_path, cfg, [1000]), cfg, 1000)
    assert "не больше шага прогона" in e.value.ru
    with pytest.raises(UserError, match="no whole checkpoint"):
        grow_plan(tmp_path / "nothing", cfg, 2000)


def test_more_steps_for_a_finished_run_through_the_lab_grow_it_as_a_child_from_its_stable_phase(pydoc_data, tmp_path,
                                                                                               monkeypatch):
    """The runs panel's "more steps", `lab run --resume RUN --steps-until N`: registered through
    lab.settle, the finished run grows from its last checkpoint before the decay, in a run of its
    own (its parent the finished run), the way said beside the field; its rate never jumps."""
    from lab.api import runs as api_runs
    from lab.runs import load_run
    from lab.settle import register_run
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    first = register_run({**RUN, "data_dir": str(pydoc_data)}, machine="inline")
    assert api_runs.drive(first.id, say=lambda s: None, progress=False).status == "done"
    sized = api_runs.preview({"steps_until": 120}, first.id)
    [said] = [p for p in sized.problems if p.severity == "note"]
    assert said.field == "steps_until" and "step 48" in said.en and "шага 48" in said.ru
    grown = register_run({"steps_until": 120}, first.id)
    assert grown.id != first.id and grown.parent == {"run": first.id, "step": 48, "checkpoint": str(
        first.folder / "checkpoints" / "ckpt_00000048.pt")}
    assert grown.settled.start.step == 48 and grown.cfg.steps_until == 120
    assert api_runs.drive(grown.id, say=lambda s: None, progress=False).status == "done"
    before, after = rates(first.folder), rates(load_run(grown.id).folder)
    assert after[49] == before[48] == grown.cfg.lr and max(after.values()) == pytest.approx(grown.cfg.lr)


def test_lab_train_resumed_past_a_finished_schedule_grows_in_its_own_folder(finished, pydoc_data, tmp_path):
    """`lab train --resume OUT --steps-until N --out OUT`: the same plan; the old decay's
    checkpoints in the folder are set aside (kept), so the loop goes on from the stable phase."""
    import shutil
    from lab.api.train import Here, train_here
    old, out = finished
    folder = tmp_path / "run"
    shutil.copytree(out, folder)
    before = rates(folder)
    train_here({"steps_until": 90}, str(folder), Here(str(folder)))
    assert (folder / "set-aside" / "ckpt_00000060.pt").is_file()
    after = rates(folder)
    assert {s: r for s, r in after.items() if s <= 48} == {s: r for s, r in before.items() if s <= 48}
    assert after[49] == old.lr and max(after.values()) == pytest.approx(old.lr)
