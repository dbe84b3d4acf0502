"""Plans that learn (issue 33, point 3): after a link has measured its machine, the next link's plan,
Auto's reason and the quota it counts use that speed, and a Kaggle session far slower than the
run's others is said in the monitor and `lab runs`, and passed over for the next link."""
from __future__ import annotations

import json

from conftest import lab
from lab.api import runs as api_runs
from lab.config import RunConfig
from lab.machines import driver
from lab.machines.auto import Machine, choose
from lab.machines.needs import finish_hours
from lab.machines.needs import link_speed, measured_on, slow_links
from lab.runs import End, Link, Outcome, Settled, create_run, load_run, updating

CFG = RunConfig(steps_until=5000, batch_per_card=4, context=32)
TOKENS_PER_STEP = 256


def acct(name: str, left: float) -> Machine:
    return Machine(name, "kaggle", "2xT4", left, 30.0, None, [], free=True)


def run_with_links(home, speeds: dict[int, tuple[str, float]], steps: int = 100):
    """A run whose links each trained `steps` steps on an account at a speed, as their metrics say."""
    run = create_run(Settled.whole(CFG))
    rows, links = [], []
    for n, (machine, tok_s) in sorted(speeds.items()):
        start = (n - 1) * steps
        rows += [{"step": s, "tokens": s * TOKENS_PER_STEP, "loss": 5.0, "tok_s": tok_s} for s in range(start + 1,
                                                                                                  start + steps + 1)]
        links.append(Link(n=n, machine=machine, kind="kaggle", status="stopped", from_step=start,
                          to_step=start + steps, outcome=Outcome(End.CONTINUE, "time limit")))
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with updating(run.id) as r:
        r.links, r.status = links, "stopped"
    return load_run(run.id)


def test_a_measured_session_is_the_plan_for_the_next_link_on_that_account(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    run = run_with_links(tmp_path, {1: ("alice", 1_000.0)})
    assert link_speed([json.loads(x) for x in (run.folder / "metrics.jsonl").read_text().splitlines()],
                      run.links[0]) == 1_000.0
    measured = measured_on(run)
    assert measured == {"alice": 1_000.0}
    machines = [acct("alice", 0.5), acct("bob", 0.6)]
    hours = finish_hours(run.cfg, run.step, machines, measured, run)
    # 4,900 steps of 256 tokens at 1,000 tok/s: about 0.35 h, with the session's start (10 min).
    assert abs(hours["alice"] - (4900 * 256 / 1000 + 600) / 3600) < 1e-6 and "bob" not in hours
    # The calculator alone says 0.2 h for the run: both would cover it; alice's own session says 0.52 h.
    choice = choose(run.cfg, 0.2, machines, {}, hours, measured)
    assert choice.machine == "bob", "alice's quota does not hold the rest at the speed it measured"
    rich = [acct("alice", 5.0), acct("bob", 0.6)]
    choice = choose(run.cfg, 0.2, rich, {}, finish_hours(run.cfg, run.step, rich, measured, run), measured)
    assert choice.machine == "alice" and "at the 1,000 tok/s this run's last session there measured" in \
        choice.reason_en and "при 1\u00a0000 ток/с" in choice.reason_ru


def test_a_session_far_slower_than_the_runs_others_is_flagged_and_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    run = run_with_links(tmp_path, {1: ("alice", 12_000.0), 2: ("bob", 15_000.0), 3: ("carol", 700.0)})
    [slow] = slow_links(run)
    assert (slow.link, slow.machine, slow.tok_s) == (3, "carol", 700.0)
    assert "far slower than the run's other sessions" in slow.words() and "намного медленнее" in slow.words(ru=True)
    assert api_runs.status(run.id).slow == [slow]  # the monitor shows it
    assert "warning: link 3 on carol trained at 700 tok/s" in lab("runs").stdout
    said: list[str] = []
    state = driver._Driving(poll_s=30.0, progress=False, nproc=0)
    driver._pass_over_if_slow(run.id, run.links[2], state, said.append)
    assert "carol" in state.excluded and "passes carol over for the next link" in said[0]
    assert not driver._as_left(acct("carol", 20.0), state).free, "Auto takes another account next"
