"""What a run needs before its next link: its data (found, or prepared, once; then pinned in the
run's config), the id of that data, and the GPU quota the rest of the run needs."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from lab.config import RunConfig, UserError
from lab.runs import Run, load_run, updating


def need_hours(run: Run) -> float | None:
    """GPU quota the rest of the run needs, start-ups included (the calculator's figure)."""
    from lab import sizing
    cfg = run.cfg
    ckpt = {"step": run.step, "config": cfg.to_dict()} if run.step else None
    try:
        return sizing.estimate(cfg, checkpoint=ckpt).hours_to_finish
    except (UserError, ValueError):  # the rule works without it (most quota left)
        return None


def pin_data(run_id: str, say: Callable[[str], None]) -> None:
    """Every link of a run trains on the same prepared data: found (or prepared) once, then kept
    in the run's config. Text added to a constellation later is a new val set: a new run."""
    run = load_run(run_id)
    if run.cfg.data_dir:
        if not Path(run.cfg.data_dir).is_dir():
            raise UserError(f"run {run_id}: its data folder {run.cfg.data_dir} is gone: prepare it again "
                            f"(lab prepare), or continue with another data folder (lab run --resume {run_id} "
                            f"--data-dir DIR)")
        return
    found = prepared_data(run.cfg.constellations, say)
    with updating(run_id) as r:
        r.config = {**r.config, "data_dir": str(found)}


def prepared_data(constellations: list[str], say: Callable[[str], None], progress: bool = False) -> Path:
    """The data folder prepared for these constellations with their current text: found, or
    prepared now."""
    from lab import corpus
    corpus.get_constellations(constellations)
    found = corpus.find_prepared(constellations)
    if found is None:
        say(f"preparing the data for {'+'.join(constellations)}")
        found = corpus.prepare(constellations, progress=progress)
    return found


def data_id(cfg: RunConfig) -> str | None:
    """The id of the data the run trains on: its pinned folder, else the one prepared for its
    constellations (as `pin_data` will find it); None when there is none yet."""
    from lab.corpus.manifests import data_id_of
    try:
        if cfg.data_dir:
            return data_id_of(Path(cfg.data_dir))
        from lab import corpus
        found = corpus.find_prepared(cfg.constellations)
        return data_id_of(found) if found is not None else None
    except (UserError, OSError, ValueError):
        return None
