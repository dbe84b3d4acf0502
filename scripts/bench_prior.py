#!/usr/bin/env python3
"""This CPU's prior parts for the speed model (lab.sizing.priors.CPU_PARTS): prints them.

    scripts/bench_prior.py --precision bf16,fp32 --rounds 5 --min-s 2 --save scripts/measured/bench_prior-epyc-2threads
    OMP_NUM_THREADS=1 scripts/bench_prior.py --cpu-clock --save scripts/measured/bench_prior-xeon-1core

Times the lean training step (the model, fused AdamW, gradient clipping, autocast: what
`lab train` does per step, without its logging) on a grid of sizes chosen to tell the parts of
`lab.sizing.steptime` apart (depth, width, context, batch each varied on their own), keeps each
size's median step over the rounds (each round at least --steps steps and --min-s seconds), and
fits the seconds per unit of each part by non-negative least squares on relative errors.
It times on the threads `lab train` would take here (OMP_NUM_THREADS, else one per core): the
prior is per thread count, since a step's parts do not all spread over the threads alike.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.sizing.nnls import nnls  # noqa: E402
from lab.sizing.steptime import PARTS, Size  # noqa: E402

VOCAB = 4000
# (layers, width, context, batch_per_card)
GRID = [(1, 64, 64, 4), (2, 64, 64, 4), (4, 64, 64, 4), (8, 64, 64, 4), (2, 64, 64, 16), (2, 128, 64, 4),
        (2, 256, 64, 4), (2, 384, 64, 2), (2, 64, 256, 4), (2, 64, 512, 2), (4, 128, 128, 8), (4, 256, 256, 4),
        (8, 128, 128, 4), (2, 128, 512, 4), (4, 256, 128, 16), (4, 512, 128, 4), (1, 512, 256, 4), (2, 64, 1024, 1),
        (8, 512, 512, 2), (4, 384, 256, 4),
        # the batch on its own, up to where one layer's activations outgrow a core's cache
        (4, 128, 128, 2), (4, 128, 128, 32), (4, 128, 128, 64), (2, 128, 128, 32), (4, 64, 128, 32), (4, 128, 32, 32),
        # the context on its own at a fixed number of tokens per step, where attention is more than noise
        (4, 128, 256, 4), (4, 128, 1024, 1), (4, 256, 512, 2)]


def wait_for_quiet(load: float | None, max_s: float = 600.0) -> float:
    """On a machine shared with other work: waits (up to `max_s`) until the 1-minute load
    average is at most `load`, so that a measurement is not mostly someone else's. Returns
    the load average it started at."""
    t0 = time.monotonic()
    while load is not None and os.getloadavg()[0] > load and time.monotonic() - t0 < max_s:
        time.sleep(5)
    return os.getloadavg()[0]


def step_times(precision: str, rounds: int, steps: int = 8, warmup: int = 2, quiet: float | None = None,
               clock=time.perf_counter, min_s: float = 0.0, grid: list[tuple] | None = None,
               vocab: int = VOCAB) -> dict[tuple, float]:
    """Each size of `grid` (default GRID: (layers, width, context, batch)): its step time, per round
    its median step over at least `steps` steps and `min_s` seconds, then the median over the rounds."""
    import torch  # its threads: OMP_NUM_THREADS, as `lab train` would take it
    from lab.config import RunConfig
    from lab.kernel.model import GPT
    from lab.kernel.step import Runtime, autocast, make_optimizer  # the kernel's own step parts
    device = torch.device("cpu")
    rt = Runtime(0, 1, device, precision, cards=1)
    per_round: dict[tuple, list[float]] = {}
    for r in range(rounds):
        for (layers, width, context, batch) in grid or GRID:
            wait_for_quiet(quiet)
            torch.manual_seed(0)
            heads = max(1, width // 32)
            model = GPT(vocab, context, width, heads, layers)
            opt = make_optimizer(model, RunConfig(), device)
            x = torch.randint(0, vocab, (batch, context))
            times: list[float] = []
            for i in itertools.count():
                t0 = clock()
                with autocast(rt):
                    loss = model(x, x)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i >= warmup:
                    times.append(clock() - t0)
                if len(times) >= steps and sum(times) >= min_s:
                    break
            per_round.setdefault((layers, width, context, batch), []).append(statistics.median(times))
        print(f"  {precision}: round {r + 1} of {rounds}", file=sys.stderr, flush=True)
    # The median over rounds, not the fastest round: on a VM whose neighbours slow it for seconds at a
    # time, a short size's round can fall wholly in a quiet spell and a long one's cannot, so the
    # fastest rounds would make small sizes look cheaper than a real run (minutes long) finds them.
    return {key: statistics.median(values) for key, values in per_round.items()}


def fit_parts(times: dict[tuple, float]) -> tuple[float, ...]:
    """Seconds per unit of each part: NNLS on relative errors, columns scaled to unit size."""
    xs = [Size(context, width, layers, VOCAB, batch).parts() for (layers, width, context, batch) in times]
    ts = list(times.values())
    norms = [max(x[j] / t for x, t in zip(xs, ts)) or 1.0 for j in range(len(PARTS))]
    rows = [[x[j] / t / norms[j] for j in range(len(PARTS))] for x, t in zip(xs, ts)]
    z = nnls(rows, [1.0] * len(rows))
    return tuple(v / n for v, n in zip(z, norms))


def main(precisions: list[str], rounds: int = 5, save: str | None = None, quiet: float | None = None,
         cpu_clock: bool = False, steps: int = 8, min_s: float = 0.0) -> None:
    for precision in precisions:
        from lab.sizing.priors import cpu_threads
        print(f"  {precision} on {cpu_threads()} thread(s): CPU_PARTS[{cpu_threads()}]", file=sys.stderr)
        times = step_times(precision, rounds, steps, quiet=quiet, min_s=min_s,
                           clock=time.process_time if cpu_clock else time.perf_counter)
        if save:
            with open(f"{save}-{precision}.json", "w") as f:
                json.dump({",".join(map(str, k)): v for k, v in times.items()}, f, indent=1)
        report(precision, times)


def load_times(path: str) -> dict[tuple, float]:
    """Step times as --save wrote them: {"layers,width,context,batch": seconds}."""
    with open(path) as f:
        return {tuple(int(v) for v in key.split(",")): t for key, t in json.load(f).items()}


def report(precision: str, times: dict[tuple, float]) -> None:
    """Prints the parts fitted to `times` as a line of CPU_PARTS, and the fit's worst misfit."""
    parts = fit_parts(times)
    print(f'    "{precision}": ({", ".join(f"{v:.3g}" for v in parts)}),')
    worst = max(abs(sum(c * u for c, u in zip(parts, Size(n, d, L, VOCAB, b).parts())) / t - 1)
                for (L, d, n, b), t in times.items())
    print(f"    # {len(times)} sizes; worst misfit on the grid: {worst:.0%}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", default="fp32,bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="timed steps per size and round (after 2 of warm-up)")
    p.add_argument("--min-s", type=float, default=0.0, help="and at least this many seconds of steps per size and round")
    p.add_argument("--save", metavar="PREFIX", help="also write each size's step time to PREFIX-<precision>.json")
    p.add_argument("--quiet", type=float, metavar="LOAD",
                   help="before each size, wait (up to 10 min) until the 1-minute load average is at most LOAD")
    p.add_argument("--cpu-clock", action="store_true",
                   help="time steps in the process's CPU seconds, which other work does not move (meaningful "
                        "with OMP_NUM_THREADS=1: one thread's CPU seconds are an idle core's wall seconds)")
    p.add_argument("--fit", nargs=2, metavar=("PRECISION", "FILE"),
                   help="only fit the parts to step times saved by --save (no timing)")
    a = p.parse_args()
    if a.fit:
        report(a.fit[0], load_times(a.fit[1]))
        sys.exit(0)
    if a.cpu_clock and os.environ.get("OMP_NUM_THREADS") != "1":
        p.error("--cpu-clock needs OMP_NUM_THREADS=1")
    main(a.precision.split(","), a.rounds, a.save, a.quiet, a.cpu_clock, a.steps, a.min_s)
