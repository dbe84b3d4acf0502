"""What lab.api hands the two faces (issue 38, point 4): a run's row built once for `lab runs` and
the runs panel, a run's status built by the API with where its session is, a machine's row that
says what the machine is and what can be done to it, the comparison plot, and the command's words.

Each test has its own fresh lab home (tests/ui/test_ui.py's fixture); runs are written by hand.
"""
from __future__ import annotations

import json

import pytest

from conftest import lab_here
from lab import ui
from lab.api import curves
from lab.api import machines as api_machines
from lab.api import runs as api_runs
from lab.config import RunConfig
from lab.machines.auto import Machine
from lab.runs import Link, Settled, create_run, updating
from test_ui import TINY, curve, fake_run, home, text  # noqa: F401 (the fixture)


def test_a_runs_row_is_built_once_and_both_faces_show_it():
    parent = fake_run(RunConfig(**TINY, steps_until=300), step=300, metrics=curve(0, 300, every=50))
    child = fake_run(RunConfig(**TINY, steps_until=600), step=600, metrics=curve(300, 600, every=50),
                     parent={"run": parent.id, "step": 300})
    row = api_runs.row(child.id)
    assert (row.status, row.step, row.config.steps_until, row.machines) == ("done", 600, 600, ["local"])
    assert row.lineage == [parent.id, child.id] and row.parent == parent.id
    assert row.loss == pytest.approx(8.0 / (1 + 600 / 50)) and row.val_loss == pytest.approx(8.2 / (1 + 600 / 50))
    code, out, _ = lab_here("runs")
    line = next(x for x in out.splitlines() if x.startswith(child.id))
    assert code == 0 and f"{row.loss:.3f}" in line and "600/600" in line and f"local <- {parent.id}" in line
    panel = ui.RunsPanel()
    shown = text(panel.table.value)
    assert f"{row.loss:.3f}".replace(".", ",") in shown and f"{parent.id} ← {child.id}" not in shown
    assert [r.id for r in api_runs.rows(newest_first=True)] == list(panel.runs)  # the same rows


def test_a_runs_status_is_built_by_the_api_with_where_its_session_is(monkeypatch):
    run = create_run(Settled.whole(RunConfig(**TINY, steps_until=3000)))
    with updating(run.id) as r:
        r.links = [Link(n=1, machine="alice", kind="kaggle", status="running", from_step=0)]
        r.status = "running"
    monkeypatch.setattr(api_runs, "live_curve", lambda run: None)
    st = api_runs.status(run.id)
    assert isinstance(st, api_runs.RunStatus) and (st.session, st.step, st.steps_until) == (None, 0, 3000)
    live = {"mode": "live", "rows": [{"step": s, "tokens": s * 128, "loss": 5.0, "session": 1} for s in (250, 750)]}
    monkeypatch.setattr(api_runs, "live_curve", lambda run: live)
    st = api_runs.status(run.id)
    assert (st.session, st.session_at, st.step) == ("running", None, 750)  # its log shows it training
    with updating(run.id) as r:
        r.links[0].state, r.links[0].state_at = "collecting", "2026-01-02T03:04:05+00:00"
    st = api_runs.status(run.id)
    assert (st.session, st.session_at) == ("collecting", "2026-01-02T03:04:05+00:00")  # its machine's own record


def test_the_log_tail_leaves_out_the_metrics_echo_papermills_progress_and_the_raw_result(monkeypatch):
    log = ("Executing notebook with kernel: python3\nExecuting Cell 1---------------------------------------\n"
           "step 1 loss 5.1\n@lab-metrics {\"step\": 1}\nEnding Cell 1------------------------------------------\n"
           "saved ckpt_00000001.pt\n{'step': 1, 'done': True, 'reason': 'steps_until reached', 'save_s': 0.007}\n"
           "{'step': 2,\n 'tokens': 256,\n 'checkpoint': '/kaggle/working/checkpoints/ckpt_00000002.pt'}\n")

    class Host:
        def log_tail(self, run, link, lines):
            return log
    monkeypatch.setattr(api_runs, "host_of", lambda link: Host())
    assert api_runs._log_tail(None, Link(1, "local")) == "step 1 loss 5.1\nsaved ckpt_00000001.pt"


def test_a_machines_row_says_what_it_is_and_what_can_be_done_to_it():
    rows = api_machines.rows([Machine("local", "local", "cpu"), Machine("alice", "kaggle", "2xT4", has_ever_run=True),
                              Machine("rack", "ssh", "2xRTX 3090"), Machine("pair", "ssh", "", hosts=2),
                              Machine("hpc", "slurm", "")])
    said = {r.name: (r.title, r.quota, r.answers, r.actions, r.account) for r in rows}
    assert said["local"][0][0].startswith("This computer · ") and said["local"][1:] == (False, False, (), False)
    assert said["alice"] == (("alice · Kaggle 2xT4", "alice · Kaggle 2xT4"), True, False, ("probe", "remove"), True)
    assert said["rack"] == (("rack · a box over SSH · 2xRTX 3090", "rack · машина по SSH · 2xRTX 3090"), False, True,
                            ("check",), False)
    assert said["pair"][0] == ("pair · a group of 2 boxes over SSH", "pair · группа из 2 машин по SSH")
    assert said["hpc"][0] == ("hpc · a Slurm cluster", "hpc · кластер Slurm")


def test_a_comparison_plot_fits_its_y_axis_to_the_curves_where_they_are_compared():
    runs = {name: [{"step": s, "tokens": s, "loss": 7.0 if s < 20 else end + 1.0 / s} for s in range(1, 1001)]
            for name, end in (("a", 0.40), ("b", 0.42), ("c", 0.44))}
    low, high = curves.compared_span(runs)
    assert 0.35 < low < 0.40 and 0.44 < high < 0.5  # not 0–7: the first steps' 7 lies above it
    assert curves.png(runs)[:4] == b"\x89PNG" and curves.compared_span({"a": []}) is None


def test_lab_sample_of_a_missing_checkpoint_file_says_the_file_is_missing():
    code, _, err = lab_here("sample", "nope.pt")
    assert code == 2 and "nope.pt: no such file" in err and "no run" not in err


def test_lab_runs_says_the_lab_home_it_lists(home):
    fake_run(RunConfig(**TINY, steps_until=30), step=30)
    code, out, _ = lab_here("runs")
    assert code == 0 and out.splitlines()[-1] == f"lab home: {home.resolve()} ($LAB_HOME)"
    assert json.loads(lab_here("runs", "--json")[1].splitlines()[0])["status"] == "done"  # JSON stays JSON
