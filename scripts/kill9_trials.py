#!/usr/bin/env python3
"""kill -9 at random moments while a tiny GPT trains with a checkpoint every step.

After each kill a plain resume (no flag) must continue from the newest whole checkpoint, which
must verify and load; leftovers of the interrupted save are allowed (the next save removes them)
but must never be taken for a checkpoint. At the end the curve is compared with an uninterrupted
run's: equal losses at every step mean each resume continued exactly. Prints the figures.

    python scripts/kill9_trials.py --trials 200 [--data DIR] [--seed 0]

Each trial is a process forked from a forkserver that has torch imported already, so a trial
costs milliseconds to start, not the seconds of a fresh interpreter. The test suite runs
`run_trials` with fewer trials (tests/kernel/test_checkpoint.py).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TINY = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=25, eval_batches=2, lr=3e-3,
            warmup_steps=2, steps_until=1_000_000, checkpoint_every_min=0, limit_min=600, seed=3, torch_compile="off",
            constellations=["pydoc"])


def _train_until_killed(cfg: dict, data_dir: str, out: str, training) -> None:
    """The trial: a plain resume from the run folder when it has a checkpoint, else a fresh start.
    `training` is set at the loop's first log line, so a kill's moment is counted from there."""
    import torch
    from lab.config import RunConfig
    from lab.kernel.checkpoint import list_checkpoints
    from lab.kernel.train import train
    torch.set_num_threads(1)
    resume = out if list_checkpoints(Path(out) / "checkpoints") else None
    train(RunConfig.from_dict(cfg), out, data_dir, resume=resume, log=lambda s: training.set())


def _losses(out: Path) -> dict[int, float]:
    from lab.kernel.metrics import read_metrics
    return {r["step"]: r["loss"] for r in read_metrics(out) if "loss" in r}


def run_trials(trials: int, data_dir: str | os.PathLike, out: str | os.PathLike, seed: int = 0,
               window_s: tuple[float, float] = (0.05, 0.35)) -> dict:
    """`trials` kills at random moments of one run in `out`; returns the figures."""
    from lab.kernel.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, resolve_checkpoint, \
        verify_checkpoint
    out, rng = Path(out), random.Random(seed)
    ctx = multiprocessing.get_context("forkserver")
    # The optimizer imports torch._dynamo on first use (seconds): the forkserver pays that once.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "lab.kernel.train"])
    figures = {"trials": 0, "plain_resumes": 0, "needed_flag": 0, "corrupt": 0, "leftovers_seen": 0,
               "child_errors": 0, "steps": []}
    last_step, started = 0, time.monotonic()
    for i in range(trials):
        training = ctx.Event()
        child = ctx.Process(target=_train_until_killed, args=(TINY, str(data_dir), str(out), training))
        child.start()
        # The random moment is counted from the loop's start: on a loaded machine a child may
        # spend the whole window starting up, and the run would never move on.
        training.wait(timeout=120)
        # Every tenth kill (the first included: a run killed earlier has none to resume) waits for a
        # checkpoint newer than the last: on a loaded machine each random moment may fall before
        # the next save, and the run would never move on.
        if i % 10 == 0:
            while _newest_step(out / "checkpoints") <= last_step and child.is_alive():
                time.sleep(0.01)
        time.sleep(rng.uniform(*window_s))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        figures["trials"] += 1
        if child.exitcode != -signal.SIGKILL:
            figures["child_errors"] += 1
        folder = out / "checkpoints"
        committed = set(list_checkpoints(folder))
        figures["leftovers_seen"] += sum(1 for p in folder.iterdir() if p not in committed
                                         and p.with_suffix(".pt") not in committed)
        try:
            path = resolve_checkpoint(out)
        except CheckpointError:
            figures["needed_flag"] += 1
            continue
        figures["plain_resumes"] += 1
        step = int(load_checkpoint(path)["step"]) if verify_checkpoint(path) is None else -1
        if step < last_step:
            figures["corrupt"] += 1
        last_step = max(step, last_step)
        figures["steps"].append(step)
    figures["final_step"] = last_step
    figures["seconds_killing"] = round(time.monotonic() - started, 1)
    figures["curve_exact"] = _curve_matches_uninterrupted(out, data_dir, last_step)
    figures["seconds_comparing"] = round(time.monotonic() - started - figures["seconds_killing"], 1)
    return figures


def _newest_step(folder: Path) -> int:
    """The step of the newest committed checkpoint in `folder`, 0 when there is none."""
    from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
    return max(map(checkpoint_step, list_checkpoints(folder)), default=0)


def _curve_matches_uninterrupted(out: Path, data_dir, upto: int) -> bool:
    """Equal losses at every step up to `upto` with a run that was never killed (the same
    config, stepped here without saving)."""
    from lab.config import RunConfig
    from lab.kernel.train import Trainer
    with tempfile.TemporaryDirectory() as ref:
        trainer = Trainer(RunConfig.from_dict(TINY), ref, data_dir, log=lambda s: None)
        reference = {step: trainer.train_step()[0].item() for step in range(1, upto + 1)}
    killed = {s: v for s, v in _losses(out).items() if s <= upto}
    return killed == reference


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", help="a prepared data folder (default: the pydoc constellation, prepared if needed)")
    a = p.parse_args()
    data = a.data
    if not data:
        from lab import corpus
        data = corpus.find_prepared(["pydoc"]) or corpus.prepare(["pydoc"], vocab=512, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        figures = run_trials(a.trials, data, Path(tmp) / "run", seed=a.seed)
        figures["seconds"] = round(time.monotonic() - t0, 1)
    figures["steps"] = f"{figures['steps'][:3]} ... {figures['steps'][-3:]}"
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
