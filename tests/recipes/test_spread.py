"""`lab sweep --machine auto` with Kaggle accounts: each run gets its own background driver and
Auto places it; the real `kaggle` client talks to the emulator, which executes the notebook."""
from __future__ import annotations

from kaggle_fixtures import kaggle_emulator, kaggle_lab, lab_env, make_kaggle_emulator  # noqa: F401
from lab.config import RunConfig


def test_auto_runs_a_sweeps_runs_side_by_side_on_the_labs_accounts(lab_env):
    from lab.recipes.points import run_point
    from lab.recipes.runners import SpreadRunner
    from lab.recipes.sweep import Sweep, plan_configs
    from lab.runs import load_run
    base = RunConfig(context=32, width=32, heads=2, layers=1, batch_per_card=4, eval_every=1000, eval_batches=2,
                     lr=3e-3, warmup_steps=2, steps_until=20, machine="auto", constellations=["pydoc"],
                     data_dir=str(lab_env.data))
    tables = []
    members = Sweep(plan_configs(base, lrs=[1e-3, 3e-3]), SpreadRunner(), say=tables.append, poll_s=0.2).run()
    runs = [load_run(m.run_id) for m in members]
    assert [r.status for r in runs] == ["done", "done"]
    assert all(link.machine in ("alice", "bob") for r in runs for link in r.links)
    assert all(run_point(r)[0] is not None for r in runs)
    # Both were under way at once: the second started before the first had finished.
    assert runs[1].links[0].started <= runs[0].links[-1].ended
    assert "done" in tables[-1]
