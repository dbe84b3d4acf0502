"""Cooldown branches: a short decay from a checkpoint of a WSD run in its constant phase.

A branch from step S ends at S / (1 − f), decaying over its last fraction f: its final val
loss is what a run ending at that many tokens would reach (MiniCPM's trick: one long
run, many D). The branch is a child run in the registry (`parent = {"run", "checkpoint",
"step"}`); it holds its own copy of the start checkpoint (the parent keeps only its newest
two) and the parent's curve up to S, so its plot reads as one line that bends down at S.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints, place_checkpoint, verify_checkpoint
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.kernel.schedule import run_warmup
from lab.machines.control import spawn_driver
from lab.recipes.points import is_branch
from lab.runs import Run, list_runs, load_run
from lab.settle import register_run

DECAY_FRAC = 0.2
BRANCHABLE = ("wsd", "inv_sqrt")  # schedules with a phase before their decay


def parent_decay_start(cfg: RunConfig) -> int:
    """The step where the run's own decay begins (its constant phase ends)."""
    return cfg.decay_start or cfg.steps_until - int(cfg.decay_frac * cfg.steps_until)


def branch_config(parent: RunConfig, at: int, decay_frac: float = DECAY_FRAC) -> RunConfig:
    """The branch's fields: the parent's, ending at at/(1−f) with the decay starting at `at`.
    Refused, in both languages, where the branch could only repeat its parent."""
    if not 0 < decay_frac < 1:
        raise UserError(f"--decay-frac must lie between 0 and 1 (the lab uses 0.1–0.2), got {decay_frac}",
                        ru=f"доля спада должна лежать между 0 и 1 (лаба берёт 0,1–0,2), а не {decay_frac}")
    why = unbranchable(parent, at)
    if why:
        raise UserError(why[0], ru=why[1])
    warmup = run_warmup(parent.steps_until, parent.warmup_steps, parent.decay_start)
    # The parent's warmup as it ran: with decay_start set it is taken as given.
    return replace(parent, steps_until=max(at + 1, math.ceil(at / (1 - decay_frac))), decay_start=at,
                   decay_frac=decay_frac, resume_from="", warmup_steps=warmup)


def unbranchable(parent: RunConfig, at: int) -> tuple[str, str] | None:
    """Why a cooldown branch of a run with these fields cannot start at step `at` (English,
    Russian), or None. A branch starts after the warmup and before where the run's own decay
    began: from there on it would decay as the run itself did, and end with the run's own losses."""
    if parent.schedule not in BRANCHABLE:
        return (f"a cooldown branch needs a run with a constant phase (wsd or inv_sqrt); this run's schedule is "
                f"{parent.schedule}: its rate already falls everywhere",
                f"ветке охлаждения нужен прогон с постоянной фазой (wsd или inv_sqrt); у этого прогона расписание "
                f"{parent.schedule}: его скорость и так падает везде")
    warmup = run_warmup(parent.steps_until, parent.warmup_steps, parent.decay_start)
    if at <= warmup:
        return (f"step {at:,} is still in the run's warmup ({warmup:,} steps): branch from a later checkpoint",
                f"шаг {_ru(at)} ещё в разгоне прогона ({_ru(warmup)} шагов): возьмите чекпоинт позже")
    start = parent_decay_start(parent)
    if at >= start:
        return (f"step {at:,} is not before the run's own decay (from step {start:,}): a branch from it would only "
                f"repeat the run; branch from a checkpoint of its constant phase, before step {start:,}",
                f"шаг {_ru(at)} не раньше спада самого прогона (с шага {_ru(start)}): ветка оттуда лишь повторит "
                f"прогон; возьмите чекпоинт его постоянной фазы, раньше шага {_ru(start)}")
    return None


def _ru(n: int) -> str:
    return f"{n:,}".replace(",", "\u00a0")  # a no-break space: the number never breaks across lines


def branch_steps(run: Run) -> list[int]:
    """The steps of the run's kept checkpoints a cooldown branch can start from, oldest first."""
    steps = [checkpoint_step(p) for p in list_checkpoints(run.folder / "checkpoints")]
    return [s for s in steps if unbranchable(run.cfg, s) is None]


def checkpoint_at(run: Run, at: int) -> Path:
    """The parent's whole checkpoint at step `at`; the error names the steps there are."""
    found = {checkpoint_step(p): p for p in list_checkpoints(run.folder / "checkpoints")}
    if at not in found:
        steps = ", ".join(f"{s:,}" for s in sorted(found)) or "none"
        raise UserError(f"run {run.id} has no checkpoint at step {at:,} (it has: {steps}); a run keeps its "
                        f"newest two, so branch while it is there, or let `lab sweep --cooldown` stage the run")
    problem = verify_checkpoint(found[at])
    if problem:
        raise UserError(f"checkpoint {found[at]} is unusable: {problem}")
    return found[at]


def create_branch(parent_ref: str, at: int, decay_frac: float = DECAY_FRAC, machine: str | None = None) -> Run:
    """Registers the branch (nothing runs yet): config, start checkpoint, the parent's curve to `at`."""
    parent = load_run(parent_ref)
    cfg = branch_config(parent.cfg, at, decay_frac)
    ckpt = checkpoint_at(parent, at)
    run = register_run(cfg.to_dict(), str(ckpt), machine or parent.cfg.machine or "auto")
    place_checkpoint(ckpt, run.folder / "checkpoints")
    write_metrics_lines(run.folder / "metrics.jsonl", metrics_lines(parent.folder, upto=at))
    return load_run(run.id)


def start_branch(parent_ref: str, at: int, decay_frac: float = DECAY_FRAC, machine: str | None = None) -> str:
    """Registers the branch and drives it in the background, like any run; returns its id."""
    run = create_branch(parent_ref, at, decay_frac, machine)
    spawn_driver(run.id)
    return run.id


def branches_of(run_id: str, runs: list[Run] | None = None) -> list[Run]:
    """The cooldown branches of a run, by the step they branch from."""
    if runs is None:
        runs = list_runs()
    kids = [r for r in runs if (r.parent or {}).get("run") == run_id and is_branch(r)]
    return sorted(kids, key=lambda r: r.parent.get("step", 0))
