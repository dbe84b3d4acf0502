"""One link on a cluster up to its job: the data and the link's folder on the cluster's shared
file system, the notebook's parameters, and the job submitted.

1. stage: the run's prepared data folder in `WORKDIR/data/<name>-<sha256 of its manifest>/`,
   copied once per cluster (every node reads the shared file system) and sealed only when every
   file arrived whole, as a box's (the box's half, lab.machines.ssh.remote, does it on the login
   node); then the link's folder `WORKDIR/runs/<run>/<link>/`: the training notebook, its
   parameters, the cluster's half (node.py, box.py), the job script, and the checkpoint to go on
   from with its sidecar and the curve up to it (sha256 checked on both sides).
2. submit: sbatch, once. The job's name is the run's and the link's, so a submission whose
   answer the control side did not live to record is found in the queue, not sent twice.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from lab.config import RunConfig, UserError
from lab.corpus.manifests import data_id_of
from lab.machines.handoff import stage_checkpoint
from lab.machines.slurm import node
from lab.machines.slurm.cluster import Cluster
from lab.machines.slurm.job import SlurmLink, find_submitted, job_script, note, record, submit
from lab.machines.slurm.login import REMOTE, Login
from lab.machines.ssh.boxes import ROOM_GB, note_data
from lab.machines.ssh.link import data_key

NODE = Path(node.__file__).read_text(encoding="utf-8")


@dataclass
class SlurmCtx:
    """What the phases of one link need: the cluster, how to reach it, how to tell the person."""
    run_id: str
    n: int
    cluster: Cluster
    login: Login
    say: Callable[[str], None]
    cancelled: Callable[[], bool]
    poll_s: float
    progress: bool = True

    @property
    def folder(self) -> Path:
        run, _, rec = record(self.run_id, self.n)
        return run.folder / rec.folder


def login_of(cluster: Cluster) -> Login:
    return Login(cluster.login, cluster.python)


def link_params(cfg: RunConfig, source: dict | None, remote: str, data: str, limit_min: float) -> dict:
    """The notebook's parameters for the link's job: its paths on the cluster, its limit inside the
    job's, and the sha256 of what it must find (each node adds its place in the group itself,
    lab.machines.slurm.node)."""
    from lab.notebooks import parameterized  # nbformat, imported only for a link
    resume = f"{remote}/resume/{source['name']}" if source else ""
    link_cfg = replace(cfg, data_dir=data, resume_from=resume, limit_min=limit_min)  # where, on the cluster
    return parameterized(link_cfg, out_dir=f"{remote}/out", nproc=0, plot_every_s=30,
                         expect_data_sha256=data_key(Path(cfg.data_dir))[1],
                         expect_ckpt_sha256=source["sha256"] if source else "")


def stage(ctx: SlurmCtx, limit_min: float) -> SlurmLink:
    """The data and the link's folder on the cluster; returns the link's record."""
    run, _, rec = record(ctx.run_id, ctx.n)
    if rec.phase != "planned":
        return rec
    cluster, data_dir = ctx.cluster, Path(run.cfg.data_dir)
    key, _ = data_key(data_dir)
    st = ctx.login.helper("stage", cluster.workdir, key, f"runs/{ctx.run_id}/{ctx.n:03d}")
    rec.remote, rec.data, rec.rsync = st["link"], st["data"], bool(st["rsync"])
    rec.job_name = f"lab-{ctx.run_id}-{ctx.n}"
    up = _up_folder(ctx, run, rec, limit_min)
    try:
        _room(ctx, st, data_dir, up)
        if not st["whole"]:
            _copy_data(ctx, st, key, data_dir)
        note_data(cluster.name, 0, data_id_of(data_dir))
        ctx.login.copy_up(up, st["link"], rec.rsync, {})
    finally:
        shutil.rmtree(up, ignore_errors=True)
    return note(ctx.run_id, ctx.n, phase="staged", remote=rec.remote, data=rec.data, rsync=rec.rsync,
                job_name=rec.job_name)


def _up_folder(ctx: SlurmCtx, run, rec: SlurmLink, limit_min: float) -> Path:
    """What goes into the link's folder on the cluster, gathered here first."""
    from lab.notebooks import TRAIN_NOTEBOOK  # nbformat, imported only for a link
    up = ctx.folder / ".up"
    shutil.rmtree(up, ignore_errors=True)
    up.mkdir(parents=True)
    shutil.copyfile(TRAIN_NOTEBOOK, up / "train.ipynb")
    (up / "box.py").write_text(REMOTE, encoding="utf-8")
    (up / "node.py").write_text(NODE, encoding="utf-8")
    if rec.source:  # the checkpoint, its sidecar and the curve up to it; sha256 checked as staged
        stage_checkpoint(rec.source, run.folder, up / "resume")
    params = link_params(run.cfg, rec.source, rec.remote, rec.data, limit_min)
    (up / "params.json").write_text(json.dumps(params), encoding="utf-8")
    (up / "job.sh").write_text(job_script(ctx.cluster, rec, f"run {ctx.run_id}, link {ctx.n}"), encoding="utf-8")
    return up


def _sizes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def _room(ctx: SlurmCtx, st: dict, data_dir: Path, up: Path) -> None:
    missing = 0 if st["whole"] else sum(s for rel, s in _sizes(data_dir).items() if st["there"].get(rel) != s)
    need_gb = (missing + sum(_sizes(up).values())) / 1e9 + ROOM_GB
    if st["free_gb"] < need_gb:
        raise UserError(f"{ctx.cluster.where}: {st['free_gb'] * 1000:.1f} MB free in {st['workdir']}, and this link "
                        f"needs {need_gb * 1000:.1f} MB there (the data, the notebook and the checkpoint, and "
                        f"{ROOM_GB * 1000:.0f} MB for the job's own): free some space there, or give the cluster "
                        "another --workdir. Nothing was copied; the run keeps its checkpoint.")


def _copy_data(ctx: SlurmCtx, st: dict, key: str, data_dir: Path) -> None:
    """The data folder, once per cluster: sealed only when every file arrived whole."""
    sizes = _sizes(data_dir)
    ctx.say(f"link {ctx.n}: copying the data ({sum(sizes.values()) / 1e6:.1f} MB) to {ctx.cluster.where}")
    ctx.login.copy_up(data_dir, st["partial"], bool(st["rsync"]), st["there"])
    sealed = ctx.login.helper("seal", ctx.cluster.workdir, key, json.dumps(sizes))
    if not sealed["whole"]:
        raise UserError(f"{ctx.cluster.where}: the data did not arrive whole ({', '.join(sealed['wrong'])}); "
                        "`lab watch RUN` copies it again")


def submit_job(ctx: SlurmCtx) -> SlurmLink:
    """sbatch, once: a submission the control side did not live to record is found by its name."""
    _, _, rec = record(ctx.run_id, ctx.n)
    job = find_submitted(ctx.login, rec.job_name) if rec.phase == "submitting" else None
    if job is None:
        note(ctx.run_id, ctx.n, phase="submitting")
        job = submit(ctx.login, f"{rec.remote}/job.sh", ctx.cluster.where)
    rec = note(ctx.run_id, ctx.n, status="running", phase="submitted", job=job)
    ctx.say(f"link {ctx.n}: job {job} sent to {ctx.cluster.where}: {rec.minutes} min, Slurm's signal "
            f"{rec.signal_s} s before its end")
    return rec
