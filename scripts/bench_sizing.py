#!/usr/bin/env python3
"""How fast the sizing calculator answers: the form calls it on every keystroke.

Builds a throwaway lab home like a busy lab's (prepared data, dozens of runs with long
metrics logs, one of them live), then times `lab.sizing.estimate` the way the form calls
it: one field changing per call. Prints the import time (of `lab.sizing` and of `lab size`'s
module, and whether either pulled in torch or numpy), the first (cold) call that reads the
files, the median and 99th percentile of warm calls, and how long the New run form takes
to answer a change of one field (the calculator and its redraw), median and worst.

    python scripts/bench_sizing.py [--runs 40] [--lines 20000] [--calls 2000] [--form-changes 100]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_home(home: Path, runs: int, lines: int) -> Path:
    data = home / "data" / "pydoc-0001"
    data.mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({
        "format": 1, "constellations": {"pydoc": {"train_tokens": 600_000_000, "val_tokens": 6_000_000}},
        "train_tokens": 600_000_000, "val_tokens": 6_000_000, "shortest_val_tokens": 400_000,
        "tokenizer": {"vocab": 4000}, "val_set": "abc", "created": "2025-01-01T00:00:00+00:00"}))
    for i in range(runs):
        folder = home / "runs" / f"run{i:03d}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"gpu": "auto", "constellations": ["pydoc"],
                                                        "context": 1024, "width": 512, "heads": 8,
                                                        "layers": 4 + 2 * (i % 10), "batch_per_card": 6}))
        (folder / "device.json").write_text(json.dumps({"device": "cuda", "name": "Tesla T4", "cards": 1,
                                                        "world": 2 if i % 3 else 1, "precision": "fp16"}))
        n = lines if i % 4 == 0 else lines // 10
        with open(folder / "metrics.jsonl", "w") as f:
            for s in range(1, n + 1):
                rec = {"step": s, "tokens": s * 12288, "loss": 3.0, "lr": 1e-3, "grad_norm": 0.5,
                       "tok_s": 100_000 - 1000 * (i % 10) + (s % 7) * 100, "elapsed_s": s * 0.12, "session": 1}
                if s % 250 == 0:
                    rec.update(val_loss=3.1, val_set="abc")
                f.write(json.dumps(rec) + "\n")
    return home / "runs" / "run000" / "metrics.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--lines", type=int, default=20_000, help="metrics lines of every fourth run (others: a tenth)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--form-changes", type=int, default=100)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        live = build_home(home, args.runs, args.lines)
        env = {**os.environ, "LAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
        code = ("import sys, time; t = time.perf_counter(); import lab.sizing, lab.cli.size; "
                "print(time.perf_counter() - t, any(m in sys.modules for m in ('torch', 'numpy')))")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        import_s, heavy = float(out[0]), out[1] == "True"
        os.environ["LAB_HOME"] = str(home)
        sys.path.insert(0, str(ROOT))
        from lab import sizing
        from lab.config import RunConfig

        cfg = RunConfig(gpu="2xT4", constellations=["pydoc"])
        t = time.perf_counter()
        first = sizing.estimate(cfg)
        cold_s = time.perf_counter() - t

        times = []
        with open(live, "a") as log:
            for k in range(args.calls):
                cfg.layers = 4 + k % 20  # a keystroke in one field
                cfg.batch_per_card = 1 + k % 16
                if k % 10 == 0:  # the live run logs a step now and then
                    log.write(json.dumps({"step": 10**6 + k, "tok_s": 99_000, "elapsed_s": 10**5 + k,
                                          "session": 1}) + "\n")
                    log.flush()
                t = time.perf_counter()
                sizing.estimate(cfg)
                times.append(time.perf_counter() - t)
        times.sort()
        median, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
        print(f"lab.sizing.estimate: median {median * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms over {args.calls} calls "
              f"(cold first call {cold_s * 1e3:.0f} ms; {args.runs} runs, "
              f"{args.lines} lines in the longest logs; speed {first.tok_s.value} tok/s {first.tok_s.kind})")
        print(f"import lab.sizing + lab.cli.size: {import_s * 1e3:.0f} ms, torch or numpy imported: {heavy}")
        form_median, form_worst = time_form(args.form_changes)
        print(f"New run form, one field changed: median {form_median * 1e3:.1f} ms, worst "
              f"{form_worst * 1e3:.1f} ms over {args.form_changes} changes")
        return 0 if p99 < 0.050 and not heavy else 1


def time_form(changes: int) -> tuple[float, float]:
    """A field changed in the form, as the browser changes it: the estimate and the redraw."""
    from lab import ui
    form = ui.NewRunForm(machine="local")
    times = []
    for k in range(changes):
        t = time.perf_counter()
        form.inputs["layers"].value = 4 + k % 20
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], times[-1]


if __name__ == "__main__":
    sys.exit(main())
