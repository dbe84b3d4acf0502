"""What a run needs before its next link: its data (found or prepared once, then pinned), the checkpoint
it starts from, and the hours the rest of the run needs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from lab import corpus, sizing
from lab.config import Problem, RunConfig, UserError, check_against_data, raise_on_errors
from lab.corpus.manifests import data_id_of, read_manifest
from lab.kernel.checkpoint import checkpoint_meta, list_checkpoints, resolve_checkpoint, sha256_file
from lab.machines.pace import hours_on
from lab.runs import Run, load_run, updating


def need_hours(run: Run) -> float | None:
    """GPU quota the rest of the run needs, start-ups included (the calculator's figure)."""
    est = _estimate(run.cfg, run.step)
    return None if est is None else est.hours_to_finish


def _estimate(cfg: RunConfig, step: int) -> sizing.Estimate | None:
    ckpt = {"step": step, "config": cfg.to_dict()} if step else None
    try:
        return sizing.estimate(cfg, checkpoint=ckpt)
    except (UserError, ValueError):  # the rule works without it (most quota left)
        return None


def finish_hours(cfg: RunConfig, step: int, machines: list, measured: dict[str, float] | None = None,
                 run: Run | None = None) -> dict[str, float | None]:
    """Hours the rest of a run takes on each machine elsewhere by the speed measured on its cards (None
    where the calculator has none; a cluster's with its queue's wait), where a box or a cluster is among
    them, and at the speed the run's own sessions measured there (`measured`): what Auto ranks by."""
    measured = measured or {}
    out: dict[str, float | None] = {}
    if any(m.kind in ("ssh", "slurm") for m in machines):
        out = {m.name: _hours_on(cfg, step, "2xT4" if m.kind == "kaggle" else m.gpu, m.name)
               for m in machines if m.kind in ("kaggle", "ssh", "slurm")}
    for m in machines:
        if run is not None and m.name in measured and m.kind in ("kaggle", "ssh", "slurm"):
            out[m.name] = hours_on(run, m.name, measured[m.name], kaggle=m.kind == "kaggle")
        if m.kind == "slurm" and out.get(m.name) is not None and m.wait_h:
            out[m.name] += m.wait_h  # a cluster's run starts when its queue lets it: the wait Slurm expects counts
    return out


def _hours_on(cfg: RunConfig, step: int, gpu: str, machine: str) -> float | None:
    est = _estimate(replace(cfg, gpu=gpu, machine=machine), step)
    return None if est is None or est.run_hours.value is None else float(est.run_hours.value)


def found_data(cfg: RunConfig) -> Path | None:
    if cfg.data_dir:
        return Path(cfg.data_dir)
    return corpus.find_prepared(cfg.constellations)


def find_data(cfg: RunConfig) -> Path:
    found = found_data(cfg)
    if found is None:
        flags = " ".join(f"-c {n}" for n in cfg.constellations)
        raise UserError(f"constellations {'+'.join(cfg.constellations)} are not prepared: run `lab prepare {flags}`")
    return found


def data_problems(cfg: RunConfig, folder: Path) -> list[Problem]:
    """What is wrong with the run's fields against its data: the context must fit in its shortest shard."""
    manifest = read_manifest(folder)
    shards = list(manifest.get("train") or []) + list(manifest.get("val") or [])
    if not shards:
        raise UserError(f"{folder} lists no train or no val shards: run `lab prepare` again")
    return check_against_data(cfg, min(int(s["tokens"]) for s in shards))


def pin_data(run_id: str, say: Callable[[str], None], progress: bool = False) -> None:
    """Every link of a run trains on the same data: found (or prepared) once, checked, then pinned in the
    run's settled record (its folder and manifest's sha256). Text added to a constellation later: a new run."""
    run = load_run(run_id)
    if run.cfg.data_dir:
        if not Path(run.cfg.data_dir).is_dir():
            raise UserError(f"run {run_id}: its data folder {run.cfg.data_dir} is gone: prepare it again "
                            f"(lab prepare), or continue with another data folder (lab run --resume {run_id} "
                            f"--data-dir DIR)",
                            ru=f"прогон {run_id}: его папки данных {run.cfg.data_dir} больше нет: подготовьте данные "
                               f"заново")
        return
    found = found_data(run.cfg)
    if found is None:
        say(f"preparing the data for {'+'.join(run.cfg.constellations)}")
        found = corpus.prepare(run.cfg.constellations, progress=progress)
    raise_on_errors(data_problems(run.cfg, found))
    with updating(run_id) as r:
        r.settled = r.settled.pinned(str(found), sha256_file(found / "manifest.json"))


def data_id(cfg: RunConfig) -> str | None:
    try:
        found = found_data(cfg)
        return data_id_of(found) if found is not None else None
    except (UserError, OSError, ValueError):
        return None


_verified: dict[str, tuple[int, int, dict]] = {}  # path -> (mtime_ns, size, source): hashed once


def source_checkpoint(run: Run) -> dict | None:
    """The checkpoint the next link starts from (the run's newest, or a fork's start), verified against its sidecar."""
    found = list_checkpoints(run.folder / "checkpoints")
    fork = run.parent.get("checkpoint") if run.parent else None
    if not found and not fork:
        return None
    target, newest = (run.folder, found[-1]) if found else (Path(fork), Path(fork))
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
