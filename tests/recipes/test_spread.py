"""`lab sweep --machine auto` with Kaggle accounts: each run gets its own background driver and
Auto places it; the real `kaggle` client talks to the emulator, which executes the notebook."""
from __future__ import annotations

import pytest

from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401
from lab.config import RunConfig


@pytest.fixture
def kaggle_env(pydoc_data, kaggle_lab, monkeypatch):
    """As tests/machines/test_kaggle_runs.py sets it up: the emulator scales its own time; the
    background drivers poll every 0.2 s through the person's own setting."""
    from lab.machines import control
    monkeypatch.setenv("LAB_KAGGLE_POLL_S", "0.2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    kaggle_lab.data = pydoc_data
    yield kaggle_lab
    for proc in control.spawned.values():  # a failed test leaves no background driver behind
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    control.spawned.clear()


def test_auto_runs_a_sweeps_runs_side_by_side_on_the_labs_accounts(kaggle_env):
    from lab.recipes.points import run_point
    from lab.recipes.runners import SpreadRunner
    from lab.recipes.sweep import Sweep, plan_configs
    from lab.runs import load_run
    base = RunConfig(context=32, width=32, heads=2, layers=1, batch_per_card=4, eval_every=1000, eval_batches=2,
                     lr=3e-3, warmup_steps=2, steps_until=20, machine="auto", constellations=["pydoc"],
                     data_dir=str(kaggle_env.data))
    tables = []
    members = Sweep(plan_configs(base, lrs=[1e-3, 3e-3]), SpreadRunner(), say=tables.append, poll_s=0.2).run()
    runs = [load_run(m.run_id) for m in members]
    assert [r.status for r in runs] == ["done", "done"]
    assert all(link.machine in ("alice", "bob") for r in runs for link in r.links)
    assert all(run_point(r)[0] is not None for r in runs)
    # Both were under way at once: the second started before the first had finished.
    assert runs[1].links[0].started <= runs[0].links[-1].ended
    assert "done" in tables[-1]
