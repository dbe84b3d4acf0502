"""More steps for a run that has decayed: where the grown run starts, and how its rate goes on.

A WSD run that reached its end has cooled down to its floor rate. Raising its `steps_until` and
going on from its last checkpoint would put the rate straight back at its peak (the new schedule's
stable phase): the loss climbs and the cooldown is wasted. The scaling-laws note's way is to grow
from the stable phase: go on from the last checkpoint before the decay began, so the new decay
comes at the new end (`from-stable`; the kernel saves a checkpoint where the decay begins and keeps
it, `lab.kernel.checkpoint.pre_decay_checkpoint`). Where that checkpoint is gone (a run trained
before the kit kept it), or the schedule has no stable phase (cosine, linear), the grown run goes
on from its last checkpoint and re-warms: a short straight rise from the rate the run had reached
to the new schedule's (`rewarm`; fields of the run, so every later session's rate is the same
function of the step).

`grow_plan` says which, with the fields the grown run takes and the words for the person, in
English and Russian. It only plans: the caller registers the run. A from-stable plan sets aside
the checkpoints after its start (the old decay, `set_aside`): a resume in the same folder would
take the newest, so the grown run belongs in a folder of its own (a child run, as a cooldown
branch is) or those checkpoints must move out of the way first.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint
from lab.kernel.schedule import decay_start_for_config, lr_for_config, run_warmup

FROM_STABLE, REWARM = "from-stable", "rewarm"


@dataclass(frozen=True)
class GrowPlan:
    checkpoint: Path  # the checkpoint the grown run starts from
    step: int  # its step
    mode: str  # FROM_STABLE or REWARM
    fields: dict  # what the grown run's config takes over the old one's (`config`); a re-warm before
    # (rewarm_*) stays where from-stable starts: it may start inside it
    words_en: str
    words_ru: str
    set_aside: tuple[Path, ...] = field(default=())  # the checkpoints after `checkpoint`: the old decay

    def config(self, old: RunConfig) -> RunConfig:
        """The grown run's config: the old one with the plan's fields."""
        return replace(RunConfig.from_dict(old.to_dict()), **self.fields)

    def words(self, lang: str = "en") -> str:
        return self.words_ru if lang == "ru" else self.words_en


def grow_plan(checkpoints: str | os.PathLike | list[Path], old_cfg: RunConfig, new_steps_until: int,
              verify: bool = True) -> GrowPlan:
    """How a run of `old_cfg` (its current config) grows to `new_steps_until`. `checkpoints`: its
    run folder, its checkpoints folder or its checkpoint files. From-stable where a whole
    checkpoint at or before the decay's start is there (for a run still in its stable phase that
    is its newest), else a re-warm from the newest whole one. An error when there is no whole
    checkpoint or `new_steps_until` is not above the newest's step. `verify`: each candidate's
    sha256 is checked (reading it whole); without, a committed save counts (a form's preview)."""
    found = _checkpoints(checkpoints)

    def whole(p: Path) -> bool:
        return not verify or verify_checkpoint(p) is None
    newest = next((p for p in reversed(found) if whole(p)), None)
    if newest is None:
        raise UserError("the run has no whole checkpoint to grow from: continue it from scratch or from another run",
                        ru="у прогона нет целого чекпоинта, от которого продолжать")
    if new_steps_until <= checkpoint_step(newest):
        raise UserError(f"steps until {new_steps_until:,} is not above the run's step {checkpoint_step(newest):,}: "
                        f"raise it to grow the run",
                        ru=f"«Шагов до» {_ru(new_steps_until)} не больше шага прогона {_ru(checkpoint_step(newest))}: "
                           f"увеличьте, чтобы продолжить")
    warmup = run_warmup(old_cfg.steps_until, old_cfg.warmup_steps, old_cfg.decay_start)
    # The warmup the run had, pinned: a longer run would otherwise get a longer one (a tenth of it).
    fields = {"steps_until": new_steps_until, "warmup_steps": warmup, "decay_start": _decay_start(old_cfg, new_steps_until)}
    decay = decay_start_for_config(old_cfg)
    stable = [p for p in found if decay is not None and checkpoint_step(p) <= decay]
    start = next((p for p in reversed(stable) if whole(p)), None)
    if start is not None:
        return _from_stable(start, found, old_cfg, fields, decay)
    return _rewarm(newest, old_cfg, fields, decay)


def _checkpoints(where: str | os.PathLike | list[Path]) -> list[Path]:
    if isinstance(where, list):
        return sorted((Path(p) for p in where), key=checkpoint_step)
    where = Path(where)
    return list_checkpoints(where / "checkpoints") or list_checkpoints(where)


def _decay_start(old: RunConfig, new_until: int) -> int:
    """The grown run's `decay_start`: 0 stays 0 (the decay takes the last `decay_frac` of the new
    steps); a step set where the run decays moves with its end (the decay keeps its length); a
    step at or past the old end (a stage of a longer plan) stays."""
    if old.decay_start <= 0 or old.decay_start >= old.steps_until:
        return old.decay_start
    return old.decay_start + new_until - old.steps_until


def _from_stable(start: Path, found: list[Path], old: RunConfig, fields: dict, decay: int) -> GrowPlan:
    step = checkpoint_step(start)
    grown = replace(RunConfig.from_dict(old.to_dict()), **fields)
    new_decay, rate, until = decay_start_for_config(grown), lr_for_config(step, grown), fields["steps_until"]
    later = tuple(p for p in found if checkpoint_step(p) > step)
    if not later:
        en = (f"continues from step {step:,}, still before its decay: the rate stays {rate:.2e} and now decays from "
              f"step {new_decay:,} to {until:,}")
        ru = (f"продолжает с шага {_ru(step)}, ещё до спада: скорость остаётся {_rate_ru(rate)} и теперь спадает с шага "
              f"{_ru(new_decay)} до {_ru(until)}")
    else:
        en = (f"continues from step {step:,}, its last checkpoint before the decay began (step {decay:,}), so the new "
              f"decay comes at the new end: from step {new_decay:,} to {until:,} (the rate there: {rate:.2e}); the old "
              f"decay's checkpoints ({', '.join(f'{checkpoint_step(p):,}' for p in later)}) are set aside")
        ru = (f"продолжает с шага {_ru(step)}, последнего чекпоинта до начала спада (шаг {_ru(decay)}), и новый спад "
              f"придётся на новый конец: с шага {_ru(new_decay)} до {_ru(until)} (скорость там {_rate_ru(rate)}); "
              f"чекпоинты старого спада ({', '.join(_ru(checkpoint_step(p)) for p in later)}) откладываются")
    return GrowPlan(start, step, FROM_STABLE, fields, en, ru, later)


def _rewarm(newest: Path, old: RunConfig, fields: dict, decay: int | None) -> GrowPlan:
    """From the newest checkpoint, the rate rising from where it had reached (the old schedule's rate
    for the step before) to the new schedule's over the run's warmup, at most a tenth of the new steps."""
    step, until = checkpoint_step(newest), fields["steps_until"]
    reached = lr_for_config(step - 1, old)
    steps = max(1, min(max(fields["warmup_steps"], 1), (until - step) // 10))
    fields = {**fields, "rewarm_at": step, "rewarm_steps": steps, "rewarm_from_frac": reached / old.lr}
    if decay is not None:  # the new decay begins once the re-warm is done, never inside it
        natural = decay_start_for_config(replace(RunConfig.from_dict(old.to_dict()), **fields))
        fields["decay_start"] = fields["decay_start"] if natural >= step + steps else step + steps
    target = lr_for_config(step + steps, replace(RunConfig.from_dict(old.to_dict()), **fields))
    why_en = ("no checkpoint from before its decay is left" if decay is not None
              else f"a {old.schedule} schedule has no stable phase to go back to")
    why_ru = ("чекпоинта до спада не осталось" if decay is not None
              else f"у расписания {old.schedule} нет ровной части, куда вернуться")
    en = (f"continues from its last checkpoint, step {step:,} ({why_en}): the rate rises over {steps:,} steps from "
          f"{reached:.2e}, where the run had reached, to {target:.2e}, then follows the schedule to step {until:,}")
    ru = (f"продолжает с последнего чекпоинта, шага {_ru(step)} ({why_ru}): скорость за {_ru(steps)} шагов поднимается "
          f"от {_rate_ru(reached)}, до которой прогон дошёл, до {_rate_ru(target)}, дальше — по расписанию до шага "
          f"{_ru(until)}")
    return GrowPlan(newest, step, REWARM, fields, en, ru)


def _ru(n: int) -> str:
    return f"{n:,}".replace(",", "\u00a0")  # Russian groups thousands with a (no-break) space


def _rate_ru(rate: float) -> str:
    return f"{rate:.2e}".replace(".", ",")
