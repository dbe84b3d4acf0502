"""The schedule's `decay_start`, branch fields, and the divergence watch."""
from __future__ import annotations

import math

import pytest

from lab.config import RunConfig, UserError
from lab.kernel.schedule import lr_at, lr_for_config
from lab.recipes.branch import branch_config
from lab.recipes.points import DivergenceWatch, ends_small

KW = dict(lr=1e-3, warmup_steps=100, decay_frac=0.2, min_lr_frac=0.1)


def test_a_branch_holds_the_parents_rate_up_to_its_start_then_decays_to_the_floor():
    parent = [lr_at(s, schedule="wsd", steps_until=10000, **KW) for s in range(5000)]
    branch = [lr_at(s, schedule="wsd", steps_until=6250, decay_start=5000, **KW) for s in range(6251)]
    assert branch[:5000] == parent
    assert branch[5000] == pytest.approx(1e-3)
    assert all(b < a for a, b in zip(branch[5000:6249], branch[5001:6250]))
    assert branch[6249] == pytest.approx(1e-4, rel=0.01)


def test_stages_of_one_long_run_follow_the_same_rate_as_the_whole_plan():
    plain = [lr_at(s, schedule="wsd", steps_until=1000, **KW) for s in range(1000)]
    whole = [lr_at(s, schedule="wsd", steps_until=1000, decay_start=800, **KW) for s in range(1000)]
    stage = [lr_at(s, schedule="wsd", steps_until=250, decay_start=800, **KW) for s in range(250)]
    assert stage == whole[:250] and whole == plain
    assert max(stage[100:]) == min(stage[100:]) == 1e-3  # a stage ends in the constant phase


def test_branch_fields_end_at_at_over_one_minus_f_and_the_branch_ends_small():
    parent = RunConfig(schedule="wsd", steps_until=10000, decay_frac=0.2)
    cfg = branch_config(parent, 4000, 0.2)
    assert (cfg.steps_until, cfg.decay_start) == (5000, 4000)
    assert lr_for_config(3999, cfg) == parent.lr
    assert ends_small(cfg)
    staged = RunConfig(schedule="wsd", steps_until=4000, decay_start=8000)
    assert not ends_small(staged)


def test_a_branch_needs_a_constant_phase():
    with pytest.raises(UserError, match="constant phase"):
        branch_config(RunConfig(schedule="cosine", steps_until=1000), 500)
    with pytest.raises(UserError, match="warmup"):
        branch_config(RunConfig(schedule="wsd", steps_until=1000, warmup_steps=100), 50)
    with pytest.raises(UserError, match="not before the run's own decay"):
        branch_config(RunConfig(schedule="wsd", steps_until=1000, decay_frac=0.2), 900)


def test_a_branch_from_where_the_parents_decay_began_is_refused_it_would_only_repeat_the_parent():
    parent = RunConfig(schedule="wsd", steps_until=3000, decay_frac=0.2)  # its decay begins at 2,400
    with pytest.raises(UserError, match="would only repeat the run") as refused:
        branch_config(parent, 2400)
    assert "лишь повторит прогон" in refused.value.ru and "2\u00a0400" in refused.value.ru
    cfg = branch_config(parent, 2399)  # one step earlier: a decay of its own
    assert cfg.decay_start == 2399 and cfg.steps_until == 2999
    assert [lr_for_config(s, cfg) for s in (2500, 2900)] != [lr_for_config(s, parent) for s in (2500, 2900)]


def test_the_divergence_watch_flags_nan_and_a_loss_far_above_its_start_not_a_falling_curve():
    falling = DivergenceWatch()
    assert all(falling.see({"step": s, "loss": 6.2 - 0.01 * s}) is None for s in range(1, 200))
    nan = DivergenceWatch()
    assert nan.see({"step": 1, "loss": math.nan}) is not None
    up = DivergenceWatch()
    reasons = [up.see({"step": s, "loss": 6.2 if s < 4 else 6.2 * 3}) for s in range(1, 12)]
    assert any(r and "far above" in r for r in reasons)
