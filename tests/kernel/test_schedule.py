import pytest

from lab.config import RunConfig
from lab.kernel.schedule import decay_start_for_config, lr_at, lr_for_config, warmup_for

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


def test_a_rewarm_rises_in_a_straight_line_from_the_rate_reached_to_the_schedules():
    # A WSD run that ended at 1000 (rate 1e-4) grown to 2000, re-warmed over 50 steps from step 1000.
    grown = RunConfig(schedule="wsd", steps_until=2000, **KW, rewarm_at=1000, rewarm_steps=50, rewarm_from_frac=0.1)
    rates = [lr_for_config(s, grown) for s in range(2001)]
    plain = [lr_at(s, schedule="wsd", steps_until=2000, **KW) for s in range(2001)]
    assert rates[:1000] == plain[:1000] and rates[1050:] == plain[1050:]
    assert rates[1000] == pytest.approx(1e-4)  # the rate the run had reached, once more
    assert rates[1025] == pytest.approx(5.5e-4)
    rise = rates[1000:1051]
    assert all(b > a for a, b in zip(rise, rise[1:])) and rise[-1] == 1e-3


def test_the_decay_start_is_where_a_stable_phase_ends():
    def start(schedule: str, decay_start: int = 0) -> int | None:
        return decay_start_for_config(RunConfig(schedule=schedule, steps_until=1000, decay_start=decay_start))
    assert start("wsd") == 800 and start("inv_sqrt", 500) == 500
    assert start("cosine") is None and start("linear") is None
