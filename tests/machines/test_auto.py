"""The Auto rule and the picked machine, as pure functions of the machines' states: constructed
quota situations, no Kaggle and no registry."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from lab.config import RunConfig
from lab.machines.auto import FOREIGN, Machine, choose, pick, takes_link, worth_waiting

CFG = RunConfig()
SOON = (datetime.now(timezone.utc) + timedelta(hours=5)).isoformat()
LATER = (datetime.now(timezone.utc) + timedelta(days=3)).isoformat()


def local(**kw) -> Machine:
    return Machine("local", "local", "rtx3050", **kw)


def acct(name: str, left: float | None, *, running=(), error=None, refresh=LATER, total=30.0) -> Machine:
    running = list(running)
    return Machine(name, "kaggle", "2xT4", left, total, refresh, running, free=error is None and len(running) < 2,
                   error=error)


# ---------------------------------------------------------------------------------------------
# The Auto rule


def test_auto_takes_an_account_whose_quota_covers_the_whole_run():
    choice = choose(CFG, 8.0, [local(), acct("alice", 5.0), acct("bob", 12.0)])
    assert choice.machine == "bob" and not choice.continues
    assert "12.0 h of GPU quota cover the whole run (8.0 h)" in choice.reason_en
    assert "12,0 ч квоты GPU хватит на весь прогон (8,0 ч)" in choice.reason_ru


def test_among_covering_accounts_the_one_holding_data_and_checkpoint_wins_over_more_quota():
    machines_ = [acct("alice", 25.0), acct("bob", 9.0), acct("carol", 10.0)]
    holds = {"alice": set(), "bob": {"data", "checkpoint"}, "carol": {"data"}}
    choice = choose(CFG, 8.0, machines_, holds)
    assert choice.machine == "bob"
    assert "already holds the data and the checkpoint" in choice.reason_en
    assert "уже есть данные и чекпоинт" in choice.reason_ru
    # Holding counts only among accounts that cover the run.
    assert choose(CFG, 20.0, machines_, holds).machine == "alice"


def test_a_pick_that_passes_over_an_account_holding_the_data_and_checkpoint_says_why():
    # Issue 25: link 1 went to alice although bob held the data and the checkpoint, and said nothing.
    holds = {"alice": set(), "bob": {"data", "checkpoint"}}
    choice = choose(CFG, 8.0, [acct("alice", 25.0), acct("bob", 5.0)], holds)
    assert choice.machine == "alice"
    assert "bob holds the data and the checkpoint, but its 5.0 h do not cover the run" in choice.reason_en
    assert "у bob есть данные и чекпоинт, но его 5,0 ч не хватит на весь прогон" in choice.reason_ru
    assert "\n" not in choice.reason_en and choice.reason_en.endswith(".")  # one line
    partly = choose(CFG, 2.0, [acct("alice", 25.0), acct("bob", 5.0)], {"bob": {"data"}})
    assert partly.machine == "alice" and "bob holds the data but not all of the link, and alice has more" in \
        partly.reason_en
    assert "bob" not in choose(CFG, 8.0, [acct("alice", 25.0), acct("bob", 5.0)], {}).reason_en


def test_with_equal_holdings_the_most_quota_left_wins():
    assert choose(CFG, 1.0, [acct("alice", 3.0), acct("bob", 4.0)], {"alice": {"data"}, "bob": {"data"}}).machine == "bob"


def test_when_no_quota_covers_the_run_the_most_quota_takes_it_and_says_it_will_be_continued():
    choice = choose(CFG, 40.0, [local(), acct("alice", 12.0), acct("bob", 29.5)], {"alice": {"data"}})
    assert choice.machine == "bob" and choice.continues
    assert "no free account's quota covers the whole run (40.0 h)" in choice.reason_en
    assert "it has the most left (29.5 h)" in choice.reason_en
    assert "continues the run from its checkpoint on another free machine" in choice.reason_en
    assert "продолжит прогон с чекпоинта на другой свободной машине" in choice.reason_ru


def test_the_rule_ranks_covering_then_holding_data_and_checkpoint_then_quota():
    holds = {"alice": {"data", "checkpoint"}, "carol": {"data", "checkpoint"}}
    # Nothing covers 40 h: holding both the data and the checkpoint comes before more quota.
    choice = choose(CFG, 40.0, [acct("alice", 12.0), acct("bob", 29.5), acct("carol", 10.0)], holds)
    assert choice.machine == "alice" and choice.continues
    assert "already holds the data and the checkpoint" in choice.reason_en and "(another account has 29.5 h)" \
        in choice.reason_en
    assert "на нём уже есть данные и чекпоинт" in choice.reason_ru
    # Covering the run comes first of all.
    assert choose(CFG, 20.0, [acct("alice", 12.0), acct("bob", 29.5)], holds).machine == "bob"
    # Holding only one of the two is no tier of its own over more quota.
    assert choose(CFG, 40.0, [acct("alice", 12.0), acct("bob", 29.5)], {"alice": {"data"}}).machine == "bob"
    # An unknown need: the holder too.
    assert choose(CFG, None, [acct("alice", 2.0), acct("bob", 5.0)], {"alice": {"data", "checkpoint"}}).machine \
        == "alice"


def test_an_unknown_need_takes_the_most_quota_and_says_so():
    choice = choose(CFG, None, [acct("alice", 2.0), acct("bob", 1.0)])
    assert choice.machine == "alice" and choice.continues and "need is unknown" in choice.reason_en


def test_busy_broken_and_nearly_empty_accounts_are_not_free():
    machines_ = [acct("busy", 30.0, running=["r1", "r2"]), acct("broken", 30.0, error="Kaggle refused the key"),
                 acct("empty", 0.2), acct("ok", 1.0)]
    assert choose(CFG, 5.0, machines_).machine == "ok"  # 0.2 h cannot hold a start-up and a useful link
    assert [m.name for m in machines_ if takes_link(m)] == ["ok"]
    assert choose(CFG, 5.0, [acct("one", 30.0, running=["r1"])]).machine == "one"  # one session of two


def test_with_nothing_free_it_waits_for_the_earliest_refresh_and_names_each_reason():
    machines_ = [local(), acct("alice", 0.0, refresh=LATER), acct("bob", 0.1, refresh=SOON),
                 acct("carol", 20.0, running=["a", "b"]), acct("dave", None, error="wrong key")]
    choice = choose(CFG, 3.0, machines_)
    assert choice.machine is None and choice.wait_until == SOON
    for part in ("alice: 0.0 h of quota left (0 min); the run's next link needs at least 15 min", "it refreshes at ",
                 "bob: 0.1 h of quota left",
                 "carol: busy with 2 GPU session(s): a (`lab watch a` collects it), b (`lab watch b` collects it)",
                 "dave: wrong key", "waits for the earliest quota refresh"):
        assert part in choice.reason_en
    assert "ближайшего обновления квоты" in choice.reason_ru


def test_an_account_short_of_quota_says_what_the_next_link_lacks():
    choice = choose(CFG, 3.0, [acct("alice", 0.2, refresh=SOON), acct("bob", 12.0, running=["a", "b"])])
    assert choice.machine is None
    assert ("alice: 0.2 h of quota left (12 min); the run's next link needs at least 15 min (10 for its session's "
            "start, 5 of training); it refreshes at ") in choice.reason_en
    assert ("alice: осталось 0,2 ч квоты (12 мин); следующему звену прогона нужно не меньше 15 мин (10 на запуск "
            "сессии, 5 на обучение); обновится ") in choice.reason_ru
    unknown = choose(CFG, 3.0, [acct("carol", 0.0, refresh=None)])
    assert "unknown time" in unknown.reason_en and "в неизвестное время" in unknown.reason_ru


def test_when_every_account_is_broken_there_is_nothing_to_wait_for():
    choice = choose(CFG, 1.0, [acct("alice", None, error="HTTP 401")])
    assert choice.machine is None and choice.wait_until is None and "Fix the accounts" in choice.reason_en


def test_this_computer_is_auto_only_when_the_lab_has_no_kaggle_account():
    assert choose(CFG, 1.0, [local(), acct("alice", 0.0)]).machine is None
    only = choose(CFG, 1.0, [local()])
    assert only.machine == "local" and "no Kaggle account" in only.reason_en and "аккаунтов Kaggle" in only.reason_ru
    assert choose(CFG, 1.0, [local(running=["r9"], free=False)]).machine is None
    assert "only when you pick it" in choose(CFG, 1.0, [local(), acct("alice", 9.0)]).reason_en


# ---------------------------------------------------------------------------------------------
# The machine the person picked


def test_a_picked_account_is_taken_while_it_can_take_a_link_even_when_another_has_more_quota():
    machines_ = [local(), acct("alice", 3.0), acct("bob", 29.0)]
    choice = pick(CFG, 8.0, machines_, {}, "alice", went_on=False)
    assert choice.machine == "alice" and "you picked it; 3.0 h of quota left" in choice.reason_en
    assert "вы его выбрали" in choice.reason_ru


def test_a_picked_account_that_cannot_take_a_link_waits_until_the_run_went_on_then_auto_continues_it():
    machines_ = [local(), acct("alice", 0.1, refresh=SOON), acct("bob", 29.0)]
    first = pick(CFG, 8.0, machines_, {}, "alice", went_on=False)
    assert first.machine is None and first.wait_until == SOON and "alice: 0.1 h of quota left" in first.reason_en
    later = pick(CFG, 8.0, machines_, {}, "alice", went_on=True)
    assert later.machine == "bob" and "cover the whole run" in later.reason_en


def test_this_computer_picked_waits_while_it_is_busy_and_never_gives_way_to_kaggle():
    busy = [local(running=["r7"], free=False), acct("bob", 29.0)]
    for went_on in (False, True):
        choice = pick(CFG, 1.0, busy, {}, "local", went_on=went_on)
        assert choice.machine is None and "This computer runs r7" in choice.reason_en
        assert "Этот компьютер занят прогоном r7" in choice.reason_ru
    free = pick(CFG, 1.0, [local(), acct("bob", 29.0)], {}, "local", went_on=True)
    assert free.machine == "local" and "you picked it" in free.reason_en


def test_waiting_is_worth_it_unless_every_kaggle_account_is_broken():
    broken = [local(), acct("alice", None, error="HTTP 401"), acct("bob", None, error="HTTP 401")]
    assert not worth_waiting(broken, "auto")
    assert worth_waiting(broken, "local"), "this computer, picked, is worth waiting for"
    assert worth_waiting([local(running=["r1"], free=False)], "auto"), "the only machine is busy"
    assert worth_waiting([acct("alice", 0.0), acct("bob", None, error="x")], "auto"), "alice's quota refreshes"


# ---------------------------------------------------------------------------------------------
# The lab's own boxes in the rule


def box(name: str, *, running=(), error=None, gpu="2xNVIDIA GeForce RTX 4090") -> Machine:
    running = list(running)
    return Machine(name, "ssh", gpu, running=running, free=error is None and not running, error=error)


def test_a_free_box_covers_the_whole_run_and_the_soonest_to_finish_by_its_measured_speed_wins():
    machines_ = [local(), acct("alice", 30.0), box("gpu1"), box("slowbox", gpu="rtx3050")]
    choice = choose(CFG, 8.0, machines_, finish_h={"alice": 8.0, "gpu1": 2.5, "slowbox": 11.0})
    assert choice.machine == "gpu1" and not choice.continues
    assert ("gpu1: one of the lab's own machines, with no quota, so it covers the whole run; by the speed measured "
            "on its cards it finishes soonest, in about 2.5 h (alice 8.0 h; slowbox 11.0 h)") in choice.reason_en
    assert "своя машина лабы, без квоты" in choice.reason_ru and "примерно за 2,5 ч" in choice.reason_ru
    # An account whose quota covers the run and that finishes sooner than any box wins, and says so.
    choice = choose(CFG, 8.0, machines_, finish_h={"alice": 8.0, "gpu1": 9.0, "slowbox": 11.0})
    assert choice.machine == "alice"
    assert "finishes soonest, in about 8.0 h (gpu1 9.0 h; slowbox 11.0 h)" in choice.reason_en


def test_a_box_covers_the_run_even_where_no_account_does_and_an_unmeasured_box_says_so():
    choice = choose(CFG, 40.0, [acct("alice", 12.0), box("gpu1")], finish_h={"alice": 40.0})
    assert choice.machine == "gpu1" and not choice.continues
    assert "its speed is not measured yet (`lab machines check gpu1`)" in choice.reason_en


def test_a_busy_box_is_passed_by_with_its_reason_and_the_lab_waits_for_it():
    theirs = box("gpu1", running=[FOREIGN])
    ours = box("gpu2", running=["r7"])
    broken = box("gpu3", error="box-c: cannot reach it")
    choice = choose(CFG, 1.0, [local(), theirs, ours, broken])
    assert choice.machine is None and choice.wait_until is None
    assert "gpu1: busy with work the lab did not start, on its GPUs" in choice.reason_en
    assert "gpu2: busy with r7 (`lab watch r7` collects it)" in choice.reason_en
    assert "gpu3: box-c: cannot reach it" in choice.reason_en and "waits until one is free" in choice.reason_en
    assert worth_waiting([theirs, broken], "auto") and not worth_waiting([broken], "auto")
    assert choose(CFG, 1.0, [local(), box("gpu4")]).machine == "gpu4", "with a box, Auto does not take this computer"
    assert pick(CFG, 1.0, [ours, box("gpu4")], {}, "gpu2", went_on=False).machine is None  # picked: waits for it
    assert pick(CFG, 1.0, [box("gpu4")], {}, "gpu4", went_on=False).reason_en == "gpu4: you picked it."


def test_the_hours_each_machine_needs_come_from_the_calculator_on_its_own_cards(lab_home):
    from lab.machines.needs import finish_hours
    cfg = RunConfig(steps_until=2000)
    machines_ = [local(), acct("alice", 30.0), box("cpubox", gpu="cpu"), box("new", gpu="unchecked")]
    hours = finish_hours(cfg, 500, machines_)
    assert hours["cpubox"] > hours["alice"] > 0, "two CPU cores against two T4s (their start-up included)"
    assert finish_hours(cfg, 1500, machines_)["cpubox"] < hours["cpubox"], "the rest of the run, from its step"
    assert hours["new"] is None and "local" not in hours
    assert finish_hours(cfg, 0, [acct("alice", 30.0)]) == {}, "Kaggle accounts alone: their cards are the same"
