"""lab.procs: a run's session is found by the folder it works in, among the other processes the
same process started (a notebook's background runs, a test's servers)."""
from __future__ import annotations

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
