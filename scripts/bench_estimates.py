#!/usr/bin/env python3
"""How far the calculator's speed is from the run that follows, as a lab meets it: prints a table.

    scripts/bench_estimates.py                       # fp32 and bf16, 3 rounds
    scripts/bench_estimates.py --precision bf16 --rounds 5 --keep /tmp/bench-est
    scripts/bench_estimates.py --from /tmp/bench-est   # the table again from kept runs

Each round trains every size below with `lab train` in its own process on the embedded pydoc
data, one after another, each round starting one size further on. A run's speed is the kit's
own: the median tok_s of its metrics after the warm-up (lab.sizing.speeds). The calculator
(lab.sizing.estimate, on the cpu card in that precision) then predicts every size from the base
size's runs alone, and from the base's and the second size's, as a lab's form would after one
and after two measured runs; each size's measured speed is its median over the rounds, and the
per-round range shows what each round's runs alone would have said. Beside them: the old rule
(one run's FLOP rate carried over by FLOPs per token), and the whole run's predicted time less
a session's start against the training call's own seconds.
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


# `lab train`'s own call (lab.cli.train.run -> lab.kernel.train.train), in its own process, with
# two additions: each metrics row also notes the process's CPU seconds, a clock that other work on
# a shared machine does not move (with one thread, CPU seconds are what an idle core's would be);
# and the seconds of the call itself (the data, the model, the steps, evaluations and saves: what
# the calculator counts besides a session's start) go to own.json.
RUNNER = """
import json, sys, time
from lab.config import RunConfig
from lab.kernel.train import train
cfg, out, data = RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
cpu = []
t0 = time.monotonic()
result = train(cfg, out, data, log=lambda s: None,
               on_metrics=lambda row: cpu.append([row.get("step"), time.process_time()]))
own = {"train_call_s": time.monotonic() - t0, "result": result}
open(out + "/cpu.json", "w").write(json.dumps(cpu))
open(out + "/own.json", "w").write(json.dumps(own))
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


def cpu_tok_s(home: Path, run: str, tokens_per_step: int, warmup: int = 20) -> float:
    """Tokens per CPU second over the run's steps after the warm-up."""
    rows = [(s, t) for s, t in json.loads((home / "runs" / run / "cpu.json").read_text()) if s is not None]
    last = max(t for _, t in rows)  # the last sync point's rows wait for the final evaluation: left out
    rows = [r for r in rows if r[1] < last - 0.01]
    (s0, t0), (s1, t1) = next(r for r in rows if r[0] >= warmup), rows[-1]
    return (s1 - s0) * tokens_per_step / (t1 - t0)


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


def measured(home: Path, precision: str, rounds: int, clock: str) -> dict[str, list]:
    """Each size's Measured runs, one per round: the kit's median tok/s ("wall"), or the same
    runs' tokens per CPU second ("cpu")."""
    from dataclasses import replace
    os.environ["LAB_HOME"] = str(home)
    from lab import sizing
    runs = {m.run: m for m in sizing.measured_runs("cpu", root=home / "runs")
            if (home / "runs" / m.run / "wall.json").exists()}  # finished runs only
    if clock == "cpu":
        runs = {k: replace(m, tok_s=cpu_tok_s(home, k, m.batch_per_card * m.context)) for k, m in runs.items()}
    return {size[0]: [runs[run_name(size[0], precision, r)] for r in range(rounds)] for size in SIZES}


def with_median(runs: list):
    """One of `runs` carrying the median tokens/s of all of them."""
    from dataclasses import replace
    return replace(runs[0], run=runs[0].run.rsplit("-r", 1)[0], tok_s=statistics.median(r.tok_s for r in runs))


def predict(cfg: RunConfig, runs: list) -> tuple[float, list]:
    from lab import sizing
    e = sizing.estimate(cfg, manifest={}, runs=runs)
    return e.tok_s.value, e.tok_s.extra.get("interval")


def table(home: Path, precisions: list[str], rounds: int, steps: int, clock: str) -> str:
    """Per size: the median measured over rounds (± half its range), and the calculator's
    prediction from the base's median alone and from the base's and the second's, with the
    error against the median; the per-round errors' range (each round's runs alone) beside."""
    lines = []
    for precision in precisions:
        m = measured(home, precision, rounds, clock)
        one, two = [with_median(m[FIRST])], [with_median(m[FIRST]), with_median(m[SECOND])]
        what = "the kit's median tok/s" if clock == "wall" else "tokens per CPU second"
        lines += [f"\n{precision}, {what}: {rounds} rounds; error = predicted / measured - 1; [per-round range]",
                  f"{'size':<9} {'measured tok/s':>15} {'from one':>9} {'err':>5} {'[per round]':>13} "
                  f"{'from two':>9} {'err':>5} {'[per round]':>13} {'old rule':>8}"]
        for size in SIZES:
            name, cfg = size[0], size_cfg(size, precision, steps)
            meas = [r.tok_s for r in m[name]]
            mid = statistics.median(meas)
            p1, p2 = predict(cfg, one)[0], predict(cfg, two)[0]
            r1 = [predict(cfg, [m[FIRST][r]])[0] / meas[r] - 1 for r in range(rounds)]
            r2 = [predict(cfg, [m[FIRST][r], m[SECOND][r]])[0] / meas[r] - 1 for r in range(rounds)]
            base = one[0]
            rule = base.tok_s * base.flops_per_token() / flops_per_token(cfg.layers, cfg.width, base.vocab, cfg.context)
            two_text = f"{'measured':>9} {'':>5} {'':>13}" if name in (FIRST, SECOND) else \
                f"{p2:9,.0f} {p2 / mid - 1:+5.0%} {_range(r2):>13}"
            lines.append(f"{name:<9} {mid:8,.0f} ±{_spread(meas):4.0%} {p1:9,.0f} {p1 / mid - 1:+5.0%} {_range(r1):>13} "
                         f"{two_text} {rule / mid - 1:+8.0%}")
        if clock == "wall":
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
        print(f"machine: {os.cpu_count()} CPU(s), runs on {os.environ.get('OMP_NUM_THREADS') or 'all'} thread(s), "
              f"load average {os.getloadavg()[0]:.1f} at the end")
        print(table(home, precisions, a.rounds, a.steps, "wall"))
        print(table(home, precisions, a.rounds, a.steps, "cpu"))


if __name__ == "__main__":
    main()
