"""What a run needs before its next link: its data (found or prepared once, then pinned), the checkpoint
it starts from, and the hours the rest of the run needs. After a link, the next plan on its machine (Auto's reason,
the quota it counts) uses the speed the run's own session measured there rather than the calculator's guess; a
Kaggle session far slower than the run's others (without its cards, a slow host) is flagged: it burns an hour of
quota for what the others train in minutes."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from lab import corpus, sizing
from lab.config import Problem, RunConfig, UserError, check_against_data, raise_on_errors
from lab.corpus.manifests import data_id_of, read_manifest
from lab.kernel.checkpoint import checkpoint_meta, list_checkpoints, resolve_checkpoint, sha256_file
from lab.kernel.metrics import read_metrics
from lab.runs import Link, Run, load_run, updating
from lab.sizing.runtime import kaggle_session_costs


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
    return Path(cfg.data_dir) if cfg.data_dir else corpus.find_prepared(cfg.constellations)


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


SLOW = 0.4  # a session below this share of the run's typical speed on Kaggle is flagged
WARMUP_ROWS = 3  # a session's first logged steps include its compile and start: not its pace
MIN_ROWS = 3


def link_speed(rows: list[dict], link: Link) -> float | None:
    """The median tokens/s the link's session logged after its first few steps (None: too few)."""
    end = link.to_step if link.to_step is not None else float("inf")
    mine = [r["tok_s"] for r in rows if isinstance(r.get("tok_s"), (int, float)) and r.get("tok_s") > 0
            and "loss" in r and link.from_step < r.get("step", 0) <= end][WARMUP_ROWS:]
    return float(statistics.median(mine)) if len(mine) >= MIN_ROWS else None


def _speeds(run: Run) -> list[tuple[Link, float]]:
    rows = read_metrics(run.folder)
    return [(link, s) for link in run.links if link.to_step is not None and (s := link_speed(rows, link))]


def measured_on(run: Run) -> dict[str, float]:
    return {link.machine: s for link, s in _speeds(run)}


def hours_on(run: Run, machine: str, tok_s: float, kaggle: bool) -> float | None:
    """The rest of the run on `machine` at `tok_s`, with its session's start (as a Kaggle account measured it)."""
    rows = [r for r in read_metrics(run.folder) if isinstance(r.get("tokens"), (int, float)) and r.get("step")]
    per_step = rows[-1]["tokens"] / rows[-1]["step"] if rows else None
    if not per_step:
        return None
    left = max(0, run.cfg.steps_until - run.step) * per_step / tok_s
    start = kaggle_session_costs(machine).start_s if kaggle else 0.0
    return (left + start) / 3600


@dataclass(frozen=True)
class Slow:
    link: int
    machine: str
    tok_s: float
    typical: float

    def words(self, ru: bool = False) -> str:
        if ru:
            return (f"звено {self.link} на {self.machine} шло со скоростью {_n(self.tok_s, True)} ток/с, намного "
                    f"медленнее других сессий прогона ({_n(self.typical, True)}): оно тратит квоту зря")
        return (f"link {self.link} on {self.machine} trained at {_n(self.tok_s)} tok/s, far slower than the run's "
                f"other sessions ({_n(self.typical)}): it spends quota for little")


def slow_links(run: Run) -> list[Slow]:
    """The run's Kaggle links that trained below `SLOW` of the median of its other Kaggle links."""
    found = [(link, s) for link, s in _speeds(run) if link.kind == "kaggle"]
    typical = [(link, speed, statistics.median(others)) for link, speed in found  # a lone link has no others
               if (others := [s for other, s in found if other.n != link.n])]
    return [Slow(link.n, link.machine, speed, median) for link, speed, median in typical if speed < SLOW * median]


def _n(x: float, ru: bool = False) -> str:
    text = f"{x:,.0f}"
    return text.replace(",", "\u00a0") if ru else text
