"""lab.procs: a run's session is found by the folder it works in, among the other processes the
same process started (a notebook's background runs, a test's servers)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from lab.procs import signal_quietly, working_in

SLEEP = "import time; time.sleep(600)"


def test_a_runs_session_is_the_processes_below_working_in_its_folder(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    # The kernel in the run folder and a worker it started (which inherits the folder); a
    # bystander elsewhere.
    worker = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SLEEP!r}])"
    kernel = subprocess.Popen([sys.executable, "-c", worker], cwd=run)
    bystander = subprocess.Popen([sys.executable, "-c", SLEEP], cwd=other)
    try:
        deadline = time.monotonic() + 30
        while len(working_in(run)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = working_in(run)
        assert kernel.pid in found and len(found) == 2, found
        assert bystander.pid not in found
        assert working_in(other) == [bystander.pid]
        assert working_in(run, pid=bystander.pid) == [], "only what is below the given process"
    finally:
        for pid in working_in(run):
            signal_quietly(pid, signal.SIGKILL)
        for proc in (kernel, bystander):
            proc.kill()
            proc.wait()


def test_a_cancel_of_a_run_here_signals_its_session_not_what_else_its_driver_started(tmp_path):
    """The driver may be a notebook's kernel that drives one run and has started others in the background."""
    from types import SimpleNamespace

    from lab.machines.local import LocalHost
    run = SimpleNamespace(id="r1", folder=tmp_path / "r1")
    run.folder.mkdir()
    (tmp_path / "r2").mkdir()
    heard = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(3)); print('ready', flush=True); "
             "time.sleep(600)")
    kernel, other_run = (subprocess.Popen([sys.executable, "-c", heard], cwd=cwd, stdout=subprocess.PIPE, text=True)
                         for cwd in (run.folder, tmp_path / "r2"))
    try:
        assert kernel.stdout.readline() == other_run.stdout.readline() == "ready\n"
        assert "saves a checkpoint and stops" in LocalHost().cancel(run, None, driver_pid=os.getpid())
        assert kernel.wait(timeout=30) == 3, "the run's kernel got the stop button's SIGINT"
        time.sleep(0.5)
        assert other_run.poll() is None, "another run of the same driver goes on"
    finally:
        for proc in (kernel, other_run):
            proc.kill()
            proc.wait()
