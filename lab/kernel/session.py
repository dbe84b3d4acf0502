"""One training session as the notebook runs it: its spec, its inputs, the launch, the plot.

The notebook's parameters are the link's spec (`lab.spec.LinkSpec`: the run's fields and this
session's own), built once. The same code runs on Kaggle and on a member's computer. On Kaggle
the inputs are mounted under `$LAB_KAGGLE_ROOT/input` (default `/kaggle/input`) in one of two
layouts, so data and checkpoints are searched for; outputs go to `$LAB_KAGGLE_ROOT/working`.
With two or more GPUs the loop runs under torchrun (DDP, through `launch`) from a script the
notebook wrote, because notebook-defined code cannot be pickled into spawned workers; the workers
read the same spec, with the paths found and what is left of the time limit, from a file. A
stopped or failed session ends the same way with one process or several: `result.json`, the
metrics and `loss.png` written, the newest checkpoint named.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.config import RunConfig
from lab.kernel.checkpoint import (INPUT_NOT_READY, CheckpointError, list_checkpoints, newest_whole_checkpoint,
                                   resolve_checkpoint, sha256_file)
from lab.kernel.data import MANIFEST, DataError
from lab.kernel.launch import Launched, Nodes, launch, report_result, reporting_failure, stop_file_from_env
from lab.kernel.metrics import METRICS, MetricsTail, read_metrics
from lab.kernel.plots import LiveCurve, figure_png, loss_figure, save_loss_plot
from lab.kernel.train import train
from lab.spec import LinkSpec

WORKER_SPEC = "worker-spec.json"  # in the outputs: the spec torchrun's workers train with


def kaggle_root() -> Path:
    return Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))


def on_kaggle() -> bool:
    return (kaggle_root() / "input").is_dir()


def output_dir(out_dir: str = "") -> Path:
    """Where this session writes: `out_dir`, else /kaggle/working on Kaggle, else ./run."""
    return Path(out_dir) if out_dir else (kaggle_root() / "working" if on_kaggle() else Path.cwd() / "run")


@dataclass
class SessionPaths:
    data: Path
    out: Path
    resume: Path | None


def find_checkpoint(name: str, roots: list[Path], max_depth: int = 5) -> Path:
    """`name` as a path, or a folder or file of that name under `roots` (a mounted dataset)."""
    direct = Path(name).expanduser()
    if direct.exists():
        return direct
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            here = Path(dirpath)
            if here.name == name and (list_checkpoints(here) or list_checkpoints(here / "checkpoints")):
                return here
            if name in filenames:
                return here / name
            if len(here.relative_to(root).parts) >= max_depth:
                dirnames.clear()
            dirnames.sort()
    raise CheckpointError(f"checkpoint {name!r} not found as a path nor under {', '.join(map(str, roots))}: "
                          f"attach the dataset that holds it")


def find_data(roots: list[str | os.PathLike], constellations: list[str], max_depth: int = 6) -> Path:
    """The prepared data folder under `roots` whose constellations are exactly these.

    Kaggle mounts inputs under /kaggle/input/datasets/<owner>/<slug>/ (older sessions:
    /kaggle/input/<slug>/), so the folder is searched for, not assumed.
    """
    wanted = sorted(constellations)
    seen = []
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for manifest in _manifests(root, max_depth):
            try:
                names = sorted(json.loads(manifest.read_text(encoding="utf-8"))["constellations"])
            except (OSError, ValueError, KeyError):
                continue
            seen.append((manifest.parent, names))
            if names == wanted:
                return manifest.parent
    found = "; ".join(f"{p} ({'+'.join(n)})" for p, n in seen) or "none"
    raise DataError(f"no prepared data for constellations {'+'.join(wanted)} under "
                    f"{', '.join(map(str, roots))} (found: {found}): run `lab prepare` for them")


def _manifests(root: Path, max_depth: int):
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        if MANIFEST in filenames:
            yield Path(dirpath) / MANIFEST
        if len(Path(dirpath).relative_to(root).parts) >= max_depth:
            dirnames.clear()
        dirnames.sort()


def resolve_session(spec: LinkSpec) -> SessionPaths:
    """Where this session reads its data and its checkpoint, and where it writes. The run's fields
    are as the control side settled them (every field sent): nothing here merges them with the
    checkpoint's; the loop, here or in the torchrun workers, checks them against what it opens."""
    roots = [kaggle_root() / "input"] if on_kaggle() else [Path.cwd()]
    given, out = spec.session, output_dir(spec.session.out_dir)
    resume = find_checkpoint(given.resume_from, roots + [out]) if given.resume_from else None
    if given.data_dir and Path(given.data_dir).is_dir():
        data = Path(given.data_dir)
    else:
        data = find_data(roots + ([Path(given.data_dir)] if given.data_dir else []), spec.run.constellations)
    print(f"data       {data}\ncheckpoint {resume or '- (from scratch)'}\noutputs    {out}")
    return SessionPaths(data=data, out=out, resume=resume)


def inputs_as_sent(spec: LinkSpec) -> SessionPaths:
    """The session's paths, checked against the sha256 the control side sent for the data's
    manifest and the checkpoint (empty: not checked). A dataset READY on Kaggle may not be the
    one mounted yet: when an input is missing or another version, this leaves the marker
    `input-not-ready.json` in the outputs and stops the session before any training, so it
    never resumes from another checkpoint; the control side waits and pushes again."""
    data_sha256, ckpt_sha256 = spec.session.expect_data_sha256, spec.session.expect_ckpt_sha256
    if not data_sha256 and not ckpt_sha256:
        return resolve_session(spec)
    out = output_dir(spec.session.out_dir)
    try:
        paths = resolve_session(spec)
        found = {"data": sha256_file(paths.data / MANIFEST) if data_sha256 else "",
                 "checkpoint": sha256_file(resolve_checkpoint(paths.resume)) if ckpt_sha256 and paths.resume else ""}
    except Exception as e:  # noqa: BLE001 - not found or unreadable: not mounted (yet)
        found, paths = {"error": f"{type(e).__name__}: {e}"}, None
    wrong = {k: v for k, v in (("data", data_sha256), ("checkpoint", ckpt_sha256)) if v and found.get(k) != v}
    if paths is not None and not wrong:
        return paths
    out.mkdir(parents=True, exist_ok=True)
    (out / INPUT_NOT_READY).write_text(json.dumps({"expected": wrong, "found": found}, indent=1), encoding="utf-8")
    raise RuntimeError(f"INPUT NOT READY: {', '.join(wrong) or 'inputs'} not as sent ({found}); "
                       "the control side pushes again")


class LivePlot:
    """The loss plot shown in the notebook, redrawn at most every `every_s` seconds. In a
    one-process session it is drawn inside the training process, so each redraw must stay
    cheap at any length of session: it reads only the rows written since the last one, and
    draws a curve thinned to a few thousand points (`LiveCurve`)."""

    def __init__(self, out: Path, every_s: float = 30.0, x: str = "step"):
        self.out, self.every_s, self.x, self.last = out, every_s, x, 0.0
        self.tail, self.curve, self.handle = MetricsTail(out / METRICS), LiveCurve(), None

    def update(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        rows, anew = self.tail.read()
        if anew:
            self.curve = LiveCurve()
        self.curve.add(rows)
        if not self.curve.train:
            return
        from IPython.display import Image, display  # IPython: only inside a notebook
        image = Image(data=figure_png(loss_figure({self.out.name: self.curve.rows()}, x=self.x, title="loss")))
        if self.handle is None:
            self.handle = display(image, display_id=True)
        else:
            self.handle.update(image)


def gpus_for(cfg: RunConfig, nproc: int) -> int:
    if nproc:
        return nproc
    return torch.cuda.device_count() if cfg.parallel in ("auto", "ddp") else 1


class TrainingFailed(RuntimeError):
    """Training stopped on an error; `result.json`, the metrics and the plot are written first."""


def run_session(spec: LinkSpec, paths: SessionPaths, kernel_py: Path, started: float | None = None) -> dict:
    """Trains as the spec says, in this process or under torchrun with one process per GPU (on a
    group of hosts, this host's part of the run), for the session's limit counted from `started`;
    writes `result.json` (where training stopped and why) beside the metrics, and the plot. A
    failed session writes them too, naming the newest checkpoint, then raises with the error."""
    given = spec.session
    spec = found_in(spec, paths)
    plot = LivePlot(paths.out, given.plot_every_s, given.plot_x)
    procs, nodes = gpus_for(spec.run, given.nproc), Nodes(given.nnodes, given.node_rank, given.rdzv_endpoint)
    if procs > 1 or nodes.count > 1:
        ended = _run_torchrun(spec, kernel_py, max(procs, 1), plot, started, nodes)
        if nodes.rank > 0 and ended.returncode == 0:  # the first host's rank 0 writes the run's files
            print(f"this host (node {nodes.rank} of {nodes.count}) trained its part; the first host has the "
                  "run's outputs", flush=True)
            return {"node_rank": nodes.rank, "nodes": nodes.count}
        if ended.failed:
            result = failed_result(paths.out, ended.failure_text())
            _write_outputs(paths.out, result, plot, given.plot_x)
            raise TrainingFailed(f"{ended.failure_text()}. Newest checkpoint: {result['checkpoint'] or 'none'}; "
                                 f"resume_from continues from it")
        result = ended.result
    else:
        try:
            result = train_link(spec, on_metrics=lambda _: plot.update(), log=lambda s: print(s, flush=True),
                                started=started)
        except Exception as e:  # the cell shows the traceback itself; the outputs say where the run stands
            if paths.out.is_dir():
                _write_outputs(paths.out, failed_result(paths.out, f"{type(e).__name__}: {e}"), plot, given.plot_x)
            raise
    _write_outputs(paths.out, result, plot, given.plot_x)
    return result


def found_in(spec: LinkSpec, paths: SessionPaths) -> LinkSpec:
    """The spec with the paths this session found: what its loop and its workers open."""
    return spec.with_session(data_dir=str(paths.data), out_dir=str(paths.out),
                             resume_from=str(paths.resume) if paths.resume else "")


def train_link(spec: LinkSpec, **kwargs) -> dict:
    """The loop of one link as its spec says: the run's fields; the session's data, checkpoint,
    outputs and time limit (its own, else the run's)."""
    given = spec.session
    return train(spec.run, given.out_dir, given.data_dir, resume=given.resume_from or None,
                 allow_fallback=given.allow_fallback, limit_min=spec.limit_min, **kwargs)


def failed_result(out: Path, error: str) -> dict:
    """What a failed session leaves: the newest whole checkpoint is where the run continues."""
    newest = newest_whole_checkpoint(out / "checkpoints")
    step = newest[1]["step"] if newest else 0
    return {"step": step, "tokens": newest[1].get("tokens") if newest else 0, "reason": f"failed: {error}",
            "checkpoint": str(newest[0]) if newest else None, "steps_until": None, "done": False,
            "failed": True}


def _write_outputs(out: Path, result: dict, plot: LivePlot, plot_x: str) -> None:
    (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    if not read_metrics(out):
        return
    plot.update(force=True)
    print(f"plot       {save_loss_plot(out, x=plot_x)}")


def _run_torchrun(spec: LinkSpec, kernel_py: Path, procs: int, plot: LivePlot, started: float | None,
                  nodes: Nodes) -> Launched:
    out = Path(spec.session.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # The workers start their clock later: give them what is left of the session's limit.
    spent_min = (time.monotonic() - started) / 60 if started is not None else 0.0
    (out / WORKER_SPEC).write_text(spec.with_session(limit_min=max(spec.limit_min - spent_min, 0.01)).to_json(),
                                   encoding="utf-8")
    group = f" on node {nodes.rank} of {nodes.count} (rendezvous {nodes.endpoint})" if nodes.count > 1 else ""
    print(f"launching {procs} processes under torchrun (DDP){group}", flush=True)
    ended = launch(procs, [str(kernel_py), "--spec", str(out / WORKER_SPEC)], on_tick=plot.update, nodes=nodes)
    for failure in ended.failures:
        print(f"rank {failure['rank']} failed: {failure['error']}", flush=True)
    return ended


def worker_main(argv: list[str] | None = None) -> None:
    """What each torchrun worker runs: the loop, with the spec the session wrote for its workers."""
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True, help="a link's spec, as JSON (lab.spec.LinkSpec)")
    spec = LinkSpec.from_json(Path(p.parse_args(argv).spec).read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    with reporting_failure(rank):
        result = train_link(spec, log=lambda s: print(s, flush=True), stop_file=stop_file_from_env())
    report_result(result, rank)
