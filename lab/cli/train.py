"""`lab train`: the training loop from the command line, in this process or under torchrun
(lab.api.train)."""
from __future__ import annotations

import argparse
import json

from lab.api.train import Here, train_here, train_spec_file
from lab.config import UserError
from lab.flags import add_config_flags, fields_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON file with run fields (flags override it)")
    parser.add_argument("--spec", metavar="FILE",
                        help='a link\'s spec as JSON ({"run": ..., "session": ...}, as a link records it): trains that '
                             "link here; --out, --nproc and --allow-fallback override its session's")
    add_config_flags(parser)
    parser.add_argument("--out", metavar="DIR", help="run folder: metrics, checkpoints, config (required without --spec)")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="if the newest checkpoint is corrupt, continue from the previous good one")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch under torchrun (default: one per GPU when parallel is auto/ddp)")


def run(args: argparse.Namespace) -> int:
    fields = fields_from_args(args)
    if args.spec:
        if fields:
            raise UserError(f"--spec holds the run's fields: give them in the spec, not as --config or flags "
                            f"({', '.join(sorted(fields))})")
        result = train_spec_file(args.spec, Here(args.out, args.nproc, args.allow_fallback))
    elif not args.out:
        raise UserError("lab train needs --out DIR (the run folder), or --spec FILE")
    else:
        resume = fields.pop("resume_from", None)
        result = train_here(fields, resume, Here(args.out, args.nproc, args.allow_fallback))
    print(json.dumps(result))
    return 0

