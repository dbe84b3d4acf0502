"""`lab run`, `lab runs`, `lab plot`: start and continue runs, list them, draw their loss."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.config import MODEL_FIELDS, RunConfig, UserError, check, check_resume, raise_on_errors
from lab.train_cli import add_config_flags, config_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--config", metavar="FILE", help="JSON file with run fields (flags override it)")
    parser.add_argument("--machine", default="local", help="where it runs: local (this computer)")
    parser.add_argument("--nproc", type=int, default=0, help="processes under torchrun; 0: one per GPU")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _start_point(resume: str | None) -> tuple[object, Path | None, dict | None]:
    """(the run being continued or None, the checkpoint path, the checkpoint's sidecar)."""
    if not resume:
        return None, None, None
    from lab.runs import load_run
    from lab.checkpoint import CheckpointError, resolve_checkpoint
    path = Path(resume).expanduser()
    run = None
    if not path.exists():
        run = load_run(resume)
        path = run.folder
    elif (path / "run.json").is_file():
        run = load_run(str(path))
    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    return run, ckpt, json.loads(ckpt.with_suffix(".json").read_text())


def run(args: argparse.Namespace) -> int:
    if args.machine != "local":
        raise UserError(f"machine {args.machine!r}: only `local` runs from here yet")
    cont, ckpt, meta = _start_point(args.resume_from)
    if cont is not None:  # continuing a run: its fields, then what was given now
        base = {**cont.config, **{k: v for k, v in vars(args).items() if k in cont.config and v is not None}}
        args_given = {k for k, v in vars(args).items() if k in RunConfig().to_dict() and v is not None}
        cfg = RunConfig.from_dict({**base, "resume_from": ""})
        given = args_given
    else:
        cfg, given = config_from_args(args)
        cfg.resume_from = ""
    warnings = raise_on_errors(check(cfg))
    if meta is not None:
        raise_on_errors(check_resume(cfg, meta["config"], meta["step"], given & set(MODEL_FIELDS)))
        for name in MODEL_FIELDS:
            setattr(cfg, name, meta["config"][name])
    for w in warnings:
        print(f"warning: {w.en}")

    from lab import corpus
    from lab.runs import create_run
    from lab.local_machine import execute_link
    corpus.get_constellations(cfg.constellations)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else (
        corpus.find_prepared(cfg.constellations) or corpus.prepare(cfg.constellations, progress=not args.quiet))
    if cont is None:
        parent = None
        if meta:
            owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
            parent = {"run": owner.name if (owner / "run.json").is_file() else None,
                      "checkpoint": str(ckpt), "step": meta["step"]}
        target = create_run(cfg, parent=parent)
    else:
        target = cont
        from lab.runs import updating
        with updating(cont.id) as r:
            r.config = cfg.to_dict()
    print(f"run {target.id}: {target.folder}", flush=True)
    link = execute_link(target, cfg, data_dir, ckpt, progress=not args.quiet, nproc=args.nproc)
    print(f"run {target.id}: link {link.n} {link.status} at step {link.to_step} ({link.reason})")
    print(f"notebook {target.folder / link.notebook}")
    print(f"plot     {target.folder / 'loss.png'}")
    return 0


def configure_listing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per run")


def run_listing(args: argparse.Namespace) -> int:
    from lab.plots import read_metrics
    from lab.runs import lineage, list_runs
    runs = list_runs()
    if args.json:
        for r in runs:
            print(json.dumps(r.to_dict(), ensure_ascii=False))
        return 0
    if not runs:
        print("no runs yet: start one with `lab run`")
        return 0
    print(f"{'run':<32} {'status':<8} {'step':>13} {'loss':>7} {'val':>7}  links / from")
    for r in runs:
        rows = read_metrics(r.folder)
        loss = next((m["loss"] for m in reversed(rows) if "loss" in m), None)
        val = next((m["val_loss"] for m in reversed(rows) if "val_loss" in m), None)
        machines = ",".join(link.machine for link in r.links) or "-"
        chain = lineage(r)
        origin = f" <- {chain[-2]}" if len(chain) > 1 else ""
        print(f"{r.id:<32} {r.status:<8} {f'{r.step:,}/{r.cfg.steps_until:,}':>13} "
              f"{_fmt(loss):>7} {_fmt(val):>7}  {machines}{origin}")
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def configure_plot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")
    parser.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis")


def run_plot(args: argparse.Namespace) -> int:
    from lab.plots import save_loss_plot
    from lab.runs import load_run
    r = load_run(args.run)
    if not (r.folder / "metrics.jsonl").exists():
        raise UserError(f"run {r.id} has no metrics yet")
    print(save_loss_plot(r.folder, x=args.x, title=r.id))
    return 0
