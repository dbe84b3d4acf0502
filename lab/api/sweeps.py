"""Sweeps: a grid of runs (sizes, learning rates, schedules), each WSD run staged with cooldown
branches, run one after another here or spread over the lab's free machines; their points for
the L(N, D) fit (`lab sweep`).

    run(fields, sizes, lrs, ...)   plans the grid around the base run's fields, runs it to its end
                                   and returns how many runs it made and its summary
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lab.api.accounts import names as accounts
from lab.config import RunConfig
from lab.recipes import runners
from lab.recipes.branch import DECAY_FRAC
from lab.recipes.sweep import Sweep, parse_size, plan_configs, sweep_summary


@dataclass(frozen=True)
class Swept:
    runs: int
    summary: dict  # {"points", ...}: lab.recipes.sweep.sweep_summary


def run(fields: dict, sizes: list[str], lrs: list[float], schedules: list[str], cooldown: list[float],
        decay_frac: float | None = None, machine: str = "auto", inline: bool = False,
        say: Callable[[str], None] = print, poll_s: float = 30.0) -> Swept:
    """Plans the grid around the base run `fields` (every size × rate × schedule; `cooldown`:
    branches of each WSD run at these fractions of its steps), checks every plan before any run is
    registered, and runs it: `inline` in this process without the notebook, else on `machine`."""
    runner, machine = _runner(inline, machine)
    base = RunConfig.from_dict({**fields, "machine": machine})
    plans = plan_configs(base, [parse_size(s) for s in sizes], lrs, schedules)
    sweep = Sweep(plans, runner, cooldown=cooldown, say=say, poll_s=poll_s, decay_frac=decay_frac or DECAY_FRAC)
    members = sweep.run()
    return Swept(len(members), sweep_summary(members))


def _runner(inline: bool, machine: str) -> tuple[object, str]:
    """How the sweep runs its runs, and the machine they are registered for."""
    if inline:
        return runners.InlineRunner(), "inline"
    if machine == "local" or (machine == "auto" and not accounts()):
        return runners.LocalRunner(), "local"  # Auto without accounts runs here: one after another
    return runners.SpreadRunner(), machine
