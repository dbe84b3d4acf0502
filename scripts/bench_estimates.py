#!/usr/bin/env python3
"""How far the calculator's speed is from the runs that follow, as a lab meets it: prints the table
the README's calculator section shows, the same size's spread beside the errors.

    scripts/bench_estimates.py --keep /tmp/bench-est                 # issue 41's check: 5 rounds across an hour
    scripts/bench_estimates.py --keep /tmp/bench-est --over-min 0    # the rounds back to back (~20 min here)
    scripts/bench_estimates.py --from /tmp/bench-est                 # the table again from kept runs
    scripts/bench_estimates.py --parts-check                         # the shape alone, from lean steps (~3 min)

First it measures this computer's parts (lab.trial.parts through lab.api.sizing.measure_parts, on the
threads a run takes), as the calculator does the first time it sizes a run here. Each round then
trains every size below with `lab train`'s own call in its own process on the embedded pydoc data,
one after another, each round starting one size further on, with the settings `lab run --machine
local` takes here: its precision ("auto": bf16 where the CPU multiplies it, else fp32), its threads
(OMP_NUM_THREADS, else one per core), torch_compile "auto"; the rounds start evenly across
--over-min minutes, so that each size is measured in several states of the machine. A run's speed
is the kit's own: the median tok/s of its metrics after the warm-up, wall-clock (lab.sizing.speeds).
The calculator (lab.sizing.estimate, on the cpu card) then predicts every other size from the base
size's run alone, and from the base's and the second size's, as a lab's form would after one and
after two measured runs: per round from that round's runs (the errors' range, and whether the
measured speed fell inside the 95% interval: the coverage), and from each size's median over the
rounds; with the shape from this computer's parts (what the calculator does now) and, beside it,
from the lab's prior (what it did before). Beside each size: its own spread over the rounds (half
their range over their median), so that a miss larger than the spread shows as the model's. None
of the sizes is on scripts/bench_prior.py's grid.
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
GOAL = {"one": 0.25, "two": 0.10, "coverage": 0.90}  # issue 41's "done when"


def size_cfg(size: tuple, precision: str, steps: int) -> RunConfig:
    """The size as `lab run --machine local` would train it (its precision and compile rule), with
    no evaluation inside the measured steps."""
    _, layers, width, heads, context, batch = size
    return RunConfig(gpu="cpu", machine="local", layers=layers, width=width, heads=heads, context=context,
                     batch_per_card=batch, steps_until=steps, precision=precision, eval_every=100_000,
                     warmup_steps=10, limit_min=60)


def prepared(home: Path) -> Path:
    env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    code = "from lab import corpus; print(corpus.find_prepared(['pydoc']) or corpus.prepare(['pydoc'], progress=False))"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def run_precision(precision: str) -> str:
    """The precision a run here trains in: "auto" as the calculator (and the loop) resolve it."""
    from lab import sizing
    return sizing.estimate(size_cfg(SIZES[0], precision, 10), manifest={}, runs=[]).precision


def measure_parts(home: Path, precision: str, cpu_clock: bool = False) -> dict:
    """This computer's parts, as the calculator measures them the first time it sizes a run here
    (with `cpu_clock`, in this process's CPU seconds: on a busy machine, one thread)."""
    os.environ["LAB_HOME"] = str(home)
    from lab.api.sizing import measure_parts as measure
    from lab.sizing.machine import save_local
    from lab.sizing.priors import cpu_threads
    prec = run_precision(precision)
    t0 = time.monotonic()
    if cpu_clock:
        import torch
        from lab.trial.parts import measure_parts as microbenchmark
        path = save_local(microbenchmark(torch.device("cpu"), prec, clock=time.process_time))
    else:
        path = measure(prec, cpu_threads())
    record = json.loads(path.read_text())
    from lab.sizing.machine import unsteady_local
    unsteady = unsteady_local(prec, int(record["threads"]))
    print(f"  parts: {prec} on {record['threads']} thread(s) in {time.monotonic() - t0:.0f} s (their own timings' "
          f"spread {record['spread']:.0%}, load {record.get('load')}), kept in {path}"
          + (f"; NOT USED: {unsteady.why_unsteady()} (run again when the machine is quiet)" if unsteady else ""),
          file=sys.stderr, flush=True)
    return record


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


def measure(home: Path, data: Path, precisions: list[str], rounds: int, steps: int, quiet: float | None,
            over_min: float) -> None:
    """Every size in every round, the rounds' starts spread evenly over `over_min` minutes; each round
    starts one size further on, so that no size is always the one measured after a quiet (or a busy)
    spell."""
    from bench_prior import wait_for_quiet  # beside this script
    started = time.monotonic()
    for r in range(rounds):
        due = started + over_min * 60 * r / max(rounds, 1)
        if time.monotonic() < due:
            print(f"  round {r + 1} starts in {(due - time.monotonic()) / 60:.0f} min", file=sys.stderr, flush=True)
            time.sleep(due - time.monotonic())
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


def predict(cfg: RunConfig, runs: list) -> tuple[float, list, str]:
    from lab import sizing
    e = sizing.estimate(cfg, manifest={}, runs=runs)
    return e.tok_s.value, e.tok_s.extra.get("interval"), e.tok_s.extra.get("shape", "?")


class without_parts:
    """The calculator as it was before this computer's parts were measured: the lab's prior shape."""

    def __init__(self, home: Path):
        self.kept, self.aside = home / "sizing" / "parts", home / "sizing" / "parts.aside"

    def __enter__(self):
        if self.kept.is_dir():
            self.kept.rename(self.aside)

    def __exit__(self, *exc):
        if self.aside.is_dir():
            self.aside.rename(self.kept)


class Tally:
    """Errors and interval hits of the per-round predictions, from one run or from two."""

    def __init__(self) -> None:
        self.errors: list[float] = []
        self.hits: list[bool] = []
        self.medians: list[float] = []  # the errors from the rounds' medians

    def add(self, predicted: tuple, measured: float) -> float:
        (lo, hi), err = predicted[1], predicted[0] / measured - 1
        self.errors.append(err)
        self.hits.append(lo <= measured <= hi)
        return err

    def worst(self, errors: list[float] | None = None) -> float:
        return max(errors if errors is not None else self.errors, key=abs)


def size_row(name: str, cfg: RunConfig, m: dict, rounds: int, t1: Tally, t2: Tally, home: Path) -> str:
    """One size's line: its median over the rounds and their spread, the predictions from one run
    and from two (error against the median, the per-round errors' range, coverage), the same from
    one run with the lab's prior shape, and the old rule (one run's FLOP rate)."""
    meas = [r.tok_s for r in m[name]]
    mid = statistics.median(meas)
    base = with_median(m[FIRST])
    cells = [f"{name:<9} {mid:8,.0f} {_spread(meas):>5.0%}"]
    for tally, fixed in ((t1, (FIRST,)), (t2, (FIRST, SECOND))):
        if name in fixed:
            cells.append(f"{'measured':>9} {'':>5} {'':>13} {'':>3}")
            continue
        p = predict(cfg, [with_median(m[f]) for f in fixed])[0]
        tally.medians.append(p / mid - 1)
        per = [tally.add(predict(cfg, [m[f][r] for f in fixed]), meas[r]) for r in range(rounds)]
        cells.append(f"{p:9,.0f} {p / mid - 1:+5.0%} {_range(per):>13} {sum(tally.hits[-rounds:])}/{rounds}")
    with without_parts(home):
        prior = f"{predict(cfg, [base])[0] / mid - 1:+6.0%}" if name != FIRST else f"{'':>6}"
    rule = base.tok_s * base.flops_per_token() / flops_per_token(cfg.layers, cfg.width, base.vocab, cfg.context)
    return " ".join(cells) + f" {prior} {rule / mid - 1:+8.0%}"


def table(home: Path, precision: str, rounds: int, steps: int) -> str:
    """The table the README shows; then the goal's line, the second size's speed over the base's as
    each shape says it, and the whole run's time."""
    m = measured(home, precision, rounds)
    threads, others = m[FIRST][0].threads, [r.others_cpu for runs in m.values() for r in runs if r.others_cpu is not None]
    cfg0 = size_cfg(SIZES[0], precision, steps)
    shape = predict(cfg0, [with_median(m[SECOND])])[2]
    lines = [f"\n{precision} on {threads} thread(s), the kit's median tok/s (wall clock) over {rounds} rounds; spread = "
             f"half the rounds' range over their median; error = predicted / measured - 1; [per-round range]; in = "
             f"per-round measurements inside the 95% interval; shape: {shape}; other work used "
             f"{min(others, default=0):.0%}-{max(others, default=0):.0%} of the cores",
             f"{'size':<9} {'tok/s':>8} {'spread':>5} {'from one':>9} {'err':>5} {'[per round]':>13} {'in':>3} "
             f"{'from two':>9} {'err':>5} {'[per round]':>13} {'in':>3} {'prior':>6} {'old rule':>8}"]
    t1, t2 = Tally(), Tally()
    lines += [size_row(size[0], size_cfg(size, precision, steps), m, rounds, t1, t2, home) for size in SIZES]
    hits = t1.hits + t2.hits
    coverage = sum(hits) / len(hits)
    worst1, worst2 = t1.worst(t1.medians), t2.worst(t2.medians)
    verdict = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    spreads = sorted(_spread([r.tok_s for r in m[s[0]]]) for s in SIZES)
    lines.append(f"goal: from one run within {GOAL['one']:.0%}: worst {worst1:+.0%} from the medians, "
                 f"{verdict(abs(worst1) <= GOAL['one'])} (per round {t1.worst():+.0%}); from two within {GOAL['two']:.0%}: "
                 f"worst {worst2:+.0%}, {verdict(abs(worst2) <= GOAL['two'])} (per round {t2.worst():+.0%}); coverage >= "
                 f"{GOAL['coverage']:.0%}: {sum(hits)} of {len(hits)} ({coverage:.0%}), {verdict(coverage >= GOAL['coverage'])}; "
                 f"the sizes' own spread {spreads[0]:.0%}-{spreads[-1]:.0%} (median {statistics.median(spreads):.0%})")
    lines.append(_shape_line(home, m, precision, steps))
    lines.append(_time_line(home, m, precision, steps))
    return "\n".join(lines)


def _shape_line(home: Path, m: dict, precision: str, steps: int) -> str:
    """The second size's speed over the base's, as measured and as each shape predicts it from the
    base's run: the model's shape, whatever the base's run's luck."""
    base, cfg = with_median(m[FIRST]), size_cfg(SIZES[1], precision, steps)
    measured_ratio = statistics.median(r.tok_s for r in m[SECOND]) / base.tok_s
    parts = predict(cfg, [base])[0] / base.tok_s
    with without_parts(home):
        prior = predict(cfg, [base])[0] / base.tok_s
    return (f"shape: {SECOND}/{FIRST} speed measured {measured_ratio:.2f}, predicted {parts:.2f} from this computer's "
            f"parts, {prior:.2f} from the lab's prior")


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


def parts_check(home: Path, precision: str, rounds: int, min_s: float, cpu_clock: bool = False,
                quiet: float | None = None) -> str:
    """The shape alone, in a few minutes: each size's lean step (bench_prior's timing, no run around
    it) against the base's, as measured and as this computer's parts and the lab's prior predict
    (with `cpu_clock`, steps timed in CPU seconds as the parts were)."""
    from bench_prior import step_times  # beside this script
    from lab.sizing.priors import cpu_threads, prior
    from lab.sizing.steptime import Size
    from lab.sizing import card_for
    prec = run_precision(precision)
    grid = [(layers, width, context, batch) for _, layers, width, _, context, batch in SIZES]
    times = step_times(prec, rounds, min_s=min_s, grid=grid, vocab=4000, quiet=quiet,
                       clock=time.process_time if cpu_clock else time.perf_counter)
    sizes = {name: Size(n, d, L, 4000, b) for name, L, d, _, n, b in SIZES}
    with_parts = prior(card_for("cpu"), prec, cpu_threads())
    with without_parts(home):
        lab_prior = prior(card_for("cpu"), prec, cpu_threads())

    def ratio(pri, name):  # tokens/s of the size over the base's
        step = lambda s: sum(c * x for c, x in zip(pri.parts, s.parts(pri.curves)))  # noqa: E731
        return (sizes[name].tokens_per_step / step(sizes[name])) / (sizes[FIRST].tokens_per_step / step(sizes[FIRST]))
    clock = "CPU seconds" if cpu_clock else "wall clock"
    lines = [f"\nthe shape: each size's lean step ({prec}, {cpu_threads()} thread(s), {clock}, median of {rounds} rounds) as "
             f"tokens/s over the base's; error = predicted / measured - 1",
             f"{'size':<9} {'measured':>8} {'parts':>6} {'err':>5} {'prior':>6} {'err':>5}"]
    for name, L, d, _, n, b in SIZES[1:]:
        key = (L, d, n, b)
        got = (sizes[name].tokens_per_step / times[key]) / (sizes[FIRST].tokens_per_step / times[grid[0]])
        p, q = ratio(with_parts, name), ratio(lab_prior, name)
        lines.append(f"{name:<9} {got:8.2f} {p:6.2f} {p / got - 1:+5.0%} {q:6.2f} {q / got - 1:+5.0%}")
    return "\n".join(lines)


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
    p.add_argument("--over-min", type=float, default=60.0,
                   help="spread the rounds' starts evenly over this many minutes (0: back to back)")
    p.add_argument("--steps", type=int, default=160, help="steps per run (the first 20 are the warm-up)")
    p.add_argument("--keep", metavar="DIR", help="keep the lab home with the runs here (resumable)")
    p.add_argument("--from", dest="source", metavar="DIR", help="only print the table from a kept DIR")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the runs and the calculator (default: the kit's own, one per core)")
    p.add_argument("--quiet", type=float, metavar="LOAD",
                   help="before each run, wait (up to 3 min) until the 1-minute load average is at most LOAD")
    p.add_argument("--parts-check", action="store_true",
                   help="only the shape: lean steps of every size against this computer's parts and the lab's prior")
    p.add_argument("--cpu-clock", action="store_true",
                   help="with --parts-check on a busy machine: time the parts and the steps in CPU seconds, which "
                        "waiting for a core does not move (needs OMP_NUM_THREADS=1)")
    a = p.parse_args()
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the runs inherit it; the calculator reads it
    precisions = a.precision.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-est-") as tmp:
        home = Path(a.source or a.keep or tmp)
        home.mkdir(parents=True, exist_ok=True)
        if a.cpu_clock and (os.environ.get("OMP_NUM_THREADS") != "1" or not a.parts_check):
            p.error("--cpu-clock goes with --parts-check and OMP_NUM_THREADS=1")
        if not a.source:
            from bench_prior import wait_for_quiet  # beside this script
            for precision in precisions:
                wait_for_quiet(a.quiet, max_s=180)
                measure_parts(home, precision, a.cpu_clock)
        print(f"machine: {os.cpu_count()} CPU(s) ({_cpu_name()}), load average {os.getloadavg()[0]:.1f} now")
        if a.parts_check:
            for precision in precisions:
                print(parts_check(home, precision, a.rounds, min_s=1.0, cpu_clock=a.cpu_clock, quiet=a.quiet))
            return
        if not a.source:
            measure(home, prepared(home), precisions, a.rounds, a.steps, a.quiet, a.over_min)
        print(f"machine: load average {os.getloadavg()[0]:.1f} at the end")
        for precision in precisions:
            print(table(home, precision, a.rounds, a.steps))


if __name__ == "__main__":
    main()
