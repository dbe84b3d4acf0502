"""The kit's half on the lab's own machines (a box, a Slurm cluster), run there with their own Python.

Stdlib only, nothing of the lab imported: the control side sends this file's text on the ssh connection's
stdin (`PYTHON - VERB ARGS`) and reads one JSON answer; a link's copy of it there runs the session (`run`
on a box, detached: a session of its own, so a closed connection does not end it; `job` in a Slurm job):

    hello WORKDIR              the workdir (made): the Python there answers
    state WORKDIR              the runs of ours alive there, and whether the GPUs run anyone's work
    stage WORKDIR KEY LINK     the link's folder made; whether the data KEY is there whole, or what of it is
    seal WORKDIR KEY SIZES     a copied data folder checked against the sizes sent, then put in place
    launch LINK PARAMS         the session started detached (once: a second call finds the first)
    peek LINK OFFSET [JOB]     the metrics after OFFSET, the log's tail, the phase and markers (and scontrol's)
    stop / kill LINK REASON    asks the session to save and stop / ends it now, and every process it started
    outputs LINK               the session's output files with their sizes
    port                       a TCP port free now (torchrun's rendezvous on a group's first host)
    run LINK / job LINK        the session itself (papermill), or a Slurm job's task on one node
"""
from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

LOG_LINES = 25
CHUNK = 256 * 1024  # metrics bytes per look at most: a long run's history comes in pieces
MARKERS = ("runner", "exit", "requeued", "stop")  # what a session leaves beside its outputs
RDZV_PORT_BASE, RDZV_PORTS = 15000, 20000  # a Slurm group's rendezvous port, from the job's id: every node agrees


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value), encoding="utf-8")
    os.replace(tmp, path)  # whole or absent: a reader never sees half of it


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _workdir(raw: str) -> Path:
    path = Path(raw).expanduser()
    return (path if path.is_absolute() else Path.home() / path).resolve()


def hello(workdir: str) -> dict:
    w = _workdir(workdir)
    w.mkdir(parents=True, exist_ok=True)
    return {"workdir": str(w)}


def _alive(link: Path) -> bool:
    runner = _read_json(link / "runner.json")
    if not runner:
        return False
    try:
        cmdline = Path(f"/proc/{int(runner['pid'])}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(int(runner["pid"]), 0)  # no /proc: the pid alone
            return True
        except OSError:
            return False
    return str(link).encode() in cmdline


def state(workdir: str) -> dict:
    runs = _workdir(workdir) / "runs"
    return {"ours": sorted({link.parent.name for link in runs.glob("*/*") if _alive(link)}),
            "gpu_apps": smi("--query-compute-apps=pid,process_name")}


def _run(argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    """`argv`'s answer; where it gave none (not installed, no answer in time): exit -1, and why as its stderr."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as e:
        return subprocess.CompletedProcess(argv, -1, "", f"{type(e).__name__}: {e}")


def smi(query: str, timeout_s: float = 20) -> list[str]:
    """nvidia-smi's lines for `query` (none without it); lab.machines.local asks it too."""
    out = _run(["nvidia-smi", query, "--format=csv,noheader"], timeout_s).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _sizes(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def stage(workdir: str, key: str, link: str) -> dict:
    w = _workdir(workdir)
    data, partial = w / "data" / key, w / "data" / f"{key}.partial"
    here = w / link
    (here / "out").mkdir(parents=True, exist_ok=True)
    whole = (data / ".complete").is_file()
    if not whole:
        partial.mkdir(parents=True, exist_ok=True)
    return {"workdir": str(w), "data": str(data), "partial": str(partial), "whole": whole,
            "there": {} if whole else _sizes(partial), "link": str(here), "rsync": bool(shutil.which("rsync")),
            "free_gb": round(shutil.disk_usage(w).free / 1e9, 3)}


def seal(workdir: str, key: str, sizes: str) -> dict:
    w = _workdir(workdir)
    data, partial = w / "data" / key, w / "data" / f"{key}.partial"
    if (data / ".complete").is_file():
        return {"whole": True}
    wanted, found = json.loads(sizes), _sizes(partial)
    wrong = sorted(rel for rel, size in wanted.items() if found.get(rel) != size)
    if wrong:
        return {"whole": False, "wrong": wrong[:10]}
    (partial / ".complete").write_text(_now(), encoding="utf-8")
    shutil.rmtree(data, ignore_errors=True)  # a folder left by a seal that died halfway
    os.replace(partial, data)
    return {"whole": True}


def launch(link: str, params: str) -> dict:
    """Starts the session once: `launched.json` is written before, `runner.json` by the runner first thing."""
    here = Path(link)
    if _read_json(here / "launched.json") is not None and not (here / "exit.json").is_file():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (here / "runner.json").is_file():
            time.sleep(0.5)  # the runner is starting
    if (here / "runner.json").is_file() or (here / "exit.json").is_file():
        return {"started": False, **(_read_json(here / "runner.json") or {})}
    (here / "params.json").write_text(base64.b64decode(params).decode("utf-8"), encoding="utf-8")
    _write_json(here / "launched.json", {"at": _now()})
    proc = subprocess.Popen([sys.executable, str(here / "box.py"), "run", str(here)], stdin=subprocess.DEVNULL,
                            stdout=open(here / "session.log", "ab"), stderr=subprocess.STDOUT, cwd=str(here),
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return {"started": True, "pid": proc.pid}


def _read(path: Path, start: int, size: int) -> bytes:
    """`size` bytes of `path` from byte `start` (from its end where negative); none where it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(start if start >= 0 else max(0, f.seek(0, os.SEEK_END) + start))
            return f.read(size)
    except OSError:
        return b""


def peek(link: str, offset: str, job_id: str = "") -> dict:
    here, pos = Path(link), int(offset)
    block = _read(here / "out" / "metrics.jsonl", pos, CHUNK)
    whole = block[:block.rfind(b"\n") + 1]  # whole lines only
    log = _read(here / "session.log", -32 * 1024, 32 * 1024).decode("utf-8", "replace").splitlines()[-LOG_LINES:]
    answer = {"metrics": whole.decode("utf-8", "replace"), "from": pos, "offset": pos + len(whole),
              "phase": _phase(here, _read_json(here / "exit.json"), _alive(here)),
              "log": "\n".join(line.rsplit("\r", 1)[-1] for line in log),
              "markers": {m: _read_json(here / f"{m}.json") for m in MARKERS}}
    if job_id:
        proc = _run(["scontrol", "show", "job", "-o", job_id])
        answer["scontrol"] = {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}
    return answer


def _phase(here: Path, ended: dict | None, alive: bool) -> str:
    """running (or starting), ended (exit.json written), died (the runner gone without a word), or never."""
    if ended is not None:
        return "ended"
    if alive:
        return "running"
    if (here / "runner.json").is_file():
        return "died"
    launched = here / "launched.json"
    if launched.is_file() and time.time() - launched.stat().st_mtime < 120:
        return "running"  # the runner is starting
    return "never"


def stop(link: str, reason: str) -> dict:
    here = Path(link)
    _write_json(here / "stop.json", {"reason": reason, "at": _now()})
    return {"alive": _alive(here)}


def kill(link: str, reason: str) -> dict:
    """Ends the session now: its runner and every process under it killed; its exit says why."""
    here = Path(link)
    pids = [int(_read_json(here / "runner.json")["pid"])] if _alive(here) else []
    for pid in pids:  # grows as it goes: every descendant
        pids += [child for child in _children(pid) if child not in pids]
    for pid in reversed(pids):
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not (here / "exit.json").is_file():
        _write_json(here / "exit.json", {"ok": False, "error": f"killed: {reason}", "ended": _now()})
    return {"killed": len(pids)}


def outputs(link: str) -> dict:
    """The files with their sizes; the checkpoint the result names (else the newest: lab.machines.handoff.wanted)."""
    here = Path(link)
    own = {name: (here / name).stat().st_size for name in ("executed.ipynb", "session.log", "exit.json")
           if (here / name).is_file()}
    named = Path(str((_read_json(here / "out" / "result.json") or {}).get("checkpoint") or "")).name
    return {"out": _sizes(here / "out"), "link": own, "checkpoint": named}


def port() -> dict:
    """A port below the ephemeral range that binds now: a port the system handed out (bind to 0)
    lies in the range it also gives every outgoing connection, and one of those took it before
    torchrun listened on it (EADDRINUSE, seen under the tests' parallel sessions)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default start
    for _ in range(64):
        candidate = random.randrange(20000, max(low, 20001))
        with socket.socket() as s:
            try:
                s.bind(("", candidate))
            except OSError:
                continue
            return {"port": candidate}
    with socket.socket() as s:  # every one tried was taken: what the system gives
        s.bind(("", 0))
        return {"port": s.getsockname()[1]}


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _stop_when_asked(here: Path, done: threading.Event) -> None:
    while not done.wait(1.0):
        request = _read_json(here / "stop.json")
        if request is not None:
            print(f"box: stop requested ({request.get('reason')}): the run saves a checkpoint and stops", flush=True)
            for pid in _children(os.getpid()):
                with suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            return


def run(link: str) -> None:
    here = Path(link)
    _write_json(here / "runner.json", {"pid": os.getpid(), "started": _now(), "host": socket.gethostname()})
    done = threading.Event()
    threading.Thread(target=_stop_when_asked, args=(here, done), daemon=True).start()
    error = None
    try:
        import papermill as pm  # the box's own papermill, where a session runs: this file runs there
        params = json.loads((here / "params.json").read_text(encoding="utf-8"))
        pm.execute_notebook(str(here / "train.ipynb"), str(here / "executed.ipynb"), parameters=params,
                            cwd=str(here / "out"), kernel_name="python3", progress_bar=False,
                            stdout_file=sys.stdout, stderr_file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - whatever ended it is the session's account
        error = f"{type(e).__name__}: {getattr(e, 'evalue', None) or e}"
    finally:
        done.set()
    _write_json(here / "exit.json", {"ok": error is None, "error": error, "ended": _now()})
    print(f"box: the session ended {'cleanly' if error is None else 'with ' + error}", flush=True)


def first_host(nodelist: str) -> str:
    out = _run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
    return out[0] if out else nodelist.split(",")[0].split("[")[0]


def job(link: str) -> None:
    """One node's task. Slurm signals every process of the job (SIGTERM) before its time limit and when it
    preempts it: the loop's saver takes it itself, so this task ignores it and goes on collecting the
    notebook. Node I of a group keeps its files in LINK/node-I; the first node's rank 0 writes the run's."""
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
    params = json.loads((here / "params.json").read_text(encoding="utf-8"))
    if nodes > 1:
        port = RDZV_PORT_BASE + int(job_id) % RDZV_PORTS if job_id.isdigit() else RDZV_PORT_BASE
        params["session"].update(nnodes=nodes, node_rank=rank,
                                 rdzv_endpoint=f"{first_host(os.environ.get('SLURM_JOB_NODELIST', ''))}:{port}")
    if folder != here:
        shutil.copyfile(here / "train.ipynb", folder / "train.ipynb")
        params["session"]["out_dir"] = str(folder / "out")
    (folder / "params.json").write_text(json.dumps(params), encoding="utf-8")
    # Ignored here, and so by the kernel papermill starts (an ignored signal stays ignored across
    # exec): it neither ends this task before the notebook is written nor kills a kernel still
    # starting up, whose limit inside the job's then stops it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    run(str(folder))


VERBS = {"hello": hello, "state": state, "stage": stage, "seal": seal, "launch": launch, "peek": peek,
         "stop": stop, "kill": kill, "outputs": outputs, "port": port, "run": run, "job": job}

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in VERBS:
    answer = VERBS[sys.argv[1]](*sys.argv[2:])
    if answer is not None:
        print(json.dumps(answer), flush=True)
