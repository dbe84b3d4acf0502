"""What the loop does at its sync points, each part with one job (torchtitan's way).

* `SyncWindow`: the steps between two sync points: their readings stay on the device, and at
  the sync point one collective reads them and settles what every rank must share (stop,
  save, where the next sync point is); it also times the window (tokens/s, seconds per step,
  and on a CPU how much of the machine other work took meanwhile);
* `MetricsSink`: where the rows go (metrics.jsonl, the log's `@lab-metrics` lines, a callback);
* `Progress`: the progress line, now and then.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch

from lab.kernel.cpu import OthersLoad
from lab.kernel.metrics import echo_metrics
from lab.kernel.ranks import sum_ranks
from lab.kernel.speed import Readings, next_sync_steps


class SyncWindow:
    """The steps since the last sync point, and where the next one is.

    Steps are the same on every rank, so every rank reaches a sync point at the same step; there
    one collective sums the window's losses and the flags each rank brings, so no rank ever
    waits for another between sync points, and the card never waits for the host. `rt` is this
    process's `step.Runtime`."""

    def __init__(self, rt, step: int, tokens: int, scaled: bool = False):
        self.rt, self.readings = rt, Readings(scaled)
        self.step_s, self.apart, self.next_sync = 0.0, 1, step + 1  # measured step time; steps between syncs
        # A CPU's speed moves with other work (with several ranks on one CPU, each would count the others).
        self.others = OthersLoad() if rt.device.type == "cpu" and rt.world == 1 else None
        self.restart(tokens)

    def restart(self, tokens: int) -> None:
        """A new window: tok_s and the step time measure training, not the evaluations and saves
        done between windows."""
        self.t0, self.tokens0, self.steps = time.monotonic(), tokens, 0
        if self.others is not None:
            self.others.since_last()

    def stepped(self, loss: torch.Tensor, norm: torch.Tensor, row: dict | None) -> None:
        """One step taken; `row` (its metrics row, its loss and grad_norm still to come) when it is logged."""
        self.steps += 1
        self.readings.count(norm)
        if row is not None:
            self.readings.add(row, loss, norm)

    def due(self, step: int) -> bool:
        return step >= self.next_sync

    def ahead_s(self) -> float:
        """Seconds of training until the next sync point, at the last step time: a stop for the
        time limit must leave room for them."""
        return self.step_s * self.apart

    @property
    def skipped(self) -> int:
        """Steps of this session the GradScaler skipped (read at sync points)."""
        return self.readings.skipped

    def sync(self, step: int, tokens: int, flags: list[float], within_s: float) -> tuple[list[dict], list[float]]:
        """The window's rows (with loss, grad_norm and tok_s) and `flags` summed across ranks,
        after one collective. The next sync point comes after about a second of steps, never
        beyond `within_s` seconds; the ranks take the mean of what each wanted."""
        wanted = float(next_sync_steps(self.step_s, within_s))
        rows, summed = self.readings.take(self.rt.device, [*flags, wanted], lambda t: sum_ranks(t, self.rt))
        now = time.monotonic()
        rate = (tokens - self.tokens0) / max(now - self.t0, 1e-9)
        if self.steps:
            self.step_s = (now - self.t0) / self.steps
        self.apart = max(1, int(summed[-1] / self.rt.world))
        self.next_sync = step + self.apart
        others = self.others.since_last() if self.others is not None else None
        for row in rows:
            row["loss"], row["tok_s"] = row["loss"] / self.rt.world, rate
            if others is not None:
                row["others_cpu"] = others
        return rows, summed[:-1]


class MetricsSink:
    """Where the loop's rows go on rank 0: appended to metrics.jsonl and flushed at every sync
    point (a killed session keeps its curve up to there), echoed into the log as
    `@lab-metrics` lines (the live curve of a session running elsewhere), and handed to
    `on_metrics` (the notebook's plot, a sweep's divergence watch). Without a path (the other
    ranks) it drops them."""

    def __init__(self, path: Path | None, on_metrics: Callable[[dict], None] | None = None):
        self.file = open(path, "a", encoding="utf-8") if path is not None else None
        self.on_metrics = on_metrics

    def __enter__(self) -> "MetricsSink":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()

    def write(self, rows: list[dict]) -> None:
        if not rows or self.file is None:
            return
        self.file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        self.file.flush()
        for row in rows:
            if self.on_metrics:
                self.on_metrics(row)
            echo_metrics(row)


PROGRESS_EVERY_S = 10  # a progress line at most this often: a 12-hour session stays readable


class Progress:
    """The progress line in the log: for the first logged row at once, then at most every
    PROGRESS_EVERY_S seconds."""

    def __init__(self, steps_until: int, log: Callable[[str], None]):
        self.steps_until, self.log, self.last = steps_until, log, None

    def show(self, rows: list[dict]) -> None:
        logged = [r for r in rows if "loss" in r]
        if logged and (self.last is None or time.monotonic() - self.last >= PROGRESS_EVERY_S):
            self.log(progress_line(logged[-1], self.steps_until))
            self.last = time.monotonic()


def progress_line(record: dict, steps_until: int) -> str:
    return (f"step {record['step']:,}/{steps_until:,} loss {record['loss']:.4f} lr {record['lr']:.2e} "
            f"{record['tok_s']:,.0f} tok/s {record['elapsed_s']:.0f}s")
