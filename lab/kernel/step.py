"""One training step, written out, and what it runs on.

Where the step runs (`Runtime`: rank, device, precision, cards), the precision rule, the model as
it trains on several cards, the optimizer, and the step itself (`one_step`): forward under
autocast, scaled backward, unscale, clip, step. Nothing here reads the data or knows the run's
folder: the loop drives the step with batches from the token shards, the account probe
(`lab.trial.worker`) with random tokens.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn

from lab.config import RunConfig
from lab.kernel.cpu import cpu_precision
from lab.kernel.speed import wrap_ddp


@dataclass
class Runtime:
    """Where this process trains: its rank among `world` processes, device, precision and cards."""
    rank: int
    world: int
    device: torch.device
    precision: str
    cards: int  # cards one optimizer step spans: world under DDP, the GPUs under DataParallel
    data_parallel: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def pick_precision(device: torch.device, requested: str = "auto") -> str:
    """On CUDA, bf16 from compute capability 8.0 (Ampere) on, else fp16; on a CPU, bf16 where
    it multiplies bf16 in hardware, else fp32 (`config.cpu_precision`).

    `torch.cuda.is_bf16_supported()` says True on a T4 (7.5), where bf16 is emulated and
    slow, so the capability decides.
    """
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return cpu_precision()
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


def autocast(rt: Runtime):
    if rt.precision == "fp32":
        return nullcontext()
    dtype = torch.float16 if rt.precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=rt.device.type, dtype=dtype)


class Autocast(nn.Module):
    """`module` with the run's autocast entered inside its own forward. DataParallel runs each
    replica's forward in a thread of its own and re-enters autocast there with `enabled` only;
    the dtype is then the thread's default, fp16 on CUDA, so a bf16 run would train in fp16
    without a GradScaler. Entered here, it is the run's dtype in every thread."""

    def __init__(self, module: nn.Module, rt: Runtime):
        super().__init__()
        self.module, self.rt = module, rt

    def forward(self, *args):
        with autocast(self.rt):
            return self.module(*args)


def wrap_for(model: nn.Module, rt: Runtime) -> nn.Module:
    """The model as it trains: DDP across processes, DataParallel across one process's cards,
    else the model itself."""
    if rt.world > 1:
        return wrap_ddp(model, rt.device)
    if rt.data_parallel:
        return nn.DataParallel(Autocast(model, rt))
    return model


def make_optimizer(model: nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    # Decay matrices and embeddings, not vectors (this model has none, but a variant might).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    # Fused: one kernel for all weights, and under GradScaler no host sync to check for inf.
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **fused)


class Batches(Protocol):
    """Where a step's micro-batches come from: `take` gives one on the device, `prepare` may
    read the next one ahead while the card works (`data.Prefetcher` does)."""

    def take(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def prepare(self, step: int, micro: int) -> None: ...


@dataclass
class StepParts:
    """What one optimizer step touches."""
    model: nn.Module  # the bare model: clipped, saved, tried
    wrapped: nn.Module  # the model as it trains (`wrap_for`): DDP's gradient sync lives here
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    rt: Runtime
    forward: nn.Module | None = None  # `wrapped`, compiled or not (None: `wrapped` itself)

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = self.wrapped


def one_step(parts: StepParts, batches: Batches, step: int, lr: float, accum: int = 1,
             clip: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimizer step `step` over `accum` micro-batches; returns (loss, grad norm), both still on
    the device: reading them here would make the host wait for the card every step."""
    rt, optimizer, scaler = parts.rt, parts.optimizer, parts.scaler
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=rt.device)
    for micro in range(accum):
        x, y = batches.take(step, micro)
        # Gradients are all-reduced only on the last micro-batch.
        sync = rt.world == 1 or micro == accum - 1
        with (nullcontext() if sync else parts.wrapped.no_sync()):
            with autocast(rt):
                loss = parts.forward(x, y).mean() / accum
            scaler.scale(loss).backward()
        total += loss.detach()
        # The next batch is read while the card still works through this backward pass.
        last = micro == accum - 1
        batches.prepare(step + 1 if last else step, 0 if last else micro + 1)
    scaler.unscale_(optimizer)
    # Measured without clipping too (an infinite max_norm scales by exactly 1): under the GradScaler
    # a step whose gradients overflowed shows as a non-finite norm, and that step is skipped.
    norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), clip if clip > 0 else float("inf"))
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm
