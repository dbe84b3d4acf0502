"""Learning-rate schedules: pure functions of the step, decaying towards `steps_until`.

Being pure, a resumed run needs no scheduler state: the rate at step s is the same
whether the run got there in one session or five. A run continued with a raised
`steps_until` follows the new value; under WSD it does so without a jump as long as it
is still in the constant phase; a finished one re-warms or grows from before its decay
(`lab.settle.grow`).
"""
from __future__ import annotations

import math


def warmup_for(steps_until: int, warmup_steps: int) -> int:
    # Short runs (tests, the demo) would otherwise never leave warmup.
    return max(0, min(warmup_steps, steps_until // 10))


def run_warmup(steps_until: int, warmup_steps: int, decay_start: int = 0) -> int:
    """The warmup a run actually gets. With `decay_start` set the plan is explicit (a stage of
    a long run, a cooldown branch), so `warmup_steps` is taken as given, never past the decay."""
    if decay_start > 0:
        return max(0, min(warmup_steps, decay_start))
    return warmup_for(steps_until, warmup_steps)


def lr_at(step: int, *, schedule: str, lr: float, steps_until: int, warmup_steps: int = 200,
          decay_frac: float = 0.2, min_lr_frac: float = 0.1, decay_start: int = 0) -> float:
    """The rate for the optimizer step that takes the model from `step` to `step + 1`.

    `decay_start` (WSD and inv_sqrt; 0: from `decay_frac`) fixes the step where the decay
    begins. A cooldown branch from step S of a WSD run sets it to S: the branch holds the
    parent's rate up to S and decays from there to `steps_until`. A run whose `steps_until`
    is not above `decay_start` never decays (it ends in its constant phase): stages of one
    long run share its rate. See `run_warmup` for the warmup."""
    warmup = run_warmup(steps_until, warmup_steps, decay_start)
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = lr * min_lr_frac
    if step >= steps_until:
        return floor
    if schedule in ("cosine", "linear"):
        progress = (step - warmup) / max(1, steps_until - warmup)
        if schedule == "cosine":
            return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return lr - (lr - floor) * progress
    if schedule not in ("wsd", "inv_sqrt"):
        raise ValueError(f"unknown schedule {schedule!r}")
    if decay_start <= 0:
        decay_start = steps_until - int(decay_frac * steps_until)
    # inv_sqrt: 1/√t after warmup, then the same final cooldown as WSD so it ends at the floor.
    peak = lr if schedule == "wsd" else lr * math.sqrt(max(1, warmup) / max(min(step, decay_start), warmup, 1))
    if step < decay_start:
        return peak
    progress = (step - decay_start) / max(1, steps_until - decay_start)
    return peak - (peak - floor) * progress


def lr_for_config(step: int, cfg) -> float:
    """`lr_at` for the run's fields, with a grown run's re-warm: straight from `rewarm_from_frac` · lr
    at `rewarm_at` to the rate `rewarm_steps` later."""
    if 0 <= step - cfg.rewarm_at < cfg.rewarm_steps:
        start, end = cfg.lr * cfg.rewarm_from_frac, lr_for_config(cfg.rewarm_at + cfg.rewarm_steps, cfg)
        return start + (end - start) * (step - cfg.rewarm_at) / cfg.rewarm_steps
    return lr_at(step, schedule=cfg.schedule, lr=cfg.lr, steps_until=cfg.steps_until,
                 warmup_steps=cfg.warmup_steps, decay_frac=cfg.decay_frac, min_lr_frac=cfg.min_lr_frac,
                 decay_start=cfg.decay_start)


def decay_start_for_config(cfg) -> int | None:
    """The step where the rate starts to decay (wsd, inv_sqrt); None for cosine and linear."""
    if cfg.schedule not in ("wsd", "inv_sqrt"):
        return None
    return cfg.decay_start or cfg.steps_until - int(cfg.decay_frac * cfg.steps_until)
