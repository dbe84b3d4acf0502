"""`lab sweep`: a grid of runs (sizes, learning rates, schedules, cooldown points) with one
progress table."""
from __future__ import annotations

import argparse
import json

from lab.api import sweeps
from lab.config import UserError
from lab.flags import add_config_flags, fields_from_args


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{text!r}: give numbers separated by commas, such as 1e-3,3e-3") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON file with the base run's fields (flags override it)")
    add_config_flags(parser)
    parser.add_argument("--sizes", default="", metavar="LxW,...", help="sizes as layers x width, such as 2x64,4x128")
    parser.add_argument("--lrs", default="", metavar="LR,...", help="peak learning rates, such as 1e-3,3e-3")
    parser.add_argument("--schedules", default="", metavar="NAME,...", help="schedules: wsd,cosine,linear,inv_sqrt")
    parser.add_argument("--cooldown", default="", metavar="F,...",
                        help="cooldown branches at these fractions of steps_until (WSD runs), such as 0.25,0.5,0.75")
    parser.add_argument("--branch-decay-frac", type=float, default=None, metavar="F",
                        help="each branch decays over this fraction of its length (default 0.2)")
    parser.add_argument("--machine", default="auto",
                        help="auto (spread over free Kaggle accounts; here one after another when the lab has none), "
                             "local, or an account")
    parser.add_argument("--inline", action="store_true",
                        help="train here in this process, one after another, without the notebook (fast for tiny CPU runs)")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between looks at runs elsewhere")
    parser.add_argument("--json", action="store_true", help="print the runs and their points as one JSON object at the end")


def run(args: argparse.Namespace) -> int:
    say = (lambda s: None) if args.json else (lambda s: print(s + "\n", flush=True))
    swept = sweeps.run(fields_from_args(args), [s for s in args.sizes.split(",") if s.strip()], _floats(args.lrs),
                       [s.strip() for s in args.schedules.split(",") if s.strip()], _floats(args.cooldown),
                       args.branch_decay_frac, args.machine, args.inline, say, args.poll_s)
    if args.json:
        print(json.dumps(swept.summary, ensure_ascii=False, indent=1))
    else:
        print(f"{swept.summary['points']} point(s) from {swept.runs} run(s); `lab fit` fits them")
    return 0
