"""`lab watch RUN`, `lab cancel RUN`: follow, resume and stop runs.

    lab watch RUN       drives the run to its end here, resuming it where it stopped (after the
                        control side crashed or was killed, a failure you fixed, a cancel);
                        when another process already drives it, follows that one instead
    lab watch RUN --follow    only follows
    lab watch RUN --newest-image    the run's next Kaggle links on Kaggle's newest image (they keep
                        its first link's image otherwise)
    lab cancel RUN      no further link; a session on this computer, a box or a cluster saves and
                        stops; a Kaggle session cannot save first: its kernel is deleted, once you confirm

`lab watch` drives a run with the same function as the background driver that `lab run
--detach` and the control notebook start (`python -m lab.machines.background RUN`).
"""
from __future__ import annotations

import argparse
import sys
import time

from lab.api import runs as lab_runs
from lab.home import runs_dir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")
    parser.add_argument("--follow", action="store_true", help="only follow the process that drives it")
    parser.add_argument("-q", "--quiet", action="store_true", help="no notebook progress, only the run's events")
    parser.add_argument("--newest-image", action="store_true", help="the run's next Kaggle links on Kaggle's newest "
                                                                    "image, not its first link's")


def run(args: argparse.Namespace) -> int:
    run_id = lab_runs.get(args.run).id
    if args.newest_image:
        lab_runs.newest_image(run_id)
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
    parser.add_argument("--yes", action="store_true", help="end a session that cannot save first (a Kaggle "
                                                           "session: its kernel is deleted) without asking")


def run_cancel(args: argparse.Namespace) -> int:
    loses = lab_runs.cancel_loses(args.run)
    if loses and not args.yes:
        if not sys.stdin.isatty():
            print(f"lab cancel: {loses[0]}. To end it so, `lab cancel {args.run} --yes`.", file=sys.stderr)
            return 2
        if input(f"{loses[0]}. End it? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing was cancelled.")
            return 1
    print(lab_runs.cancel(args.run))
    return 0
