"""`lab train`: a run's loop here, without the registry (into a folder the person names): in this
process, or under torchrun with one process per card. Its fields are settled as a registered run's
are (`lab.settle.preview`: a resume continues the run as it was, the given fields on top), once;
torchrun's workers get that config whole from a file.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import CheckpointError
from lab.kernel.data import DataError
from lab.kernel.launch import launch, report_result, reporting_failure, stop_file_from_env
from lab.kernel.train import OutOfMemory, train
from lab.machines.local import local_gpu
from lab.machines.needs import find_data
from lab.settle import checked, preview
from lab.sizing.calibration import record_prediction

WORKER_CONFIG = "session-config.json"  # in the out folder: the settled config torchrun's workers train with


@dataclass(frozen=True)
class Here:
    """How `lab train` runs: `nproc` processes under torchrun (None: one per card when the run's
    `parallel` is auto or ddp), `allow_fallback` past a corrupt newest checkpoint."""
    out: str
    nproc: int | None = None
    allow_fallback: bool = False


def processes_wanted(cfg: RunConfig, nproc: int | None) -> int:
    if nproc is not None:
        return nproc
    if cfg.parallel not in ("auto", "ddp"):
        return 1
    return max(1, torch.cuda.device_count())


def train_here(given: dict, resume: str | None, how: Here) -> dict:
    """Trains the run the fields describe into `how.out`; returns its result (where it stopped and
    why). Raises UserError for fields, data or a checkpoint the person can fix."""
    pv = preview(given, resume)
    for problem in checked(pv):
        print(f"{problem.severity}: {problem.en}", flush=True)
    cfg, ckpt = pv.cfg, pv.settled.start.checkpoint
    if pv.grown is not None and pv.grown.set_aside:
        set_aside(pv.grown.set_aside, Path(how.out))
    data = Path(cfg.data_dir) if cfg.data_dir else find_data(cfg)  # not prepared: says how
    nproc = processes_wanted(cfg, how.nproc)
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _under_torchrun(cfg, data, ckpt, nproc, how)
    try:
        result = train(cfg, how.out, data, resume=ckpt, allow_fallback=how.allow_fallback,
                       log=lambda s: print(s, flush=True), stop_file=stop_file_from_env(),
                       on_metrics=_prediction_once(Path(how.out), cfg))
    except (CheckpointError, DataError, OutOfMemory) as e:
        raise UserError(str(e)) from None
    return result


def set_aside(checkpoints: tuple[Path, ...], out: Path) -> None:
    """A run grown from its stable phase in its own folder: the old decay's checkpoints there move
    to `set-aside/` (kept, not deleted), so the loop's newest is the one it grows from."""
    aside = out / "set-aside"
    for ckpt in checkpoints:
        if ckpt.parent.resolve() in (out.resolve(), (out / "checkpoints").resolve()):
            aside.mkdir(exist_ok=True)
            for part in (ckpt, ckpt.with_suffix(".json")):
                if part.exists():
                    part.rename(aside / part.name)


def _under_torchrun(cfg: RunConfig, data: Path, ckpt: str | None, nproc: int, how: Here) -> dict:
    """The settled config written whole for the workers (`python -m lab.api.train`), then torchrun."""
    out = Path(how.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / WORKER_CONFIG).write_text(cfg.to_json(), encoding="utf-8")
    target = ["-m", "lab.api.train", "--config", str(out / WORKER_CONFIG), "--out", str(out), "--data", str(data)]
    target += ["--resume", ckpt] if ckpt else []
    target += ["--allow-fallback"] if how.allow_fallback else []
    ended = launch(nproc, target)
    if ended.failed:
        raise UserError(f"{ended.failure_text()}; the newest checkpoint in {out} continues it (`lab train --resume "
                        f"{out} --out {out}`)")
    record_prediction(out, cfg, gpu=local_gpu())
    return ended.result


def _prediction_once(out: Path, cfg: RunConfig):
    """On the first metrics row (the fields checked, the folder there), predicted.json in the out
    folder on this computer's card, as a registered run gets from `lab.settle.register_run`: a
    folder `lab train` fills is measured like any run. Its own rows never count in it."""
    done: list[bool] = []

    def note(_row: dict) -> None:
        if not done:
            done.append(True)
            record_prediction(out, cfg, gpu=local_gpu())
    return note


def worker(argv: list[str]) -> None:
    """One torchrun worker: the loop with the config the launcher settled and wrote."""
    p = argparse.ArgumentParser()
    for flag in ("--config", "--out", "--data"):
        p.add_argument(flag, required=True)
    p.add_argument("--resume")
    p.add_argument("--allow-fallback", action="store_true")
    a = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    with reporting_failure(rank) if "WORLD_SIZE" in os.environ else nullcontext():
        result = train(RunConfig.from_json_file(a.config), a.out, a.data, resume=a.resume,
                       allow_fallback=a.allow_fallback, log=lambda s: print(s, flush=True),
                       stop_file=stop_file_from_env())
    report_result(result, rank)


if __name__ == "__main__":  # what torchrun runs
    worker(sys.argv[1:])
