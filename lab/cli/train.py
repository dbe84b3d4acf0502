"""`lab train`: the training loop from the command line, in this process or under torchrun."""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from lab.config import RunConfig, UserError, resumed_config
from lab.flags import add_config_flags, fields_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON file with run fields (flags override it)")
    add_config_flags(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder: metrics, checkpoints, config")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="if the newest checkpoint is corrupt, continue from the previous good one")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch under torchrun (default: one per GPU when parallel is auto/ddp)")


def processes_wanted(cfg: RunConfig, nproc: int | None) -> int:
    if nproc is not None:
        return nproc
    if cfg.parallel not in ("auto", "ddp"):
        return 1
    import torch
    return max(1, torch.cuda.device_count())


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-runs this command under torchrun; torchrun's workers see WORLD_SIZE and train."""
    from lab.kernel.launch import launch
    # Workers need no --nproc, and torchrun's own parser would take it for --nproc-per-node.
    argv = [a for i, a in enumerate(argv) if a != "--nproc" and not a.startswith("--nproc=")
            and (i == 0 or argv[i - 1] != "--nproc")]
    ended = launch(nproc, ["-m", "lab.cli.train", *argv])
    if ended.failed:
        print(f"lab train: {ended.failure_text()}; the newest checkpoint in the --out folder continues it "
              f"(`lab train --resume DIR`)", file=sys.stderr)
        return 1
    print(json.dumps(ended.result))
    return 0


def resumed(cfg: RunConfig, given: set[str]) -> RunConfig:
    """A resumed run's config: the checkpoint's (read from its sidecar, without hashing the
    checkpoint: the loop verifies it), with the fields given now on top, so the data to open
    is the run's own. Without a checkpoint there the loop says what is wrong."""
    from lab.kernel.checkpoint import checkpoint_meta, list_checkpoints
    target = Path(cfg.resume_from)
    found = [target] if target.is_file() and target.with_suffix(".json").is_file() else \
        list_checkpoints(target) or list_checkpoints(target / "checkpoints")
    if not found:
        return cfg
    return resumed_config(checkpoint_meta(found[-1]).get("config") or {}, {name: getattr(cfg, name) for name in given})


def run(args: argparse.Namespace) -> int:
    from lab.machines.needs import find_data
    fields = fields_from_args(args)
    cfg, given = RunConfig.from_dict(fields), set(fields)
    if cfg.resume_from:
        cfg = resumed(cfg, given)
    data_dir = find_data(cfg)
    nproc = processes_wanted(cfg, args.nproc)
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        return launch_torchrun(nproc, args.argv)
    from lab.kernel.checkpoint import CheckpointError
    from lab.kernel.data import DataError
    from lab.kernel.launch import report_result, reporting_failure, stop_file_from_env
    from lab.kernel.train import OutOfMemory, train
    rank = int(os.environ.get("RANK", "0"))
    try:
        with reporting_failure(rank) if "WORLD_SIZE" in os.environ else nullcontext():
            result = train(cfg, args.out, data_dir, resume=cfg.resume_from or None,
                           allow_fallback=args.allow_fallback, log=lambda s: print(s, flush=True),
                           stop_file=stop_file_from_env(), on_metrics=_prediction_once(Path(args.out), cfg, rank))
    except (CheckpointError, DataError, OutOfMemory) as e:
        raise UserError(str(e)) from None
    if "WORLD_SIZE" in os.environ:
        report_result(result, rank)
    else:
        print(json.dumps(result))
    return 0


def _prediction_once(out: Path, cfg: RunConfig, rank: int):
    """On the first metrics row (the fields checked, the folder there), predicted.json in the
    --out folder on this computer's card, as a registered run gets from
    `lab.settle.register_run`: a folder `lab train` fills is measured like any run. Its own rows
    never count in it (lab.sizing.calibration)."""
    if rank != 0:
        return None
    done: list[bool] = []

    def note(_row: dict) -> None:
        if not done:
            done.append(True)
            from lab.machines.local import local_gpu
            from lab.sizing.calibration import record_prediction
            record_prediction(out, cfg, gpu=local_gpu())
    return note


if __name__ == "__main__":  # what torchrun runs
    from lab.cli import main
    sys.exit(main(["train", *sys.argv[1:]]))
