"""What a run needs before its next link: its data (found, or prepared, once; then pinned in the
run's config), the id of that data, the checkpoint it starts from, and the GPU quota the rest of
the run needs."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import checkpoint_meta, list_checkpoints, resolve_checkpoint
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


_verified: dict[str, tuple[int, int, dict]] = {}  # path -> (mtime_ns, size, source): hashed once


def source_checkpoint(run: Run) -> dict | None:
    """The checkpoint the run's next link starts from, verified against its sidecar: the run
    folder's newest (every link's is merged there), else the one a forked run started from."""
    found = list_checkpoints(run.folder / "checkpoints")
    if found:
        target = run.folder
    elif run.parent and run.parent.get("checkpoint"):
        target = Path(run.parent["checkpoint"])
    else:
        return None
    newest = found[-1] if found else target
    if newest.is_file():  # a waiting driver asks often: a checkpoint of gigabytes is hashed once
        st = newest.stat()
        hit = _verified.get(str(newest))
        if hit and hit[:2] == (st.st_mtime_ns, st.st_size):
            return dict(hit[2])
    try:
        path = resolve_checkpoint(target)
    except ValueError as e:
        raise UserError(f"run {run.id}: {e}") from None
    meta = checkpoint_meta(path)
    source = {"path": str(path), "name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
    st = path.stat()
    _verified[str(path)] = (st.st_mtime_ns, st.st_size, source)
    return dict(source)
