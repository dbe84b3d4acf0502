"""The cluster's half of a Slurm link: the job's task on each node, and what the control side
reads of it. Stdlib only, nothing of the lab imported: it is staged into the link's folder on
the cluster beside `box.py` (lab.machines.ssh.remote, the box's half, whose session runner it
reuses) and runs with the cluster's Python:

    job LINK            the job's task on one node (one per node, under srun): papermill runs
                        the training notebook once per link. Several nodes train one run under
                        torchrun, meeting at the first node of the job (Slurm's SLURM_NNODES,
                        SLURM_NODEID, SLURM_JOB_NODELIST); the first node's rank 0 writes the
                        run's files in LINK, node I keeps its own in LINK/node-I.
    peek LINK OFFSET JOB    one JSON line: the metrics bytes after OFFSET, the log's tail, the
                        session's markers (runner.json, exit.json, requeued.json, stop.json) and
                        `scontrol show job JOB` (run on the login node: one connection per look)

Slurm signals every process of the job (SIGTERM) before its time limit (`--signal`), when it
preempts or requeues it, and at its end: the training loop's saver takes SIGTERM itself and
saves at its next step, so this task ignores it and goes on collecting the notebook. A job
that Slurm starts again after its session began here (requeued) does not start the run twice: it
leaves `requeued.json` and ends, and the lab continues the run in a new job.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RDZV_PORT_BASE, RDZV_PORTS = 15000, 20000  # the group's rendezvous port, from the job's id: every node agrees
MARKERS = ("runner", "exit", "requeued", "stop")


def _box():
    """The box's half, which lies beside this file on the cluster (not in the lab's package there)."""
    sys.path.insert(0, str(HERE))
    import box  # noqa: PLC0415 - present only in the link's folder on the cluster
    return box


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value), encoding="utf-8")
    os.replace(tmp, path)


def first_host(nodelist: str) -> str:
    """The first node of the job, as the other nodes reach it (`scontrol show hostnames`)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0] if out else nodelist.split(",")[0].split("[")[0]


def node_params(here: Path, folder: Path, rank: int, nodes: int, job_id: str) -> dict:
    """The notebook's parameters on this node: the link's, with this node's place in the group."""
    params = json.loads((here / "params.json").read_text(encoding="utf-8"))
    if nodes > 1:
        port = RDZV_PORT_BASE + int(job_id) % RDZV_PORTS if job_id.isdigit() else RDZV_PORT_BASE
        params.update(nnodes=nodes, node_rank=rank,
                      rdzv_endpoint=f"{first_host(os.environ.get('SLURM_JOB_NODELIST', ''))}:{port}")
    if folder != here:
        params["out_dir"] = str(folder / "out")
    return params


def job(link: str) -> None:
    here = Path(link)
    rank = int(os.environ.get("SLURM_NODEID") or 0)
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    job_id, restart = os.environ.get("SLURM_JOB_ID", "?"), os.environ.get("SLURM_RESTART_COUNT", "0")
    folder = here if rank == 0 else here / f"node-{rank}"
    (folder / "out").mkdir(parents=True, exist_ok=True)
    if (folder / "runner.json").is_file():  # this link's session started before: never twice
        _write_json(folder / "requeued.json", {"job": job_id, "restart": restart, "at": _now()})
        print(f"slurm: job {job_id} started again (restart {restart}) after its session had started here: the run "
              "is not started twice; the lab goes on from its checkpoint in a new job", flush=True)
        return
    if folder != here:
        shutil.copyfile(here / "train.ipynb", folder / "train.ipynb")
    params = node_params(here, folder, rank, nodes, job_id)
    (folder / "params.json").write_text(json.dumps(params), encoding="utf-8")
    # Slurm's SIGTERM reaches every process of the job: the training's saver takes it once it trains.
    # Ignored here, and so by the kernel papermill starts (an ignored signal stays ignored across
    # exec), it neither ends this task before the notebook is written nor kills a kernel still
    # starting up, whose limit inside the job's then stops it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _box().run(str(folder))


def peek(link: str, offset: str, job_id: str = "") -> dict:
    """On the login node: the session's new metrics and markers, and what Slurm says of the job
    (`scontrol show job`), in one connection."""
    box, here, pos = _box(), Path(link), int(offset)
    text, new = box._new_metrics(here / "out" / "metrics.jsonl", pos)
    said = None
    if job_id:
        try:
            proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                                  timeout=60)
            said = {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}
        except (OSError, subprocess.SubprocessError) as e:
            said = {"rc": -1, "out": "", "err": f"{type(e).__name__}: {e}"}
    return {"metrics": text, "from": pos, "offset": new, "log": box._tail(here / "session.log", box.LOG_LINES),
            "scontrol": said, **{name: box._read_json(here / f"{name}.json") for name in MARKERS}}


VERBS = {"job": job, "peek": peek}

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in VERBS:
    answer = VERBS[sys.argv[1]](*sys.argv[2:])
    if answer is not None:
        print(json.dumps(answer), flush=True)
