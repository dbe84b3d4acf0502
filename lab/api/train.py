"""`lab train`: a run's loop here, without the registry (into a folder the person names): in this
process, or under torchrun with one process per card. Its fields are settled as a registered run's
are (`lab.settle.preview`: a resume continues the run as it was, the given fields on top), once,
into a link's spec (`lab.spec.LinkSpec`: the run and this session's data, checkpoint and folder),
which the loop takes whole and torchrun's workers read from a file, as the training notebook's do.
`lab train --spec FILE` takes a spec as a link records it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import CheckpointError
from lab.kernel.data import DataError
from lab.kernel.fitting import OutOfMemory
from lab.kernel.launch import launch, stop_file_from_env
from lab.kernel.session import WORKER_SPEC, train_link, worker_main
from lab.machines.local import local_gpu
from lab.machines.needs import find_data
from lab.settle import checked, preview
from lab.sizing.calibration import record_prediction
from lab.spec import LinkSpec


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
    return train_spec(LinkSpec.of(cfg, data_dir=str(data), resume_from=str(ckpt or ""), out_dir=how.out,
                                  allow_fallback=how.allow_fallback), how.nproc)


def train_spec(spec: LinkSpec, nproc: int | None = None) -> dict:
    """Trains one link's spec here, as its session would: in this process, or under torchrun with
    `nproc` processes (None: the spec's, else one per card when the run's `parallel` is auto or ddp)."""
    if not spec.session.out_dir or not spec.session.data_dir:
        raise UserError("a spec for `lab train` names its session's out_dir and data_dir")
    procs = processes_wanted(spec.run, nproc if nproc is not None else spec.session.nproc or None)
    cfg, out = replace(spec.run, data_dir=spec.session.data_dir), Path(spec.session.out_dir)  # for the calculator
    if procs > 1 and "WORLD_SIZE" not in os.environ:
        return _under_torchrun(spec, procs, cfg)
    try:
        return train_link(spec, log=lambda s: print(s, flush=True), stop_file=stop_file_from_env(),
                          on_metrics=_prediction_once(out, cfg))
    except (CheckpointError, DataError, OutOfMemory) as e:
        raise UserError(str(e)) from None


def train_spec_file(path: str, how: Here) -> dict:
    """`lab train --spec FILE`: the link's spec in `path`, its session's folder `how.out` when given
    and its fallback when asked for, trained here."""
    try:
        spec = LinkSpec.from_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the spec {path}: {e}") from None
    if how.out:
        spec = spec.with_session(out_dir=how.out)
    if how.allow_fallback:
        spec = spec.with_session(allow_fallback=True)
    return train_spec(spec, how.nproc)


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


def _under_torchrun(spec: LinkSpec, nproc: int, cfg: RunConfig) -> dict:
    """The spec written whole for the workers (`python -m lab.api.train --spec FILE`), then torchrun."""
    out = Path(spec.session.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / WORKER_SPEC).write_text(spec.to_json(), encoding="utf-8")
    ended = launch(nproc, ["-m", "lab.api.train", "--spec", str(out / WORKER_SPEC)])
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


if __name__ == "__main__":  # what torchrun runs: the training notebook's own worker
    worker_main(sys.argv[1:])
