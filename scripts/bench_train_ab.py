#!/usr/bin/env python3
"""`lab train` tokens/s of this checkout against an earlier commit, in separate runs taken in turn; prints JSON.

    scripts/bench_train_ab.py --before 9c6a934 --size demo --rounds 3
    scripts/bench_train_ab.py --size d256 --after-args "--torch-compile on"

Both sides train the same size on the same prepared `pydoc` data (prepared on first use in
--home), as separate `lab train` processes, before, after, before, after, ... so a drifting
machine weighs on both. A run's speed is the median `tok_s` of its metrics rows after
--warmup steps, as `lab train` itself reports it; the run's last val loss is printed beside
it (the losses should agree up to floating-point noise, or the precision's noise where the
two sides train in different precisions: see device.json's `precision`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {  # the speed goals' two CPU sizes (the demo's learning rate), and a tiny one for the test
    "demo": "--context 128 --width 128 --heads 4 --layers 4 --batch-per-card 8 --steps-until 300 "
            "--warmup-steps 10 --lr 2e-3",
    "d256": "--context 256 --width 256 --heads 4 --layers 4 --batch-per-card 4 --steps-until 100 --warmup-steps 5",
    "tiny": "--context 32 --width 32 --heads 2 --layers 2 --batch-per-card 4 --steps-until 30 --warmup-steps 2",
}


def export_commit(rev: str, into: Path) -> Path:
    """The files of `rev` (no .git), from `git archive`."""
    archive = into / "before.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True)
    tree = into / "before"
    with tarfile.open(archive) as tar:  # our own repository's files; the filter where Python has it
        tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return tree


def prepared(home: Path) -> Path:
    env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    code = "from lab import corpus; print(corpus.find_prepared(['pydoc']) or corpus.prepare(['pydoc'], progress=False))"
    return Path(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                               text=True).stdout.strip().splitlines()[-1])


def train(tree: Path, data: Path, out: Path, args: list[str], warmup: int) -> dict:
    env = {**os.environ, "LAB_HOME": str(out.parent / "home"), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "lab.cli", "train", "--data-dir", str(data), "--out", str(out), *args,
           "--eval-every", "100000", "--limit-min", "60"]
    # Run from the tree itself: `python -m` puts the working folder first on the path.
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"lab train failed in {tree}:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["tok_s"] for r in rows if r.get("tok_s") and r["step"] > warmup]
    device = json.loads((out / "device.json").read_text())
    return {"tok_s": round(statistics.median(rates)), "val_loss": [r for r in rows if "val_loss" in r][-1]["val_loss"],
            "precision": device["precision"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="9c6a934", help="the commit to compare with (default: the loop before the speed work)")
    p.add_argument("--size", default="demo", choices=sorted(SIZES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the median")
    p.add_argument("--after-args", default="", help="extra `lab train` flags for this checkout, e.g. '--torch-compile on'")
    p.add_argument("--home", default=None, help="lab home for the prepared data (default: a temporary one)")
    a = p.parse_args()
    size = shlex.split(SIZES[a.size])
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        tmp = Path(tmp)
        data = prepared(Path(a.home) if a.home else tmp / "home")
        before = export_commit(a.before, tmp)
        sides = {"before": (before, size), "after": (ROOT, size + shlex.split(a.after_args))}
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for i in range(a.rounds):
            for name, (tree, args) in sides.items():
                runs[name].append(train(tree, data, tmp / f"{name}-{i}", args, a.warmup))
                print(f"round {i + 1} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    med = {name: statistics.median(r["tok_s"] for r in rs) for name, rs in runs.items()}
    print(json.dumps({"size": a.size, "flags": SIZES[a.size], "before": a.before, "after_args": a.after_args,
                      "cpu_threads": os.cpu_count(), **runs, "median_tok_s": med,
                      "after_over_before": round(med["after"] / med["before"], 3)}))


if __name__ == "__main__":
    main()
