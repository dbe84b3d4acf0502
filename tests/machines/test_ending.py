"""How a session ended, decided once for every kind of machine: the same outputs, fed through each
kind's own reading (its Session's facts, lab.machines.lifecycle.facts_of; this computer's
lab.machines.local.facts_here) to the one table (lab.machines.ending), give the same outcome on
this computer, a Kaggle account, a box and a Slurm cluster. A test per ending."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)

from lab.config import RunConfig
from lab.machines import lifecycle
from lab.machines.ending import Said, ended
from lab.machines.handoff import SessionOutputs
from lab.machines.kaggle.data import KaggleSettings
from lab.machines.kaggle.record import KaggleLinkRecord
from lab.machines.kaggle.session import KaggleSession
from lab.machines.lifecycle import Away, LinkCtx
from lab.machines.local import facts_here
from lab.machines.remote.client import Address
from lab.machines.slurm.cluster import Cluster
from lab.machines.slurm.host import SlurmSession
from lab.machines.slurm.job import SlurmLink
from lab.machines.ssh.boxes import Box
from lab.machines.ssh.host import BoxSession
from lab.runs import End, Link, Settled, create_run


def ckpt(step: int) -> dict:
    return {"name": f"ckpt_{step:08d}.pt", "step": step, "sha256": "0" * 64}


# (what came back, how its service said it ended, whether the person cancelled) -> (status, outcome)
ENDINGS = {
    "saved at its limit": (SessionOutputs(result={"step": 30, "reason": "time limit", "done": False},
                                          checkpoint=ckpt(30)), Said.EXITED, False, ("stopped", End.CONTINUE)),
    "done": (SessionOutputs(result={"step": 40, "reason": "steps_until reached", "done": True}, checkpoint=ckpt(40)),
             Said.EXITED, False, ("done", End.CONTINUE)),
    "cut off after a save": (SessionOutputs(checkpoint=ckpt(30)), Said.CUT, False, ("stopped", End.CONTINUE)),
    "lost without a checkpoint": (SessionOutputs(checkpoint=ckpt(10)), Said.GONE, False, ("failed", End.LOST)),
    "inputs not in place": (SessionOutputs(input_not_ready={"expected": {"data": "ab"}}), Said.EXITED, False,
                            ("failed", End.PUSH_AGAIN)),
    "without its cards": (SessionOutputs(no_gpu={"expected": "2xT4", "found": []}), Said.EXITED, False,
                          ("failed", End.UNFIT)),
    "its own failure": (SessionOutputs(result={"step": 10, "reason": "failed: CUDA out of memory", "failed": True},
                                       checkpoint=ckpt(10)), Said.EXITED, False, ("failed", End.FAILED)),
    "cancelled after a save": (SessionOutputs(result={"step": 30, "reason": "SIGINT received", "done": False},
                                              checkpoint=ckpt(30)), Said.EXITED, True, ("cancelled", End.CANCELLED)),
}


@pytest.fixture
def sessions(kaggle_lab, tmp_path):
    """One link starting at step 10 on each kind of machine, in one run; how to make each kind's session."""
    run = create_run(Settled.whole(RunConfig(steps_until=40)))
    made = {}
    box = Box("gpu1", [Address("me@gpu1.lab")])
    cluster = Cluster("hpc", None, partition="gpu")
    for kind, machine, record in (("kaggle", "alice", asdict(KaggleLinkRecord(account="alice", ran=True,
                                                                              kaggle_status="COMPLETE"))),
                                  ("ssh", "gpu1", {}), ("slurm", "hpc", asdict(SlurmLink(job="41", minutes=60)))):
        link = lifecycle.plan(run.id, machine, kind, {"step": 10, "name": "x", "sha256": "y", "path": "z"}, "test",
                              30.0, **record)
        made[kind] = (link.n, machine)

    def session(kind: str, cancelled: bool):
        n, _ = made[kind]
        ctx = LinkCtx(run.id, n, lambda s: None, lambda: cancelled)
        if kind == "kaggle":
            return KaggleSession(ctx, kaggle_lab.client("alice"), KaggleSettings())
        return BoxSession(ctx, box) if kind == "ssh" else SlurmSession(ctx, cluster)
    return run, made, session


@pytest.mark.parametrize("name", list(ENDINGS))
def test_the_same_outputs_end_the_same_on_every_machine(sessions, name):
    run, made, session = sessions
    out, said, cancelled, want = ENDINGS[name]
    got = {}
    for kind, (n, _) in made.items():
        Away.update(run.id, n, output=out.to_dict(), seen={"said": said.value, "words": "it ended"})
        end = ended(lifecycle.facts_of(session(kind, cancelled)))
        got[kind] = (end.status, end.outcome.kind)
    # This computer's papermill says only whether the notebook raised: a session cut or gone raised.
    error = None if said is Said.EXITED else f"the session was {said.value}"
    here = ended(facts_here(Link(1, "local", from_step=10), out, error, cancelled, Path("links/001-local.ipynb")))
    got["local"] = (here.status, here.outcome.kind)
    assert got == {kind: want for kind in [*made, "local"]}, got
