"""The one torchrun launcher: starts the loop in one process per card and follows it to its end.

Both the notebook (its torchrun workers run the script the notebook wrote) and `lab train
--nproc N` start their workers here. What it adds to torchrun:

* A stop that every rank sees at the same step. torchrun turns SIGINT/SIGTERM into SIGTERM for
  its workers and kills them 30 s later, saved or not, then exits with an error. So torchrun
  runs in its own session, out of reach of the notebook's stop button (Jupyter signals the
  kernel's process group), and a stop is passed on as a *stop file* that each rank's
  `StopGuard` reads at its next logged step; the ranks agree, save and end, and torchrun exits 0.
* Collective timeouts, so that a rank stuck in a collective fails within minutes
  instead of burning a 12-hour session (`COLLECTIVE_TIMEOUT_MIN`).
* One account of how it ended: the rank-0 worker prints its result as a `RESULT {json}` line;
  a failed rank prints `FAILED {json}` after its traceback. The launcher collects both.
* If the launcher dies (the notebook's kernel is killed), torchrun gets SIGTERM (Linux), so the
  workers save and stop instead of training on unwatched.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from lab.config import UserError
from lab.kernel.checkpoint import CheckpointError
from lab.kernel.data import DataError
from lab.kernel.signals import catching_stop_signals

RESULT = "RESULT "
FAILED = "FAILED "
STOP_FILE_ENV = "LAB_STOP_FILE"  # where a worker looks for a stop request (set by the launcher)
COLLECTIVE_TIMEOUT_MIN = 10.0  # a collective waiting longer than this is a hang: the rank fails


def collective_env() -> dict:
    """Settings for the workers' process group: NCCL tears a rank down when a collective
    fails or times out (instead of leaving it blocked), and its watchdog's heartbeat gives up
    in minutes. gloo needs only the timeout `init_process_group` is given."""
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(COLLECTIVE_TIMEOUT_MIN * 60)),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}


@dataclass(frozen=True)
class Nodes:
    """The hosts that train one run together: how many, which one this is (0: the first, whose
    rank 0 writes the run's files) and where they meet (HOST:PORT on the first host)."""
    count: int = 1
    rank: int = 0
    endpoint: str = ""


def torchrun_command(nproc: int, target: list[str], nodes: Nodes = Nodes()) -> list[str]:
    """torchrun with `nproc` workers on this machine, each running `target` (a script and its
    arguments, or `-m module ...`); on a group of hosts, this host's part of it. The group meets
    in torchrun's static rendezvous, a c10d store on the first host: node rank I is host I, so
    the first host holds rank 0 (torchrun's c10d backend would rank the hosts by name instead)."""
    if nodes.count <= 1:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", "--rdzv-backend=static",
                 f"--rdzv-endpoint={nodes.endpoint}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={nproc}", *target]


@dataclass
class Launched:
    """How a multi-process session ended."""
    returncode: int
    result: dict | None  # rank 0's result, when it got that far
    failures: list[dict] = field(default_factory=list)  # {"rank", "error"} of each failed rank, first first
    stop: str | None = None  # why a stop was requested, if one was

    @property
    def failed(self) -> bool:
        return self.result is None

    def failure_text(self) -> str:
        if self.failures:
            first = self.failures[0]
            return f"rank {first['rank']} failed: {first['error']}"
        return f"the workers ended without a result (torchrun exit {self.returncode})"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        import ctypes  # Linux only, in the child before exec
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the workers still stop at their time limit


@contextmanager
def _stop_requests(stop_file: Path, say: Callable[[str], None]) -> Iterator[dict]:
    """While inside, SIGINT and SIGTERM (the stop button, Ctrl-C, a cancel) write the stop file
    instead of interrupting; a second one interrupts as usual."""
    def request(name: str) -> None:
        tmp = stop_file.with_name(".stop.tmp")  # whole or absent: every rank reads the same reason
        tmp.write_text(f"{name} received", encoding="utf-8")
        os.replace(tmp, stop_file)
        say(f"{name}: every rank saves a checkpoint at its next step and stops (again to abandon)")

    with catching_stop_signals(request) as caught:
        yield caught


def launch(nproc: int, target: list[str], on_line: Callable[[str], None] = lambda s: print(s, end="", flush=True),
           on_tick: Callable[[], None] = lambda: None, nodes: Nodes = Nodes()) -> Launched:
    """Runs `target` in `nproc` processes under torchrun (this host's part of `nodes`); every
    output line but the RESULT and FAILED lines goes to `on_line`, and `on_tick` runs after each
    (a live plot)."""
    folder = Path(tempfile.mkdtemp(prefix="lab-launch-"))
    stop_file = folder / "stop"
    env = {**os.environ, **collective_env(), STOP_FILE_ENV: str(stop_file), "PYTHONUNBUFFERED": "1"}
    say = lambda text: on_line(text + "\n")  # noqa: E731
    result, failures = None, []
    with _stop_requests(stop_file, say) as stop:
        proc = subprocess.Popen(torchrun_command(nproc, target, nodes), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, env=env, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            for line in proc.stdout:
                kind, value = _parse(line)
                if kind == RESULT:
                    result = value
                elif kind == FAILED:
                    failures.append(value)
                else:
                    on_line(line)
                on_tick()
        except KeyboardInterrupt:  # a second stop: abandon the save
            proc.terminate()
        returncode = proc.wait()
    stop_file.unlink(missing_ok=True)
    folder.rmdir()
    return Launched(returncode, result, failures, stop["signal"] and f"{stop['signal']} received")


def _parse(line: str) -> tuple[str | None, dict | None]:
    """(RESULT or FAILED, its value) for a worker's report line; (None, None) for any other line,
    a report mangled by another process's output included."""
    for kind in (RESULT, FAILED):
        if line.startswith(kind):
            try:
                value = json.loads(line[len(kind):])
            except ValueError:
                return None, None
            return (kind, value) if isinstance(value, dict) else (None, None)
    return None, None


def stop_file_from_env() -> str | None:
    """The stop file a launcher gave this worker, if any."""
    return os.environ.get(STOP_FILE_ENV) or None


@contextmanager
def reporting_failure(rank: int) -> Iterator[None]:
    """Around a worker's work: a failure prints its traceback and a FAILED line for the launcher."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, SystemExit) and not e.code:
            raise
        if not isinstance(e, (UserError, CheckpointError, DataError)):  # those say what to do already
            traceback.print_exc()
            sys.stderr.flush()
        print(FAILED + json.dumps({"rank": rank, "error": f"{type(e).__name__}: {e}"}), flush=True)
        raise


def report_result(result: dict, rank: int) -> None:
    """Rank 0 hands its result to the launcher."""
    if rank == 0:
        print(RESULT + json.dumps(result), flush=True)
