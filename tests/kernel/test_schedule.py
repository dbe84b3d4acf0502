import pytest

from lab.kernel.schedule import lr_at, warmup_for

KW = dict(lr=1e-3, warmup_steps=100, decay_frac=0.2, min_lr_frac=0.1)


@pytest.mark.parametrize("schedule", ["wsd", "cosine", "linear", "inv_sqrt"])
def test_every_schedule_warms_up_then_decays_to_the_floor_at_steps_until(schedule):
    rates = [lr_at(s, schedule=schedule, steps_until=2000, **KW) for s in range(2001)]
    assert rates[0] == pytest.approx(1e-5)
    assert rates[99] == pytest.approx(1e-3)
    assert rates[1999] == pytest.approx(1e-4, rel=0.05)
    assert rates[2000] == pytest.approx(1e-4)
    after_warmup = rates[100:]
    assert all(b <= a + 1e-15 for a, b in zip(after_warmup, after_warmup[1:])), "rate never rises after warmup"


# Rates at known steps of a 1000-step run (warmup 100, floor 1e-4, WSD decays over the last 200):
# the four shapes, written out by hand from their formulas.
@pytest.mark.parametrize("schedule,at", [
    ("cosine", {100: 1e-3, 550: 5.5e-4, 1000: 1e-4}),
    ("linear", {100: 1e-3, 550: 5.5e-4, 1000: 1e-4}),
    ("wsd", {100: 1e-3, 550: 1e-3, 799: 1e-3, 900: 5.5e-4, 1000: 1e-4}),
    ("inv_sqrt", {100: 1e-3, 400: 5e-4, 800: 1e-3 / 8 ** 0.5, 1000: 1e-4}),
])
def test_each_schedule_has_its_shape_at_known_steps(schedule, at):
    for step, rate in at.items():
        assert lr_at(step, schedule=schedule, steps_until=1000, **KW) == pytest.approx(rate), step
    assert lr_at(49, schedule=schedule, steps_until=1000, **KW) == pytest.approx(5e-4), "half way up the warmup"
    assert lr_at(5000, schedule=schedule, steps_until=1000, **KW) == pytest.approx(1e-4), "min_lr past the end"


def test_wsd_is_constant_then_decays_over_the_last_fraction():
    assert lr_at(1599, schedule="wsd", steps_until=2000, **KW) == 1e-3
    assert lr_at(1700, schedule="wsd", steps_until=2000, **KW) < 1e-3


def test_wsd_follows_a_raised_steps_until_without_a_jump_in_the_constant_phase():
    # A run planned for 2000 steps is at step 1000 (constant phase) and is continued to 5000.
    before = lr_at(999, schedule="wsd", steps_until=2000, **KW)
    after = lr_at(1000, schedule="wsd", steps_until=5000, **KW)
    assert before == after == 1e-3
    assert lr_at(3999, schedule="wsd", steps_until=5000, **KW) == 1e-3


def test_inv_sqrt_falls_as_one_over_root_t():
    r400 = lr_at(400, schedule="inv_sqrt", steps_until=100000, **KW)
    r1600 = lr_at(1600, schedule="inv_sqrt", steps_until=100000, **KW)
    assert r400 / r1600 == pytest.approx(2.0)


def test_short_runs_get_a_short_warmup():
    assert warmup_for(20, 200) == 2
