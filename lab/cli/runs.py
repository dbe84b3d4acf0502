"""`lab run`, `lab runs`, `lab plot`: start and continue runs, list them, draw their loss."""
from __future__ import annotations

import argparse
import json

from lab.api import curves
from lab.api import runs as lab_runs
from lab.cli import home_line
from lab.config import UserError
from lab.flags import add_config_flags, fields_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--config", metavar="FILE", help="JSON file with run fields (flags override it)")
    parser.add_argument("--machine", default="auto",
                        help="where it runs: auto (the guide's rule over the Kaggle accounts and the lab's boxes; "
                             "this computer when the lab has none), local (this computer), or a machine's name "
                             "(a Kaggle account, a box: `lab machines`)")
    parser.add_argument("--detach", action="store_true",
                        help="start it in the background and return; `lab watch RUN` follows it")
    parser.add_argument("--nproc", type=int, default=0, help="processes under torchrun; 0: one per GPU")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    if args.nproc and args.machine != "local":
        raise UserError("--nproc applies to this computer only (--machine local): Kaggle sessions use both T4s, "
                        "a box all of its GPUs")
    target = lab_runs.register(fields_from_args(args), machine=args.machine,
                               warn=lambda p: print(f"{p.severity}: {p.en}"))
    print(f"run {target.id}: {target.folder}", flush=True)
    if args.detach:
        lab_runs.spawn(target.id)  # not resume: a cancel given from now on holds
        print(f"started in the background: `lab watch {target.id}` follows it, `lab cancel {target.id}` stops it")
        return 0
    # Driven here: data not prepared yet is prepared now, with its progress shown.
    final = lab_runs.drive(target.id, progress=not args.quiet, nproc=args.nproc,
                           say=(lambda s: None) if args.quiet else (lambda s: print(s, flush=True)))
    link = final.links[-1] if final.links else None
    if link is not None:
        print(f"run {final.id}: link {link.n} {link.status} at step {link.to_step} ({link.reason})")
        if link.notebook:
            print(f"notebook {final.folder / link.notebook}")
    print(f"plot     {final.folder / 'loss.png'}")
    if final.status == "failed":
        raise UserError(lab_runs.status(final.id).message or f"run {final.id} failed")
    return 0


def configure_listing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per run")


def run_listing(args: argparse.Namespace) -> int:
    if args.json:
        for r in lab_runs.runs():
            print(json.dumps(r.to_dict(), ensure_ascii=False))
        return 0
    rows = lab_runs.rows()
    if not rows:
        print(f"no runs yet: start one with `lab run`\n{home_line()}")
        return 0
    print(f"{'run':<32} {'status':<8} {'step':>13} {'loss':>7} {'val':>7} {'val bpb':>7}  "
          f"{'tok/s (predicted, error)':<30}  links / from")
    for r in rows:
        origin = f" <- {r.parent}" if r.parent else ""
        print(f"{r.id:<32} {r.status:<8} {f'{r.step:,}/{r.config.steps_until:,}':>13} "
              f"{_fmt(r.loss):>7} {_fmt(r.val_loss):>7} {_fmt(r.val_bpb):>7}  "
              f"{'-' if r.speed is None else r.speed.text():<30}  {','.join(r.machines) or '-'}{origin}")
        for slow in r.slow:  # a session that spent quota for little: said, not hidden
            print(f"{'':<32} warning: {slow.words()}")
    print(home_line())  # the folder the control notebook's setup cell names too
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def configure_plot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")
    parser.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis")


def run_plot(args: argparse.Namespace) -> int:
    r = lab_runs.get(args.run)
    if not (r.folder / "metrics.jsonl").exists():
        raise UserError(f"run {r.id} has no metrics yet")
    print(curves.draw(r.id, x=args.x))
    return 0
