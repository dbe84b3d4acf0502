"""`lab watch RUN`, `lab cancel RUN`: follow, resume and stop runs.

    lab watch RUN       drives the run to its end here, resuming it where it stopped (after the
                        control side crashed or was killed, a failure you fixed, a cancel);
                        when another process already drives it, follows that one instead
    lab watch RUN --follow    only follows
    lab cancel RUN      no further link; a session on this computer or a box saves and stops;
                        for a Kaggle session, says where to press Stop (Kaggle's API cannot)

`lab watch` drives a run with the same function as the background driver that `lab run
--detach` and the control notebook start (`python -m lab.machines.background RUN`).
"""
from __future__ import annotations

import argparse
import time

from lab.api import runs as lab_runs
from lab.home import runs_dir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")
    parser.add_argument("--follow", action="store_true", help="only follow the process that drives it")
    parser.add_argument("-q", "--quiet", action="store_true", help="no notebook progress, only the run's events")


def run(args: argparse.Namespace) -> int:
    run_id = lab_runs.get(args.run).id
    if args.follow or lab_runs.driven(run_id):
        return follow(run_id)
    try:
        final = lab_runs.drive(run_id, progress=not args.quiet, say=lambda s: print(s, flush=True))
    except lab_runs.DriverBusy:  # another process took it just now
        return follow(run_id)
    return 1 if final.status == "failed" else 0


def follow(run_id: str, every_s: float = 2.0) -> int:
    """Prints the driver's events as they come, until no process drives the run."""
    log = runs_dir() / run_id / "control.log"
    printed, last = 0, ""
    print(f"following run {run_id} (driven by another process; Ctrl-C stops following, not the run)", flush=True)
    while True:
        alive = lab_runs.driven(run_id)
        lines = log.read_text(encoding="utf-8").splitlines() if log.is_file() else []
        for line in lines[printed:]:
            print(line, flush=True)
            last = line
        printed = len(lines)
        if not alive:
            state = lab_runs.status(run_id)
            final = state.message or f"run {run_id}: {state.status} at step {state.step:,}"
            if not last.endswith(final):
                print(final, flush=True)
            return 1 if state.status == "failed" else 0
        time.sleep(every_s)


def configure_cancel(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")


def run_cancel(args: argparse.Namespace) -> int:
    print(lab_runs.cancel(args.run))
    return 0
