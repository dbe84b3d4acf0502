"""`lab train`: the training loop from the command line, in this process or under torchrun
(lab.api.train)."""
from __future__ import annotations

import argparse
import json

from lab.api.train import Here, train_here
from lab.flags import add_config_flags, fields_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON file with run fields (flags override it)")
    add_config_flags(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder: metrics, checkpoints, config")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="if the newest checkpoint is corrupt, continue from the previous good one")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch under torchrun (default: one per GPU when parallel is auto/ddp)")


def run(args: argparse.Namespace) -> int:
    fields = fields_from_args(args)
    resume = fields.pop("resume_from", None)
    result = train_here(fields, resume, Here(args.out, args.nproc, args.allow_fallback))
    print(json.dumps(result))
    return 0
