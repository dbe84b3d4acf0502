"""A sweep through the training notebook (the path `lab sweep --machine local` takes)."""
from __future__ import annotations

import subprocess
import sys

from lab.config import RunConfig


def test_a_diverging_run_in_the_notebook_is_stopped_early_and_marked(recipe_data):
    from lab.kernel.metrics import read_metrics
    from lab.recipes.points import diverged_why, run_point
    from lab.recipes.runners import LocalRunner
    from lab.recipes.sweep import Sweep, plan_configs
    from lab.runs import load_run
    cfg = RunConfig.from_dict(dict(context=32, width=32, heads=2, layers=1, batch_per_card=4, eval_every=10000,
                                   eval_batches=2, lr=30.0, grad_clip=0.0, warmup_steps=2, steps_until=5000,
                                   machine="local", constellations=["pydoc"], limit_min=10))
    tables = []
    # Started by this process for something else (as a notebook's background run is): the stop is not its.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        members = Sweep(plan_configs(cfg), LocalRunner(poll_s=0.5), say=tables.append, poll_s=0).run()
        assert bystander.poll() is None, f"another process of this one was signalled ({bystander.returncode})"
    finally:
        bystander.kill()
        bystander.wait()
    run = load_run(members[0].run_id)
    assert diverged_why(run.folder)
    assert run.status == "stopped" and run.links[0].reason == "SIGTERM received"
    assert read_metrics(run.folder)[-1]["step"] < 5000
    assert run_point(run) == (None, "diverged")
    assert "diverged" in tables[-1]
