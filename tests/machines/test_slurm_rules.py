"""The rules of the lab's Slurm clusters that need no cluster: a job's time and its margins,
Slurm's words read (times, `scontrol` lines, queue reasons), the job script, how each way a job
ends becomes the link's outcome, and a cluster in the Auto rule with its queue's expected wait."""
from __future__ import annotations

from datetime import timedelta

import pytest

from lab.config import RunConfig, UserError
from lab.machines.auto import Machine, choose
from lab.runs import End
from lab.machines.slurm.cluster import Cluster, checked_shape, job_time, parse_time
from lab.machines.slurm.job import SlurmLink, job_script
from lab.machines.ending import Facts, ended
from lab.machines.handoff import SessionOutputs
from lab.machines.slurm.host import job_facts, said_of
from lab.machines.slurm.query import from_scontrol, reason_words, scontrol_fields, SlurmUnreachable

WHERE = "cluster 'hpc' (login.hpc, partition gpu)"


def test_slurm_times_are_read_as_sbatch_and_scontrol_write_them():
    assert [parse_time(t) for t in ("90", "1:30", "01:00:00", "1-02:03:04", "2-00", "UNLIMITED")] == \
        [5400, 90, 3600, 93784, 172800, 0]
    with pytest.raises(UserError, match="not a time as Slurm writes it"):
        parse_time("an hour")
    assert checked_shape("gpu", None, "gpu:a100:4", 2, "1-00:00:00")["time_min"] == 1440
    for bad in ({"gres": "gpu 2"}, {"time": "0:30"}, {"nodes": 0}, {"partition": "a;b"}):
        with pytest.raises(UserError):
            checked_shape(**{"partition": None, "account": None, "gres": None, "nodes": 1, "time": None, **bad})


def test_the_notebooks_limit_lies_inside_the_jobs_and_slurm_signals_before_its_end():
    day = job_time(1440, 0, 2 * 86400, 630)
    assert (day.minutes, day.limit_min, day.signal_s) == (640, 630.0, 300), "a shorter job than given starts sooner"
    hour = job_time(None, 3600, 86400, 630)  # the partition's default time
    assert (hour.minutes, hour.limit_min, hour.signal_s) == (60, 54.0, 180)
    capped = job_time(600, 0, 7200, 630)  # asked above the partition's maximum
    assert capped.minutes == 120 and capped.limit_min == 110.0
    minute = job_time(1, 0, 3600, 630)
    assert (minute.minutes, minute.limit_min, minute.signal_s) == (1, 0.5, 15)
    assert job_time(None, 0, 0, 60).minutes == 67, "no limit anywhere: the run's own and the margin"


def test_scontrol_lines_are_read_with_values_holding_spaces_and_a_purged_job_is_none():
    line = ("JobId=12 JobName=lab-r-1 JobState=PENDING Reason=Priority Restarts=0 StartTime=2026-12-01T21:34:34 "
            "Command=/w/job.sh an arg WorkDir=/w TRES=cpu=1,node=1")
    fields = scontrol_fields(line)
    assert fields["Command"] == "/w/job.sh an arg" and fields["TRES"] == "cpu=1,node=1"
    state = from_scontrol("12", {"rc": 0, "out": line}, timedelta(hours=2))
    assert state.pending and state.reason == "Priority" and state.start == "2026-12-01T19:34:34+00:00"
    assert from_scontrol("12", {"rc": 1, "err": "slurm_load_jobs error: Invalid job id specified"}, timedelta()) is None
    with pytest.raises(SlurmUnreachable, match="Unable to contact slurm controller"):
        from_scontrol("12", {"rc": 1, "err": "slurm_load_jobs error: Unable to contact slurm controller"}, timedelta())


def test_a_queue_reason_is_said_in_words_and_those_that_never_clear_are_known():
    en, ru, never = reason_words("QOSMaxGRESPerUser")
    assert "cards per user" in en and en.endswith("(QOSMaxGRESPerUser)") and "QOS" in ru and not never
    assert reason_words("ReqNodeNotAvail,_UnavailableNodes:n1")[0].startswith("the nodes it needs are not available")
    assert reason_words("PartitionTimeLimit")[2] and reason_words("InvalidAccount")[2]
    assert reason_words("SomethingNew")[:2] == ("Slurm says SomethingNew", "Slurm говорит SomethingNew")


def test_the_job_script_asks_for_the_shape_the_time_the_signal_and_a_requeue():
    cluster = Cluster("hpc", None, partition="gpu", account="lab", gres="gpu:4", nodes=2, python="~/venv/bin/python")
    rec = SlurmLink(remote="/scratch/lab/runs/r/001", job_name="lab-r-1", minutes=640, signal_s=300)
    script = job_script(cluster, rec, "run r, link 1")
    for line in ("#SBATCH --time=640", "#SBATCH --signal=TERM@300", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=gpu",
                 "#SBATCH --account=lab", "#SBATCH --gres=gpu:4",
                 "#SBATCH --output=/scratch/lab/runs/r/001/session.log"):
        assert line + "\n" in script
    assert script.rstrip().endswith('"$HOME"/venv/bin/python /scratch/lab/runs/r/001/box.py job '
                                    '/scratch/lab/runs/r/001')
    assert "exec srun --ntasks-per-node=1" in script and " --gres=gpu:4 --kill-on-bad-exit=1 " in script


def _ended(state: str | None, *, ckpt_step: int | None = None, result: dict | None = None, cancelled=False,
           preempted=False, error: str | None = None):
    """How the lifecycle decides it (lab.machines.lifecycle.facts_of): Slurm's word, what came back, the
    cluster's additions, one table for every kind."""
    rec = SlurmLink(job="41", minutes=60, state={"state": state} if state else None,
                    preempted="2026-12-01T00:00:00+00:00" if preempted else None,
                    last={"exit": {"ok": error is None, "error": error}})
    out = SessionOutputs(result=result, checkpoint={"name": f"ckpt_{ckpt_step:08d}.pt", "step": ckpt_step,
                                                    "sha256": "x"} if ckpt_step is not None else None)
    said, words = said_of(rec, cancelled)
    extra = job_facts(rec, out, "lab: job 41 (start 0)\nTraceback ...\nRuntimeError: boom\n")
    end = ended(Facts(WHERE, said, out, 100, words, cancel_asked=cancelled, folder="links/002-hpc", **extra))
    return end.status, end.reason, end.outcome


def test_each_way_a_job_ends_is_the_links_outcome():
    status, reason, out = _ended("TIMEOUT", ckpt_step=180)
    assert (status, out.kind) == ("stopped", End.CONTINUE) and "reached its time limit (60 min)" in reason
    status, reason, out = _ended("TIMEOUT")
    assert (status, out.kind) == ("failed", End.LOST) and "only that session is lost" in reason
    assert _ended("NODE_FAIL", ckpt_step=150)[2].kind is End.CONTINUE
    assert _ended(None)[2].kind is End.LOST and "Slurm no longer knows job 41" in _ended(None)[1]
    assert _ended("PREEMPTED")[2].kind is End.LOST and "preempted" in _ended("PREEMPTED")[1]
    status, reason, out = _ended("OUT_OF_MEMORY", error="killed")
    assert out.kind is End.FAILED and "ran out of memory (OUT_OF_MEMORY)" in reason and "RuntimeError: boom" in reason
    status, reason, out = _ended("CANCELLED", ckpt_step=130)
    assert out.kind is End.FAILED and "cancelled outside the lab (scancel by hand, or the cluster's admins)" in reason
    assert "goes on from its checkpoint at step 130" in reason and out.reason_ru
    assert _ended("CANCELLED", cancelled=True)[2].kind is End.CANCELLED
    status, reason, out = _ended("FAILED", error="ModuleNotFoundError: No module named 'torch'")
    assert out.kind is End.FAILED and "the cluster's Python lacks it" in reason and "links/002-hpc/" in reason, \
        "no session there does better until it is installed"
    assert _ended("FAILED", error="RuntimeError: the node's disk went away")[2].kind is End.LOST, \
        "another error of the session's own, without a result, costs only its session"


def test_a_session_that_saved_says_what_stopped_it():
    saved = {"step": 180, "reason": "SIGTERM received", "done": False}
    assert "Slurm (job 41, before its time limit of 60 min, or a preemption) stopped the session" in \
        _ended("COMPLETED", result=saved)[1] and "saved at step 180" in _ended("COMPLETED", result=saved)[1]
    assert "preempted (Slurm requeued it)" in _ended("CANCELLED", result=saved, preempted=True)[1]
    assert "reached its time limit (60 min)" in _ended("TIMEOUT", result=saved)[1]
    status, reason, out = _ended("COMPLETED", result={**saved, "reason": "SIGINT received"}, ckpt_step=180,
                                 cancelled=True)
    assert (status, out.kind) == ("cancelled", End.CANCELLED) and "cancelled with lab cancel after saving at step " \
                                                                  "180" in reason
    done = _ended("COMPLETED", result={"step": 200, "reason": "steps_until reached", "done": True})
    assert (done[0], done[2].kind) == ("done", End.CONTINUE)


def cluster(name: str, wait_h: float | None, gpu="cpu") -> Machine:
    return Machine(name, "slurm", gpu, wait_h=wait_h)


def test_auto_counts_a_clusters_queue_wait_in_its_time_and_says_so():
    kaggle = Machine("alice", "kaggle", "2xT4", 30.0, 30.0)
    box = Machine("gpu1", "ssh", "2xNVIDIA GeForce RTX 4090")
    choice = choose(RunConfig(), 8.0, [kaggle, box, cluster("hpc", 0.5)], finish_h={"alice": 8.0, "gpu1": 6.0,
                                                                                     "hpc": 2.5})
    assert choice.machine == "hpc" and not choice.continues
    assert ("hpc: one of the lab's Slurm clusters, with no quota, so it covers the whole run; Slurm expects its job "
            "to start in about 30 min (counted in its time); by the speed measured on its cards it finishes soonest, "
            "in about 2.5 h (alice 8.0 h; gpu1 6.0 h)") in choice.reason_en
    assert "кластер Slurm лабы" in choice.reason_ru and "примерно через 30 мин" in choice.reason_ru
    assert choose(RunConfig(), 8.0, [box, cluster("hpc", 9.0)], finish_h={"gpu1": 6.0, "hpc": 10.0}).machine == "gpu1"


def test_the_whole_runs_hours_on_a_cluster_include_its_queues_wait(lab_home):
    from lab.machines.needs import finish_hours
    cfg = RunConfig(steps_until=2000)
    hours = finish_hours(cfg, 0, [cluster("now", 0.0), cluster("later", 3.0), cluster("new", 1.0, gpu="unchecked")])
    assert hours["later"] == pytest.approx(hours["now"] + 3.0) and hours["new"] is None
