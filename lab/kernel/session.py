"""One training session as the notebook runs it: find inputs, launch, draw the plot.

The same code runs on Kaggle and on a member's computer. On Kaggle the inputs are
mounted under `$LAB_KAGGLE_ROOT/input` (default `/kaggle/input`) in one of two layouts,
so data and checkpoints are searched for; outputs go to `$LAB_KAGGLE_ROOT/working`.
With two or more GPUs the loop runs under torchrun (DDP) from a script the notebook
wrote, because notebook-defined code cannot be pickled into spawned workers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.kernel.checkpoint import INPUT_NOT_READY, CheckpointError, list_checkpoints, resolve_checkpoint, sha256_file
from lab.config import RunConfig
from lab.kernel.data import find_data
from lab.kernel.metrics import read_metrics
from lab.kernel.plots import figure_png, loss_figure, save_loss_plot
from lab.kernel.train import train


def kaggle_root() -> Path:
    return Path(os.environ.get("LAB_KAGGLE_ROOT", "/kaggle"))


def on_kaggle() -> bool:
    return (kaggle_root() / "input").is_dir()


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


def resolve_session(cfg: RunConfig, out_dir: str = "") -> SessionPaths:
    """Where this session reads data and a checkpoint, and where it writes."""
    roots = [kaggle_root() / "input"] if on_kaggle() else [Path.cwd()]
    if cfg.data_dir and Path(cfg.data_dir).is_dir():
        data = Path(cfg.data_dir)
    else:
        data = find_data(roots + ([Path(cfg.data_dir)] if cfg.data_dir else []), cfg.constellations)
    out = Path(out_dir) if out_dir else (kaggle_root() / "working" if on_kaggle() else Path.cwd() / "run")
    resume = find_checkpoint(cfg.resume_from, roots + [out]) if cfg.resume_from else None
    print(f"data       {data}\ncheckpoint {resume or '- (from scratch)'}\noutputs    {out}")
    return SessionPaths(data=data, out=out, resume=resume)


def inputs_as_sent(cfg: RunConfig, out_dir: str = "", data_sha256: str = "", ckpt_sha256: str = "") -> SessionPaths:
    """The session's paths, checked against the sha256 the control side sent for the data's
    manifest and the checkpoint (empty: not checked). A dataset READY on Kaggle may not be the
    one mounted yet: when an input is missing or another version, this leaves the marker
    `input-not-ready.json` in the outputs and stops the session before any training, so it
    never resumes from another checkpoint; the control side waits and pushes again."""
    if not data_sha256 and not ckpt_sha256:
        return resolve_session(cfg, out_dir)
    out = Path(out_dir) if out_dir else (kaggle_root() / "working" if on_kaggle() else Path.cwd() / "run")
    try:
        paths = resolve_session(cfg, out_dir)
        found = {"data": sha256_file(paths.data / "manifest.json") if data_sha256 else "",
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
    """The loss plot shown in the notebook, redrawn at most every `every_s` seconds."""

    def __init__(self, out: Path, every_s: float = 30.0, x: str = "step"):
        self.out, self.every_s, self.x, self.last = out, every_s, x, 0.0
        self.handle = None

    def update(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        rows = read_metrics(self.out)
        if not any("loss" in r for r in rows):
            return
        from IPython.display import Image, display
        image = Image(data=figure_png(loss_figure({self.out.name: rows}, x=self.x, title="loss")))
        if self.handle is None:
            self.handle = display(image, display_id=True)
        else:
            self.handle.update(image)


def gpus_for(cfg: RunConfig, nproc: int) -> int:
    if nproc:
        return nproc
    return torch.cuda.device_count() if cfg.parallel in ("auto", "ddp") else 1


def run_session(cfg: RunConfig, paths: SessionPaths, kernel_py: Path, nproc: int = 0,
                allow_fallback: bool = False, plot_every_s: float = 30.0, plot_x: str = "step",
                started: float | None = None) -> dict:
    """Trains in this process, or under torchrun with one process per GPU; writes
    `result.json` (where training stopped and why) beside the metrics."""
    plot = LivePlot(paths.out, plot_every_s, plot_x)
    procs = gpus_for(cfg, nproc)
    if procs > 1:
        result = _run_torchrun(cfg, paths, kernel_py, procs, allow_fallback, plot, started)
    else:
        result = train(cfg, paths.out, paths.data, resume=paths.resume, allow_fallback=allow_fallback,
                       on_metrics=lambda _: plot.update(), log=lambda s: print(s, flush=True), started=started)
    (paths.out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    plot.update(force=True)
    print(f"plot       {save_loss_plot(paths.out, x=plot_x)}")
    return result


def _run_torchrun(cfg, paths, kernel_py, procs, allow_fallback, plot, started) -> dict:
    paths.out.mkdir(parents=True, exist_ok=True)
    config_path = paths.out / "session-config.json"
    # The workers start their clock later: give them what is left of the session's limit.
    spent_min = (time.monotonic() - started) / 60 if started is not None else 0.0
    worker_cfg = RunConfig.from_dict({**cfg.to_dict(), "limit_min": max(cfg.limit_min - spent_min, 0.01)})
    config_path.write_text(worker_cfg.to_json(), encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           str(kernel_py), "--config", str(config_path), "--out", str(paths.out), "--data", str(paths.data)]
    if paths.resume:
        cmd += ["--resume", str(paths.resume)]
    if allow_fallback:
        cmd.append("--allow-fallback")
    print(f"launching {procs} processes under torchrun (DDP)", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    result = None
    try:
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
            else:
                print(line, end="", flush=True)
            plot.update()
    except KeyboardInterrupt:  # the notebook's stop button, or SIGINT: let the workers save
        proc.terminate()
    if proc.wait() != 0 or result is None:
        raise RuntimeError(f"training under torchrun failed (exit {proc.returncode}); its output is above")
    return result


def worker_main(argv: list[str] | None = None) -> None:
    """What each torchrun worker runs: the loop, with the config the notebook wrote."""
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--resume")
    p.add_argument("--allow-fallback", action="store_true")
    a = p.parse_args(argv)
    cfg = RunConfig.from_json_file(a.config)
    result = train(cfg, a.out, a.data, resume=a.resume, allow_fallback=a.allow_fallback,
                   log=lambda s: print(s, flush=True))
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result), flush=True)
