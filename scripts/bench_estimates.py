#!/usr/bin/env python3
"""How far the calculator's speed is from the run that follows, as a lab meets it: prints a table.

    scripts/bench_estimates.py --keep /tmp/bench-est     # the kit's own settings, 5 rounds (20 min here)
    scripts/bench_estimates.py --precision fp32 --rounds 3
    scripts/bench_estimates.py --from /tmp/bench-est                 # the table again from kept runs

Each round trains every size below with `lab train`'s own call in its own process on the embedded
pydoc data, one after another, each round starting one size further on, with the settings `lab run
--machine local` takes here: its precision ("auto": bf16 where the CPU multiplies it, else fp32)
and its threads (OMP_NUM_THREADS, else one per core). A run's speed is the kit's own: the median
tok/s of its metrics after the warm-up, wall-clock, as `lab runs` shows it (lab.sizing.speeds).
The calculator (lab.sizing.estimate, on the cpu card) then predicts every other size from the base
size's run alone, and from the base's and the second size's, as a lab's form would after one and
after two measured runs: per round from that round's runs (the error's range and whether the
measured speed fell inside the 95% interval: the coverage), and from each size's median over the
rounds. None of the sizes is on scripts/bench_prior.py's grid, which the prior was fitted to.
Beside them: the old rule (one run's FLOP rate carried over by FLOPs per token), and the whole
run's predicted time less a session's start against the training call's own seconds.
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

# (name, layers, width, heads, context, batch_per_card): the demo's run, what a lab changes next
# (issue 32's two misses: 6 layers d 192 n 256 batch 4, and 3 layers d 256), and sizes that move
# depth, width, context and batch on their own; none on bench_prior.py's grid (the base, the
# demo's size, is: it is measured, never predicted).
SIZES = [("base", 4, 128, 4, 128, 8), ("second", 6, 192, 6, 256, 4), ("3 x 256", 3, 256, 8, 128, 8),
         ("deeper", 8, 128, 4, 128, 8), ("wider", 4, 256, 8, 128, 8), ("longer n", 4, 128, 4, 512, 2),
         ("batch 24", 4, 128, 4, 128, 24), ("bigger", 6, 256, 8, 256, 4), ("shallow", 2, 192, 6, 64, 16)]
FIRST, SECOND = "base", "second"
GOAL = {"one": 0.25, "two": 0.10, "coverage": 0.90}  # issue 32's


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


# `lab train`'s own call (lab.cli.train.run -> lab.kernel.train.train), in its own process; the
# seconds of the call itself (the data, the model, the steps, evaluations and saves: what the
# calculator counts besides a session's start) go to own.json.
RUNNER = """
import json, sys, time
from lab.config import RunConfig
from lab.kernel.train import train
cfg, out, data = RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
t0 = time.monotonic()
result = train(cfg, out, data, log=lambda s: None)
open(out + "/own.json", "w").write(json.dumps({"train_call_s": time.monotonic() - t0, "result": result}))
"""


def train(home: Path, data: Path, name: str, cfg: RunConfig) -> float:
    """One training run into home/runs/<name>; returns its wall seconds."""
    out = home / "runs" / name
    env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", RUNNER, cfg.to_json(), str(out), str(data)], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"training failed for {name}:\n{proc.stderr[-2000:]}")
    wall = time.monotonic() - t0
    (out / "wall.json").write_text(json.dumps({"wall_s": wall}))
    return wall


def measure(home: Path, data: Path, precisions: list[str], rounds: int, steps: int, quiet: float | None) -> None:
    """Every size in every round; each round starts one size further on, so that no size is
    always the one measured right after a quiet (or a busy) spell."""
    from bench_prior import wait_for_quiet  # beside this script
    for r in range(rounds):
        for precision in precisions:
            for size in SIZES[r % len(SIZES):] + SIZES[:r % len(SIZES)]:
                name = run_name(size[0], precision, r)
                if not (home / "runs" / name / "wall.json").exists():
                    load = wait_for_quiet(quiet, max_s=180)
                    wall = train(home, data, name, size_cfg(size, precision, steps))
                    print(f"  round {r + 1}: {precision} {size[0]:<9} {wall:5.0f} s (load {load:.1f} at its start)",
                          file=sys.stderr, flush=True)


def run_name(size: str, precision: str, r: int) -> str:
    return f"{size.replace(' ', '-')}-{precision}-r{r}"


def measured(home: Path, precision: str, rounds: int) -> dict[str, list]:
    """Each size's Measured runs, one per round, as the calculator reads them."""
    os.environ["LAB_HOME"] = str(home)
    from lab import sizing
    runs = {m.run: m for m in sizing.measured_runs("cpu", root=home / "runs")
            if (home / "runs" / m.run / "wall.json").exists()}  # finished runs only
    return {size[0]: [runs[run_name(size[0], precision, r)] for r in range(rounds)] for size in SIZES}


def with_median(runs: list):
    """One of `runs` carrying the median tokens/s of all of them."""
    from dataclasses import replace
    return replace(runs[0], run=runs[0].run.rsplit("-r", 1)[0], tok_s=statistics.median(r.tok_s for r in runs))


def predict(cfg: RunConfig, runs: list) -> tuple[float, list]:
    from lab import sizing
    e = sizing.estimate(cfg, manifest={}, runs=runs)
    return e.tok_s.value, e.tok_s.extra.get("interval")


class Tally:
    """Errors and interval hits of the per-round predictions, from one run or from two."""

    def __init__(self) -> None:
        self.errors: list[float] = []
        self.hits: list[bool] = []

    def add(self, predicted: tuple[float, list], measured: float) -> float:
        (lo, hi), err = predicted[1], predicted[0] / measured - 1
        self.errors.append(err)
        self.hits.append(lo <= measured <= hi)
        return err

    def worst(self) -> float:
        return max(self.errors, key=abs)


def table(home: Path, precision: str, rounds: int, steps: int) -> str:
    """Per size: the median measured over rounds (± half its range), the calculator's prediction
    from the base's median alone and from the base's and the second's with the error against the
    median, the per-round errors' range, and how many per-round measurements fell inside their
    prediction's interval; then the goal's line."""
    m = measured(home, precision, rounds)
    one, two = [with_median(m[FIRST])], [with_median(m[FIRST]), with_median(m[SECOND])]
    threads, others = m[FIRST][0].threads, [r.others_cpu for runs in m.values() for r in runs if r.others_cpu is not None]
    lines = [f"\n{precision} on {threads} thread(s), the kit's median tok/s (wall clock): {rounds} rounds; "
             f"error = predicted / measured - 1; [per-round range]; in = per-round measurements inside the 95% "
             f"interval; other work used {min(others, default=0):.0%}-{max(others, default=0):.0%} of the cores",
             f"{'size':<9} {'measured tok/s':>15} {'from one':>9} {'err':>5} {'[per round]':>13} {'in':>3} "
             f"{'from two':>9} {'err':>5} {'[per round]':>13} {'in':>3} {'old rule':>8}"]
    t1, t2 = Tally(), Tally()
    mid1, mid2 = [], []  # the errors from the rounds' medians
    for size in SIZES:
        name, cfg = size[0], size_cfg(size, precision, steps)
        meas = [r.tok_s for r in m[name]]
        mid = statistics.median(meas)
        base = one[0]
        rule = base.tok_s * base.flops_per_token() / flops_per_token(cfg.layers, cfg.width, base.vocab, cfg.context)
        cells = [f"{name:<9} {mid:8,.0f} ±{_spread(meas):4.0%}"]
        for tally, runs, fixed in ((t1, one, (FIRST,)), (t2, two, (FIRST, SECOND))):
            if name in fixed:
                cells.append(f"{'measured':>9} {'':>5} {'':>13} {'':>3}")
                continue
            p = predict(cfg, runs)[0]
            (mid1 if tally is t1 else mid2).append(p / mid - 1)
            per = [tally.add(predict(cfg, [m[f][r] for f in fixed]), meas[r]) for r in range(rounds)]
            inside = sum(tally.hits[-rounds:])
            cells.append(f"{p:9,.0f} {p / mid - 1:+5.0%} {_range(per):>13} {inside}/{rounds}")
        lines.append(" ".join(cells) + f" {rule / mid - 1:+8.0%}")
    hits = t1.hits + t2.hits
    coverage = sum(hits) / len(hits)
    worst1, worst2 = max(mid1, key=abs), max(mid2, key=abs)
    verdict = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines.append(f"goal: from one run within {GOAL['one']:.0%}: worst {worst1:+.0%} from the medians, {verdict(abs(worst1) <= GOAL['one'])} "
                 f"(per round {t1.worst():+.0%}); from two within {GOAL['two']:.0%}: worst {worst2:+.0%}, "
                 f"{verdict(abs(worst2) <= GOAL['two'])} (per round {t2.worst():+.0%}); coverage >= {GOAL['coverage']:.0%}: "
                 f"{sum(hits)} of {len(hits)} ({coverage:.0%}), {verdict(coverage >= GOAL['coverage'])}")
    lines.append(_time_line(home, m, precision, steps))
    return "\n".join(lines)


def _time_line(home: Path, m: dict, precision: str, steps: int) -> str:
    """The whole run's predicted time (from two measured runs) less a session's start, against
    the training call's own seconds: these runs are bare processes, not the notebook sessions
    whose start the calculator adds (`lab.sizing.runtime.LOCAL_START_S`, measured on its own)."""
    from lab import sizing
    from lab.sizing.runtime import LOCAL_START_S
    two = [with_median(m[FIRST]), with_median(m[SECOND])]
    errs = []
    for size in SIZES:
        e = sizing.estimate(size_cfg(size, precision, steps), manifest={}, runs=two)
        pred = e.run_hours.value * 3600 - LOCAL_START_S * e.run_hours.extra["sessions"]
        own = [json.loads((home / "runs" / r.run / "own.json").read_text())["train_call_s"] for r in m[size[0]]]
        errs.append(f"{size[0]} {pred:.0f}/{statistics.median(own):.0f} s ({pred / statistics.median(own) - 1:+.0%})")
    return "time less a session's start, predicted / measured (median): " + ", ".join(errs)


def _spread(values: list[float]) -> float:
    """Half the range over the median: how much one measurement of the same size moved."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def _range(errors: list[float]) -> str:
    return f"[{min(errors):+.0%}, {max(errors):+.0%}]"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "processor unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", default="auto", help="comma-separated: auto (the kit's own), fp32, bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=160, help="steps per run (the first 20 are the warm-up)")
    p.add_argument("--keep", metavar="DIR", help="keep the lab home with the runs here (resumable)")
    p.add_argument("--from", dest="source", metavar="DIR", help="only print the table from a kept DIR")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the runs and the calculator (default: the kit's own, one per core)")
    p.add_argument("--quiet", type=float, metavar="LOAD",
                   help="before each run, wait (up to 3 min) until the 1-minute load average is at most LOAD")
    a = p.parse_args()
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the runs inherit it; the calculator reads it
    precisions = a.precision.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-est-") as tmp:
        home = Path(a.source or a.keep or tmp)
        if not a.source:
            home.mkdir(parents=True, exist_ok=True)
            measure(home, prepared(home), precisions, a.rounds, a.steps, a.quiet)
        print(f"machine: {os.cpu_count()} CPU(s) ({_cpu_name()}), load average {os.getloadavg()[0]:.1f} at the end")
        for precision in precisions:
            print(table(home, precision, a.rounds, a.steps))


if __name__ == "__main__":
    main()
