"""A run settled once, where it is registered: the fields a person gave, where it starts and the
machine, made into one frozen record (`lab.runs.Settled`) that the run carries whole from then on.

    preview(given, resume, machine)       the run these fields describe and what is wrong with where
                                          it starts: the form and `lab size` size exactly this run
    register_run(given, resume, machine)  the preview checked and recorded (nothing runs yet): the
                                          form's Start, `lab run`, `lab branch` and `lab sweep` all
                                          come through here
    start_point(resume)                   the run continued, or the checkpoint a new run starts from
    grow (lab.settle.grow)                more steps for a run that has decayed: from its stable phase,
                                          or re-warmed, never a jump to the peak rate

The checkpoint merge happens here, once, on the control side: the run's fields as they were (the
run's own record when the same run goes on; the checkpoint's config when a new run starts from
one), with the fields given now on top and the model fields locked to the checkpoint's. `lab train
--resume` settles its flags the same way (`preview`), without a record. After this nothing merges
or guesses: a link's session gets the config as it is, and checks it against the data and the
checkpoint it opens.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from lab.config import (MODEL_FIELDS, SESSION_FIELDS, Problem, RunConfig, UserError, check, check_resume,
                        field_names, raise_on_errors)
from lab.kernel.checkpoint import (CheckpointError, checkpoint_meta, checkpoint_step, list_checkpoints,
                                   resolve_checkpoint, sha256_file)
from lab.machines import registry
from lab.machines.control import cancel_flag, driver_alive
from lab.machines.needs import data_problems, found_data
from lab.runs import Run, Settled, Start, create_run, load_run, updating
from lab.settle.grow import GrowPlan, grow_plan
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
        return {"run": self.saved_by(), "checkpoint": str(self.checkpoint), "step": self.meta["step"]}

    def saved_by(self) -> str | None:
        if self.checkpoint is None:
            return None
        ckpt = self.checkpoint
        owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
        return owner.name if (owner / "run.json").is_file() else None

    def start(self) -> Start:
        if self.meta is None or self.checkpoint is None:
            return Start()
        return Start(str(self.checkpoint), int(self.meta["step"]), self.meta.get("sha256"), self.saved_by())


@dataclass(frozen=True)
class Preview:
    """The run some fields describe, as it would be registered: its settled record, what is wrong
    with where it starts (the checkpoint, its locked fields, steps_until against its step) and
    with its data, the checkpoint's sidecar as the calculator reads it, and how a run that had
    decayed grows (`grown`: from its stable phase, or re-warmed; its words go beside the field)."""
    settled: Settled
    problems: list[Problem] = field(default_factory=list)
    checkpoint: dict | None = None  # {"step", "config", "path"}
    point: StartPoint = StartPoint()
    grown: GrowPlan | None = None

    @property
    def cfg(self) -> RunConfig:
        return self.settled.cfg


def start_point(resume: str | None, verify: bool = True) -> StartPoint:
    """The start point of a resume given as a run id, a run folder or a checkpoint file. A run
    continued before it saved any checkpoint goes on from its start. `verify`: the checkpoint's
    sha256 checked against its sidecar (registration does; a preview on every keystroke reads the
    newest sidecar only, and the loop verifies what it loads)."""
    if not resume:
        return StartPoint()
    path = Path(resume).expanduser()
    run = None
    if not path.exists() and (path.is_absolute() or len(path.parts) > 1 or path.suffix == ".pt"):
        raise UserError(f"no finished checkpoint at {resume}: give a ckpt_*.pt file, a run folder that has one, or "
                        "a run id (`lab runs` lists them)",
                        ru=f"по пути {resume} нет готового чекпоинта: укажите файл ckpt_*.pt, папку прогона с ним "
                           "или номер прогона")
    if not path.exists():
        run = load_run(resume)
        path = run.folder
    elif (path / "run.json").is_file():
        run = load_run(str(path))
    if run is not None and not (list_checkpoints(path / "checkpoints") or list_checkpoints(path)):
        return StartPoint(run)
    try:
        ckpt = resolve_checkpoint(path) if verify else newest_with_sidecar(path)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    return StartPoint(run, ckpt, checkpoint_meta(ckpt))


def newest_with_sidecar(target: Path) -> Path:
    """The checkpoint file `target` names, or the newest in the folder whose save finished (its
    sidecar written), without hashing it."""
    if target.is_file():
        found = [target] if target.with_suffix(".json").is_file() else []
    else:
        found = [p for p in list_checkpoints(target) or list_checkpoints(target / "checkpoints")
                 if p.with_suffix(".json").is_file()]
    if not found:
        raise CheckpointError(f"no finished checkpoint at {target}: give a ckpt_*.pt file or a run folder that has one")
    return found[-1]


def _as_it_was(point: StartPoint) -> dict:
    """The fields a run has before anything is given now: the run's own (its data pinned) when it
    goes on, the checkpoint's run's when a new run starts from one (where it ran and what it read
    stay behind), else none (the defaults)."""
    if point.run is not None:
        return {**point.run.cfg.to_dict(), "resume_from": ""}
    if point.meta is not None:
        names = set(field_names())
        return {k: v for k, v in (point.meta.get("config") or {}).items() if k in names and k not in SESSION_FIELDS}
    return {}


def _config(given: dict, point: StartPoint) -> tuple[RunConfig, list[Problem]]:
    """The fields merged with the run as it was, the model fields locked to the checkpoint's, and
    what is wrong with where it starts."""
    cfg = RunConfig.from_dict({**_as_it_was(point), **given})
    if point.meta is None:
        return cfg, []
    theirs = point.meta.get("config") or cfg.model_dict()  # a checkpoint with no config locks nothing
    problems = check_resume(cfg, theirs, int(point.meta["step"]), set(given) & set(MODEL_FIELDS))
    return replace(cfg, **{name: theirs.get(name, getattr(cfg, name)) for name in MODEL_FIELDS}), problems


def _grown(cfg: RunConfig, point: StartPoint, verify: bool,
           given: frozenset = frozenset()) -> tuple[RunConfig, StartPoint, GrowPlan | None]:
    """A run given more steps than its schedule had: it grows as `grow_plan` says (from the last
    checkpoint of its stable phase, or re-warmed from its newest), never jumping back to the peak
    rate. Growing from the stable phase of a run that goes on makes it a new run from that
    checkpoint (a child, as a cooldown branch is): its own folder holds none of the old decay's.
    A schedule given with its decay's step (a cooldown branch's, a stage of a plan) is taken as
    given; of the plan's other fields, the ones `given` names stay as given."""
    if point.meta is None or point.checkpoint is None or ("decay_start" in given and cfg.decay_start > 0):
        return cfg, point, None
    old = RunConfig.from_dict({**cfg.to_dict(), **_as_it_was(point)})  # the run as it was, its fields
    step = int(point.meta["step"])
    if cfg.steps_until <= old.steps_until or cfg.steps_until <= step:
        return cfg, point, None
    # Its checkpoints up to the one it starts from: the run's own, or the picked one's siblings.
    kept = list_checkpoints(point.run.folder / "checkpoints") if point.run is not None else \
        [p for p in list_checkpoints(point.checkpoint.parent) if checkpoint_step(p) <= step] or [point.checkpoint]
    plan = grow_plan(kept, old, cfg.steps_until, verify)
    if plan.checkpoint != point.checkpoint:
        point = StartPoint(None, plan.checkpoint, checkpoint_meta(plan.checkpoint))
    return replace(cfg, **{k: v for k, v in plan.fields.items() if k not in given or k == "steps_until"}), point, plan


def preview(given: dict, resume: str | None = None, machine: str | None = None, verify: bool = False) -> Preview:
    """The run the fields `given` describe (name -> value: the form's fields, a command's flags and
    config file) from `resume` (else `given["resume_from"]`: a run id or folder, whose run goes on,
    or a checkpoint, which a new run starts from; none: from scratch) on `machine` (else
    `given["machine"]`), as `register_run` would record it. Raises ConfigError only for a value
    that is not of its field's type, UserError for a run or checkpoint that is not there.
    `verify` (registration): the checkpoint's sha256 checked, and the data found and pinned when
    it is prepared (a preview leaves both to the calculator, which reads the manifest)."""
    point = start_point(resume or given.get("resume_from") or None, verify)
    given = {name: value for name, value in given.items() if name != "resume_from"}
    if machine is not None:
        given["machine"] = machine
    cfg, problems = _config(given, point)
    if not problems:
        cfg, point, grown = _grown(cfg, point, verify, frozenset(given))
    else:
        grown = None
    sha = None
    data = found_data(cfg) if verify else None  # finding it hashes the sources: registration does, once
    if data is not None and (data / "manifest.json").is_file():  # prepared: pinned now
        cfg, sha = replace(cfg, data_dir=str(data)), sha256_file(data / "manifest.json")
    settled = Settled(cfg, frozenset(given), point.start(), cfg.machine or "auto", sha)
    problems = problems + registry.limits(cfg)  # what its machine's sessions allow (Kaggle's 12 hours ...)
    if grown is not None:  # said beside "Steps until": which way the run grows
        problems = problems + [Problem("steps_until", grown.words_en, grown.words_ru, severity="note")]
    ckpt = None if point.meta is None else {"step": int(point.meta["step"]), "config": point.meta.get("config") or {},
                                             "path": str(point.checkpoint)}
    return Preview(settled, problems, ckpt, point, grown)


def check_machine(machine: str | None) -> str:
    """"auto", or a machine of the lab that can be used now (a Kaggle account answers with its
    credentials)."""
    name = (machine or "auto").strip()
    if name != "auto":
        registry.host_for(name).check()
    return name


def checked(pv: Preview) -> list[Problem]:
    """Every problem with the previewed run that keeps it from being registered, raised; returns
    the warnings: where it starts, its fields, and the context against its pinned data."""
    cfg = pv.cfg
    problems = pv.problems + check(cfg)
    if cfg.data_dir:
        problems += data_problems(cfg, Path(cfg.data_dir))
    return raise_on_errors(problems)


def register_run(given: dict, resume: str | None = None, machine: str | None = None,
                 warn: Callable[[Problem], None] | None = None) -> Run:
    """Registers the run the fields `given` describe (`preview`; nothing runs yet) and returns it.
    The machine is checked before anything is recorded; `warn` is told each warning."""
    pv = preview(given, resume, machine, verify=True)
    warnings = checked(pv)
    settled = pv.settled
    check_machine(settled.machine)
    for problem in warnings if warn is not None else ():
        warn(problem)
    run = create_run(settled, parent=pv.point.parent()) if pv.point.run is None else _going_on(pv.point.run, settled)
    _predict(run, settled)
    return run


def _predict(run: Run, settled: Settled) -> None:
    """What the calculator says of this run now, before it measures itself: `lab runs`, the runs
    panel and `lab size --calibration` set it beside the speed the run then measures. Every way a
    run is made comes through `register_run`, so every run has it."""
    cfg = settled.cfg
    record_prediction(run.folder, cfg)  # on the card it is sized for
    cards = registry.host_for(settled.machine).cards() if settled.machine != "auto" else None
    if cards and cards != cfg.gpu:  # and on its machine's, where it will train
        record_prediction(run.folder, cfg, gpu=cards)


def _going_on(run: Run, settled: Settled) -> Run:
    """Readies `run` to go on as `settled`. A person asked to go on, so an earlier cancel is
    forgotten here, before any driver starts: a cancel given after this, even before the driver
    holds the run, is kept."""
    if driver_alive(run.id):
        raise UserError(f"run {run.id} is running now: wait for it to end, or `lab cancel {run.id}` first",
                        ru=f"прогон {run.id} сейчас идёт: дождитесь его конца или сначала остановите его")
    cancel_flag(run.id).unlink(missing_ok=True)
    with updating(run.id) as r:
        r.settled = settled
        r.status = "new"  # registered, and no driver holds it yet
    return load_run(run.id)
