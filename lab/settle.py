"""A run settled once: the fields a person gave, where the run starts and the machine, turned into
a registered run. The form's Start, `lab run`, `lab branch` and `lab sweep` all register through
`register_run`; then a caller either drives the run in its own process
(`lab.machines.driver.drive`) or spawns a background driver (`lab.machines.control.spawn_driver`).

    register_run(given, resume, machine)  the one way in: settles the fields, records the run and
                                          the calculator's prediction of its speed (predicted.json)
    start_point(resume)                   the run continued, or the checkpoint a new run starts from
    settled_config(given, point)          the fields as the run will train, merged and checked once

The checkpoint merge happens here, once, on the control side: the run's fields as they were (the
run's own record when the same run goes on; the checkpoint's config when a new run starts from
one), with the fields given now on top and the model fields locked to the checkpoint's. The
result is checked once: every field (`lab.config.check`), the model against the checkpoint
(`check_resume`) and, once the data is prepared, the context against it. Later steps only check:
the driver that the pinned data is still there, and the training notebook takes the settled
config whole (`given_fields=field_names()`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lab.config import MODEL_FIELDS, Problem, RunConfig, UserError, check, check_resume, raise_on_errors, resumed_config
from lab.machines import registry
from lab.machines.control import cancel_flag, driver_alive
from lab.machines.needs import data_problems, found_data
from lab.runs import Run, create_run, load_run, updating
from lab.sizing.calibration import record_prediction


@dataclass(frozen=True)
class StartPoint:
    """Where a run starts: from scratch (all None), a run that goes on (`run`, with its newest
    checkpoint unless it saved none yet), or a new run from a checkpoint (`run` None)."""
    run: Run | None = None
    checkpoint: Path | None = None
    meta: dict | None = None  # the checkpoint's sidecar: its step and the run's config at that step

    def parent(self) -> dict | None:
        """A new run's origin in the registry: the checkpoint, its step and the run that saved it."""
        if self.meta is None or self.checkpoint is None:
            return None
        ckpt = self.checkpoint
        owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
        return {"run": owner.name if (owner / "run.json").is_file() else None,
                "checkpoint": str(ckpt), "step": self.meta["step"]}


def start_point(resume: str | None) -> StartPoint:
    """The start point of a resume given as a run id, a run folder or a checkpoint file. A run
    continued before it saved any checkpoint goes on from its start."""
    if not resume:
        return StartPoint()
    from lab.kernel.checkpoint import CheckpointError, checkpoint_meta, list_checkpoints, resolve_checkpoint
    path = Path(resume).expanduser()
    run = None
    if not path.exists():
        run = load_run(resume)
        path = run.folder
    elif (path / "run.json").is_file():
        run = load_run(str(path))
    if run is not None and not (list_checkpoints(path / "checkpoints") or list_checkpoints(path)):
        return StartPoint(run)
    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    return StartPoint(run, ckpt, checkpoint_meta(ckpt))


def settled_config(given: dict, point: StartPoint) -> tuple[RunConfig, list[Problem]]:
    """The run's fields as it will train from `point`, with the warnings about them. `given`:
    the fields given now (name -> value: flags, a config file, the form). A model field given
    with another value than the checkpoint's is an error naming it; the data, when prepared, is
    pinned in `data_dir`. Raises ConfigError with every error found."""
    given = {name: value for name, value in given.items() if name != "resume_from"}
    if point.run is not None:  # the same run goes on: its own fields (its data pinned), what is given on top
        cfg = RunConfig.from_dict({**point.run.config, **given, "resume_from": ""})
    elif point.meta is not None:  # a new run from a checkpoint goes on as that run was
        cfg = resumed_config(point.meta.get("config") or {}, given)
    else:
        cfg = RunConfig.from_dict(given)
    problems: list[Problem] = []
    if point.meta is not None:
        theirs = point.meta.get("config") or {}
        problems += check_resume(cfg, theirs, point.meta["step"], set(given) & set(MODEL_FIELDS))
        for name in MODEL_FIELDS:
            setattr(cfg, name, theirs.get(name, getattr(cfg, name)))
    warnings = raise_on_errors(problems + check(cfg))
    data = found_data(cfg)
    if data is not None:  # not prepared yet: the driver prepares it, pins it and checks against it
        cfg.data_dir = str(data)
        warnings += raise_on_errors(data_problems(cfg, data))
    return cfg, warnings


def check_machine(machine: str | None) -> str:
    """"auto", or a machine of the lab that can be used now (a Kaggle account answers with its
    credentials)."""
    name = (machine or "auto").strip()
    if name != "auto":
        registry.host_for(name).check()
    return name


def register_run(given: dict, resume: str | None = None, machine: str | None = None,
                 warn: Callable[[Problem], None] | None = None) -> Run:
    """Registers the run the fields `given` describe (nothing runs yet) and returns it.
    `resume` (else `given["resume_from"]`): a run id or folder (the same run goes on) or a
    checkpoint (a new run from it); none: from scratch. `machine` (else `given["machine"]`):
    "auto", "local" or a Kaggle account, checked before anything is recorded. `warn` is told
    each warning about the fields."""
    point = start_point(resume or given.get("resume_from") or None)
    if machine is not None:
        given = {**given, "machine": machine}
    cfg, warnings = settled_config(given, point)
    cfg.machine = check_machine(cfg.machine)
    for problem in warnings if warn is not None else ():
        warn(problem)
    run = create_run(cfg, parent=point.parent()) if point.run is None else _going_on(point.run, cfg)
    # What the calculator says of this run now, before it measures itself: `lab runs`, the runs
    # panel and `lab size --calibration` set it beside the speed the run then measures. Every way
    # a run is made (the form's Start, lab run, lab branch, lab sweep) comes through here.
    record_prediction(run.folder, cfg)  # on the card it is sized for
    if cfg.machine == "local":  # and on this computer's, where it will train
        from lab.machines.local import local_gpu
        record_prediction(run.folder, cfg, gpu=local_gpu())
    elif cfg.machine != "auto":  # or on a box's, as its check found them
        from lab.machines.ssh_boxes import read_check
        checked = (read_check(cfg.machine) or {}).get("gpu")
        if checked:
            record_prediction(run.folder, cfg, gpu=checked)
    return run


def _going_on(run: Run, cfg: RunConfig) -> Run:
    """Readies `run` to go on with `cfg`. A person asked to go on, so an earlier cancel is
    forgotten here, before any driver starts: a cancel given after this, even before the driver
    holds the run, is kept."""
    if driver_alive(run.id):
        raise UserError(f"run {run.id} is running now: wait for it to end, or `lab cancel {run.id}` first",
                        ru=f"прогон {run.id} сейчас идёт: дождитесь его конца или сначала остановите его")
    cancel_flag(run.id).unlink(missing_ok=True)
    with updating(run.id) as r:
        r.config = cfg.to_dict()
        r.status = "new"  # registered, and no driver holds it yet
    return load_run(run.id)
