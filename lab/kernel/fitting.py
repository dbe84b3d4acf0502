"""When the step does not fit the card: which batch does, found by trial steps.

A step that runs out of card memory ends the session with `OutOfMemory`, whose message names the
largest batch per card that fits (each tried with one forward and backward pass, the optimizer
state still to come held aside) and the grad_accum that keeps the tokens per step.
"""
from __future__ import annotations

from typing import Callable

import torch

from lab.config import RunConfig
from lab.kernel.step import StepParts, autocast


class OutOfMemory(RuntimeError):
    """The batch does not fit the card; the message says which batch does."""


def largest_fitting(fits: Callable[[int], bool], upper: int) -> int:
    """The largest b in [0, upper] with fits(b), assuming fits is monotone (0 always fits)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def state_to_come_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of state the optimizer allocates at its first step and does not hold yet: AdamW's
    two moments, 8 bytes per fp32 weight. An out-of-memory in a session's first step comes
    before them, so a trial step must leave room for them or it advises too big a batch."""
    return sum(2 * p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"]
               if not optimizer.state.get(p))


def trial_fits(parts: StepParts, rows: int, context: int) -> bool:
    """Whether one forward and backward of `rows` rows per card fits, weights untouched.

    Under DDP on the bare model and through `autograd.grad`: after an out-of-memory mid-backward
    DDP's reducer still waits for its gradient hooks (only a finished backward resets it), and
    a backward that accumulated gradients would fire them; `autograd.grad` accumulates nothing,
    so no hook fires and no collective starts. DataParallel has no hooks: it is tried whole."""
    rt = parts.rt
    net = parts.wrapped if rt.data_parallel else parts.model
    x = torch.zeros(rows * (rt.cards if rt.data_parallel else 1), context, dtype=torch.long, device=rt.device)
    try:
        with autocast(rt):
            loss = net(x, x).mean()
        torch.autograd.grad(loss, [p for p in parts.model.parameters() if p.requires_grad])
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        if rt.device.type == "cuda":
            torch.cuda.empty_cache()


def fitting_batch(parts: StepParts, batch_per_card: int, context: int) -> int:
    """The largest batch per card below `batch_per_card` that fits by trial steps, with the
    optimizer state still to come held aside (0: not even one row fits)."""
    parts.optimizer.zero_grad(set_to_none=True)
    cuda = parts.rt.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
    try:
        reserve = torch.empty(state_to_come_bytes(parts.optimizer) if cuda else 0, dtype=torch.uint8,
                              device=parts.rt.device)
    except torch.cuda.OutOfMemoryError:
        return 0
    try:
        return largest_fitting(lambda rows: trial_fits(parts, rows, context), batch_per_card - 1)
    finally:
        del reserve


def out_of_memory_advice(parts: StepParts, cfg: RunConfig) -> str:
    """The message for a step that ran out of card memory: which batch fits, and the grad_accum
    that keeps the tokens per step."""
    device = parts.rt.device
    fits = fitting_batch(parts, cfg.batch_per_card, cfg.context)
    if device.type == "cuda":
        card = f"{torch.cuda.get_device_name(device)}, {torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB"
    else:
        card = device.type
    keep = -(-cfg.batch_per_card * cfg.grad_accum // fits) if fits else None
    advice = (f"batch_per_card {fits} fits (measured by a trial step)" + (
        f"; to keep the tokens per step, use grad_accum {keep}" if keep and keep != cfg.grad_accum else "")
        if fits else "not even batch 1 fits: lower context or the model size")
    return (f"CUDA out of memory at batch_per_card {cfg.batch_per_card} ({card}): lower the batch per card — "
            f"{advice}")
