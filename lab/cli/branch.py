"""`lab branch RUN --at STEP`: a cooldown branch from a checkpoint of a WSD run."""
from __future__ import annotations

import argparse

from lab.api import runs as lab_runs


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="the WSD run to branch from (id, unique prefix or folder)")
    parser.add_argument("--at", type=int, required=True, metavar="STEP",
                        help="the step of the run's checkpoint to branch from (in its constant phase)")
    parser.add_argument("--decay-frac", type=float, default=lab_runs.DECAY_FRAC, metavar="F",
                        help=f"the branch decays over this fraction of its length (0.1–0.2; default {lab_runs.DECAY_FRAC})")
    parser.add_argument("--machine", default=None, help="auto, local or a Kaggle account (default: the run's)")
    parser.add_argument("--wait", action="store_true", help="drive the branch here until it ends")


def run(args: argparse.Namespace) -> int:
    branch = lab_runs.branch(args.run, args.at, args.decay_frac, args.machine, background=not args.wait)
    print(f"branch {branch.id}: from step {args.at:,} of {args.run}, decays to step {branch.cfg.steps_until:,}")
    if args.wait:
        done = lab_runs.drive(branch.id)
        return 0 if done.status == "done" else 1
    print(f"`lab watch {branch.id}` follows it")
    return 0
