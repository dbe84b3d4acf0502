"""Sweeps: a grid of runs (sizes × learning rates × schedules), and cooldown studies.

Every combination is its own run in the registry. With cooldown points (fractions of
`steps_until`), each WSD run is trained in stages that end at those steps (its rate stays
in the constant phase: `decay_start` is fixed for the whole plan) and after each stage a
cooldown branch starts from the stage's checkpoint; the last stage goes on to
`steps_until` and decays as usual. So one long run per size gives several annealed
points, one per branch, plus its own end.

Runs go one after another on this computer, or side by side where Auto places them
(`runners.SpreadRunner`); one progress table follows them all.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from lab.config import RunConfig, UserError, check, raise_on_errors
from lab.kernel.metrics import read_metrics
from lab.kernel.schedule import run_warmup
from lab.recipes.branch import DECAY_FRAC, create_branch, parent_decay_start
from lab.recipes.points import diverged_why, run_point
from lab.runs import load_run
from lab.settle import register_run


@dataclass
class Member:
    """One run of the sweep and what follows it."""
    label: str
    run_id: str
    stages: list[int] = field(default_factory=list)  # the steps where cooldown branches start, still to reach
    final: int = 0  # the run's own steps_until
    branch_of: str | None = None


def parse_size(text: str) -> tuple[int, int]:
    """"2x64" (layers x width) -> (2, 64)."""
    try:
        layers, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UserError(f"size {text!r}: give layers x width, such as 2x64") from None
    return layers, width


def plan_configs(base: RunConfig, sizes: Sequence[tuple[int, int]] = (), lrs: Sequence[float] = (),
                 schedules: Sequence[str] = ()) -> list[tuple[str, RunConfig]]:
    """The grid: one config per combination, each checked; labels say what differs."""
    out = []
    for (size, lr, schedule) in itertools.product(sizes or [None], lrs or [None], schedules or [None]):
        cfg, parts = base, []
        if size:
            cfg = replace(cfg, layers=size[0], width=size[1])
            parts.append(f"{size[0]}x{size[1]}")
        if lr:
            cfg = replace(cfg, lr=lr)
            parts.append(f"lr {lr:g}")
        if schedule:
            cfg = replace(cfg, schedule=schedule)
            parts.append(schedule)
        if cfg.width % cfg.heads:
            cfg = replace(cfg, heads=max(h for h in range(1, cfg.heads + 1) if cfg.width % h == 0))
        raise_on_errors(check(cfg))
        out.append((" ".join(parts) or "run", cfg))
    return out


def cooldown_steps(cfg: RunConfig, fractions: Sequence[float]) -> list[int]:
    """The branch steps for fractions of `steps_until`, all in the constant phase (before the decay's
    start: a branch from there would repeat the run)."""
    start = parent_decay_start(cfg)
    steps = sorted({int(round(f * cfg.steps_until)) for f in fractions})
    bad = [s for s in steps if s <= 0 or s >= start]
    if bad:
        raise UserError(f"cooldown points {', '.join(map(str, bad))} are outside the constant phase "
                        f"(1 … {start - 1} of {cfg.steps_until} steps): give fractions below {start / cfg.steps_until:.2f}")
    return steps


class Sweep:
    def __init__(self, plans: list[tuple[str, RunConfig]], runner, *, cooldown: Sequence[float] = (),
                 decay_frac: float = DECAY_FRAC, say: Callable[[str], None] = print, poll_s: float = 30.0):
        self.runner, self.say, self.poll_s, self.decay_frac = runner, say, poll_s, decay_frac
        self.members: list[Member] = []
        self.queue: list[Member] = []
        planned = []
        for label, cfg in plans:  # every plan checked before any run is registered
            stages = []
            if cooldown:
                if cfg.schedule not in ("wsd", "inv_sqrt"):
                    raise UserError(f"{label}: cooldown branches need a wsd or inv_sqrt run, not {cfg.schedule}")
                stages = cooldown_steps(cfg, cooldown)
                # One schedule for every stage: the decay start and warmup of the whole plan.
                cfg = replace(cfg, warmup_steps=run_warmup(cfg.steps_until, cfg.warmup_steps, cfg.decay_start),
                              decay_start=parent_decay_start(cfg))
            planned.append((label, cfg, stages))
        for label, cfg, stages in planned:
            member = Member(label, "", stages, cfg.steps_until)
            first = {**cfg.to_dict(), "steps_until": stages[0] if stages else cfg.steps_until}
            # A runner that runs on one machine (this computer, the loop in this process) names it.
            member.run_id = register_run(first, machine=runner.machine or cfg.machine).id
            self.members.append(member)
            self.queue.append(member)

    # --- the loop ---------------------------------------------------------------------
    def run(self) -> list[Member]:
        active: list[Member] = []
        shown = None
        while self.queue or active:
            while self.queue:
                member = self.queue.pop(0)
                self.runner.launch(member.run_id)
                active.append(member)
                if self.runner.blocking:
                    break  # one at a time here: what it finishes may queue the next stage first
            finished = [m for m in active if self.runner.finished(m.run_id)]
            for member in finished:
                active.remove(member)
                self.queue.extend(self._after(member))
            table = self.table()
            if table != shown:
                self.say(table)
                shown = table
            if active and not finished:
                time.sleep(self.poll_s)
        return self.members

    def _after(self, member: Member) -> list[Member]:
        """What follows a finished link: the branch at the stage it reached and the next stage."""
        run = load_run(member.run_id)
        if diverged_why(run.folder) or run.status != "done" or not member.stages:
            return []
        at = member.stages.pop(0)
        if run.step != at:
            return []
        branch = create_branch(run.id, at, self.decay_frac, machine=run.cfg.machine)
        kid = Member(f"{member.label} ↘{at}", branch.id, branch_of=run.id, final=branch.cfg.steps_until)
        self.members.append(kid)
        # The next stage: the same run goes on from the stage's checkpoint to the next point.
        register_run({"steps_until": member.stages[0] if member.stages else member.final}, run.id, run.cfg.machine)
        return [kid, member]

    # --- progress ---------------------------------------------------------------------
    def table(self) -> str:
        rows = [("run", "id", "status", "step", "val loss", "point")]
        for m in self.members:
            run = load_run(m.run_id)
            why = diverged_why(run.folder)
            status = "diverged" if why else run.status
            point, reason = run_point(run)
            val = _last_val(run.folder)
            rows.append((m.label, run.id, status, f"{run.step}/{m.final}", f"{val:.4f}" if val is not None else "-",
                         "yes" if point else ("-" if run.status != "done" else reason)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _last_val(folder) -> float | None:
    vals = [r["val_loss"] for r in read_metrics(folder) if "val_loss" in r]
    return vals[-1] if vals else None


def sweep_summary(members: list[Member]) -> dict:
    """For --json: each member's run, status and point."""
    out = []
    for m in members:
        run = load_run(m.run_id)
        point, reason = run_point(run)
        out.append({"label": m.label, "run": run.id, "status": "diverged" if diverged_why(run.folder) else run.status,
                    "branch_of": m.branch_of, "point": point.to_dict() if point else None,
                    "why_not": None if point else reason})
    return {"runs": out, "points": sum(1 for r in out if r["point"])}
