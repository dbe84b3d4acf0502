#!/usr/bin/env python3
"""How far the calculator's speed is from the run that follows, as a lab meets it: prints a table.

    scripts/bench_estimates.py                       # fp32 and bf16, 3 rounds
    scripts/bench_estimates.py --precision bf16 --rounds 5 --keep /tmp/bench-est
    scripts/bench_estimates.py --from /tmp/bench-est   # the table again from kept runs

Each round trains every size below with `lab train` in its own process on the embedded pydoc
data, one after another (so a drifting, shared machine weighs on all of them). A run's speed
is the kit's own: the median tok_s of its metrics after the warm-up (lab.sizing.speeds). Then,
within each round, the calculator (lab.sizing.estimate, on the cpu card in that precision)
predicts every other size from the base run alone, and from the base run and the second one,
as a lab's form would after one and after two measured runs; the table shows the medians
over rounds, each error with its spread. The old rule (one run's FLOP rate carried over by
FLOPs per token) is shown beside them, as is the whole run's predicted time against the
process's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.config import RunConfig, flops_per_token  # noqa: E402

# (name, layers, width, heads, context, batch_per_card): a base, what a lab changes next, and
# the size of issue 22's miss (6 layers, d 192, n 256, batch 4 after the demo's run).
SIZES = [("base", 4, 128, 4, 128, 8), ("second", 6, 192, 6, 256, 4), ("deeper", 8, 128, 4, 128, 8),
         ("wider", 4, 256, 8, 128, 8), ("longer n", 4, 128, 4, 512, 2), ("batch 32", 4, 128, 4, 128, 32)]
FIRST, SECOND = "base", "second"


def size_cfg(size: tuple, precision: str, steps: int) -> RunConfig:
    _, layers, width, heads, context, batch = size
    return RunConfig(gpu="cpu", machine="local", layers=layers, width=width, heads=heads, context=context,
                     batch_per_card=batch, steps_until=steps, precision=precision, eval_every=100_000,
                     warmup_steps=10, limit_min=60, torch_compile="off")


def prepared(home: Path) -> Path:
    env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    code = "from lab import corpus; print(corpus.find_prepared(['pydoc']) or corpus.prepare(['pydoc'], progress=False))"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def train(home: Path, data: Path, name: str, cfg: RunConfig) -> float:
    """One `lab train` into home/runs/<name>; returns its wall seconds."""
    out = home / "runs" / name
    flags = []
    for field in ("layers", "width", "heads", "context", "batch_per_card", "steps_until", "precision",
                  "eval_every", "warmup_steps", "limit_min", "torch_compile"):
        flags += [f"--{field.replace('_', '-')}", str(getattr(cfg, field))]
    env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "lab.cli", "train", "--data-dir", str(data), "--out", str(out),
                           "--gpu", "cpu", *flags], env=env, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"lab train failed for {name}:\n{proc.stderr[-2000:]}")
    wall = time.monotonic() - t0
    (out / "wall.json").write_text(json.dumps({"wall_s": wall}))
    return wall


def measure(home: Path, data: Path, precisions: list[str], rounds: int, steps: int, quiet: float | None) -> None:
    from bench_prior import wait_for_quiet  # beside this script
    for r in range(rounds):
        for precision in precisions:
            for size in SIZES:
                name = run_name(size[0], precision, r)
                if not (home / "runs" / name / "wall.json").exists():
                    load = wait_for_quiet(quiet)
                    wall = train(home, data, name, size_cfg(size, precision, steps))
                    print(f"  round {r + 1}: {precision} {size[0]:<9} {wall:5.0f} s (load {load:.1f} at its start)",
                          file=sys.stderr, flush=True)


def run_name(size: str, precision: str, r: int) -> str:
    return f"{size.replace(' ', '-')}-{precision}-r{r}"


def predictions(home: Path, precision: str, r: int, steps: int) -> list[dict]:
    """For each size: measured tokens/s, and predicted from one and from two measured runs."""
    os.environ["LAB_HOME"] = str(home)
    from lab import sizing
    runs = {m.run: m for m in sizing.measured_runs("cpu", root=home / "runs")}
    first, second = runs[run_name(FIRST, precision, r)], runs[run_name(SECOND, precision, r)]
    out = []
    for size in SIZES:
        cfg = size_cfg(size, precision, steps)
        m = runs[run_name(size[0], precision, r)]
        one = sizing.estimate(cfg, manifest={}, runs=[first])
        two = sizing.estimate(cfg, manifest={}, runs=[first, second])
        rule = first.tok_s * first.flops_per_token() / flops_per_token(cfg.layers, cfg.width, m.vocab, cfg.context)
        wall = json.loads((home / "runs" / m.run / "wall.json").read_text())["wall_s"]
        out.append({"size": size[0], "measured": m.tok_s, "one": one.tok_s.value, "two": two.tok_s.value,
                    "one_interval": one.tok_s.extra.get("interval"), "rule": rule,
                    "time_pred_s": two.run_hours.value * 3600, "wall_s": wall})
    return out


def table(home: Path, precisions: list[str], rounds: int, steps: int) -> str:
    lines = []
    for precision in precisions:
        per_round = [predictions(home, precision, r, steps) for r in range(rounds)]
        lines += [f"\n{precision} ({rounds} rounds; medians, errors as predicted/measured − 1, [min, max] over rounds)",
                  f"{'size':<10} {'measured tok/s':>16} {'from one':>9} {'err':>5} {'[spread]':>13} "
                  f"{'from two':>9} {'err':>5} {'[spread]':>13} {'old rule':>6} {'time pred/wall':>15}"]
        for i, size in enumerate(SIZES):
            rows = [pr[i] for pr in per_round]
            meas = [x["measured"] for x in rows]
            e1 = [x["one"] / x["measured"] - 1 for x in rows]
            e2 = [x["two"] / x["measured"] - 1 for x in rows]
            er = [x["rule"] / x["measured"] - 1 for x in rows]
            tt = [x["time_pred_s"] / x["wall_s"] - 1 for x in rows]
            two = "measured" if size[0] in (FIRST, SECOND) else f"{statistics.median(x['two'] for x in rows):9,.0f}"
            lines.append(
                f"{size[0]:<10} {statistics.median(meas):8,.0f} ±{_spread(meas):3.0%}  "
                f"{statistics.median(x['one'] for x in rows):9,.0f} {statistics.median(e1):+5.0%} {_range(e1):>13} "
                f"{two:>9} {statistics.median(e2):+5.0%} {_range(e2):>13} {statistics.median(er):+6.0%} "
                f"{statistics.median(tt):+15.0%}")
    return "\n".join(lines)


def _spread(values: list[float]) -> float:
    """Half the range over the median: how much one measurement of the same size moved."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def _range(errors: list[float]) -> str:
    return f"[{min(errors):+.0%}, {max(errors):+.0%}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=160, help="steps per run (the first 20 are the warm-up)")
    p.add_argument("--keep", metavar="DIR", help="keep the lab home with the runs here (resumable)")
    p.add_argument("--from", dest="source", metavar="DIR", help="only print the table from a kept DIR")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the runs and the calculator (default: torch's own choice). On a "
                        "machine shared with other work, 2 threads per run measure the others' load more than the "
                        "run (one 512² matrix product here: 14 GFLOP/s on 2 threads under load, 150 on 1)")
    p.add_argument("--quiet", type=float, metavar="LOAD",
                   help="before each run, wait (up to 10 min) until the 1-minute load average is at most LOAD")
    a = p.parse_args()
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the runs inherit it; the calculator reads it
    precisions = a.precision.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-est-") as tmp:
        home = Path(a.source or a.keep or tmp)
        if not a.source:
            home.mkdir(parents=True, exist_ok=True)
            measure(home, prepared(home), precisions, a.rounds, a.steps, a.quiet)
        print(f"machine: {os.cpu_count()} CPU(s), runs on {os.environ.get('OMP_NUM_THREADS') or 'all'} thread(s), "
              f"load average {os.getloadavg()[0]:.1f} at the end")
        print(table(home, precisions, a.rounds, a.steps))


if __name__ == "__main__":
    main()
