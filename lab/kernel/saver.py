"""The time-limit saver: when the loop stops, when it saves, and which checkpoints stay.

A session stops at its time limit, at SIGTERM or SIGINT (Kaggle's stop, the stop button), or at
a stop file the launcher writes for every rank (`StopGuard`); it stops at a step boundary, after a
save, so a stopped session is always continued from where it stopped. Between the start and the
stop it saves every `checkpoint_every_min` minutes (`Saver`), and a WSD run also at the marks of
`stable_marks`: a few steps spread over its constant phase, the last where its decay begins, so
that cooldown branches can start from several steps and a finished run can grow from before its
decay. Pruning keeps the newest `KEEP` checkpoints and those marks (`kept_steps`); how a
checkpoint is written, verified and found again is `checkpoint`'s job, in the appendix.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from lab.kernel.schedule import decay_start_for_config
from lab.kernel.signals import catching_stop_signals

KEEP = 2  # the newest checkpoints kept: the one a run continues from, and the one before it
STABLE_CHECKPOINTS = 4  # a WSD run's checkpoints kept through its constant phase (its quarters)


def stable_marks(cfg) -> list[int]:
    """The steps a run saves at, and keeps, in its constant phase: for WSD, the quarters of the
    steps before its decay (the last is where the decay begins); for inv_sqrt, where its decay
    begins; none for cosine and linear. `cfg` needs only the schedule's fields."""
    start = decay_start_for_config(cfg)
    if not start:
        return []
    if cfg.schedule != "wsd":
        return [start]
    return sorted({start * k // STABLE_CHECKPOINTS for k in range(1, STABLE_CHECKPOINTS + 1)} - {0})


def kept_steps(steps: list[int], cfg, keep: int = KEEP) -> set[int]:
    """Of checkpoints' steps, those pruning keeps: the newest `keep`, and for each of the run's
    marks (`stable_marks`; `cfg` None: none) the newest at or before it."""
    steps = sorted(steps)
    kept = set(steps[-keep:]) if keep > 0 else set()
    for mark in stable_marks(cfg) if cfg is not None else []:
        before = [s for s in steps if s <= mark]
        if before:
            kept.add(before[-1])
    return kept


class StopGuard:
    """Decides when training must stop: at the time limit, when SIGTERM or SIGINT arrive, or
    when the launcher writes `stop_file` (a stop meant for every rank of a multi-process run).

    The handlers only set a flag; the loop saves at the next step boundary. Stopping at
    the limit leaves room for one more step and the save, with a second's margin: the margin
    for the session's boot, the output copy and Kaggle's kill lies in the session timeout the
    control side asks for (the limit plus a margin sized from the account's measured sessions,
    at least ten minutes), not here.
    """

    def __init__(self, limit_min: float, started: float | None = None, margin_s: float = 1.0,
                 stop_file: str | os.PathLike | None = None):
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + limit_min * 60
        self.margin_s = margin_s
        self.stop_file = Path(stop_file) if stop_file else None
        self.signal_name: str | None = None
        self._catching = None

    def __enter__(self) -> "StopGuard":
        # Every signal only asks again: the save at the next step boundary is never abandoned here.
        self._catching = catching_stop_signals(self._on_signal, again_interrupts=False)
        self._catching.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._catching.__exit__(*exc)

    def _on_signal(self, name: str) -> None:
        self.signal_name = name

    def reason(self, step_s: float, save_s: float) -> str | None:
        if self.signal_name:
            return f"{self.signal_name} received"
        if self.stop_file is not None and self.stop_file.exists():
            return self.stop_file.read_text(encoding="utf-8").strip() or "stop requested"
        if time.monotonic() + 1.5 * step_s + 1.5 * save_s + self.margin_s >= self.deadline:
            return "time limit"
        return None

    def left_s(self) -> float:
        """Seconds to the time limit. Sync points come closer as it nears, so the loop stops
        close to the limit rather than a whole sync interval early."""
        return max(0.0, self.deadline - time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Saver:
    """When the loop saves, and what a save costs. A save is due every `every_min` minutes. Its
    cost is measured at each save and, until the first, estimated from the weights (the model,
    AdamW's two moments and their fp32 copies at ~200 MB/s), so that a stop for the time limit
    leaves room for one. `save()` returns the checkpoint written, or None (a failed save: the
    loop goes on); `path` is the newest this session wrote."""

    def __init__(self, save: Callable[[], Path | None], weights: int, every_min: float):
        self._save, self.every_s = save, every_min * 60
        self.cost_s = 0.5 + weights * 16 / 200e6
        self.last, self.path = time.monotonic(), None

    def due(self) -> bool:
        return time.monotonic() - self.last > self.every_s

    def save(self) -> None:
        t0 = time.monotonic()
        self.path = self._save() or self.path
        self.cost_s, self.last = time.monotonic() - t0, time.monotonic()
