"""What keeps the step fast: compiling, DDP's settings, and readings taken once per sync point.

torch.compile with an uncompiled fallback, DDP settings for two T4s, and readings (losses, grad
norms) kept on the device and read in one sync every few steps instead of one sync per step.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

# On CPU, compiling the training and evaluation graphs takes about 16 s on two cores (2-3 s
# once inductor's cache holds them) and saves a fifth to a third of each bf16 step; two cores
# train at about 200 GFLOP/s in bf16 (120 in fp32). So a run of fewer training FLOPs than this
# would lose time: the 600-step demo (5e12) took 60 s compiled against 44 s uncompiled, cold.
COMPILE_MIN_FLOPS_CPU = 1.5e13
# The loop reads its losses and agrees on stopping about this often: often enough for a
# signal or the time limit to be acted on within a second, rare enough that the GPU
# never waits for the host between steps.
SYNC_TARGET_S = 1.0
SYNC_MAX_STEPS = 64
# DDP buckets: smaller than the default 25 MB so that the last bucket, which holds the tied
# embedding (its gradient is complete only when the backward pass ends), is small, and
# the buckets before it are reduced while the backward pass still runs.
DDP_BUCKET_MB = 8


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile uses on CPU (inductor reads $CXX, else g++), if present."""
    return shutil.which(os.environ.get("CXX") or "g++")


def compile_choice(mode: str, device: torch.device, train_flops: float) -> tuple[bool, str]:
    """Whether to compile the model, and why (said in the log); `train_flops` is the work
    left in the run (6 · weights · tokens)."""
    if mode == "off":
        return False, "torch_compile is off"
    if mode == "on":
        return True, "torch_compile is on"
    if device.type == "cuda":
        return True, "a GPU (torch_compile auto)"
    if cxx_compiler() is None:
        return False, f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) for torch.compile on CPU"
    if train_flops < COMPILE_MIN_FLOPS_CPU:
        return False, (f"the run is too short to repay compiling on CPU ({train_flops:.1e} training FLOPs left; "
                       f"auto compiles from {COMPILE_MIN_FLOPS_CPU:.1e}; torch_compile on forces it)")
    return True, "CPU with a C++ compiler (torch_compile auto)"


def compile_or_eager(module: nn.Module, trial: Callable[[nn.Module], None], log: Callable[[str], None],
                     agree_ok: Callable[[bool], bool] = lambda ok: ok,
                     compiler: Callable[[nn.Module], nn.Module] = torch.compile) -> tuple[nn.Module, float | None]:
    """`module` compiled, or `module` itself when compiling fails on any rank.

    Compiling is lazy, so `trial` runs one forward and backward pass with the compiled
    module: the compile time is spent here, before the loop, and stays out of the step
    time the time limit is computed from. `agree_ok` makes all ranks take the same road.
    Returns the module to train with and the seconds compiling took (None: uncompiled).
    """
    t0 = time.monotonic()
    error = None
    try:
        compiled = compiler(module)
        trial(compiled)
    except Exception as e:  # a compiler or backend of any kind: the model still trains uncompiled
        error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    if not agree_ok(error is None):
        _reset_compiler()
        log(f"torch.compile failed ({error or 'on another rank'}); training uncompiled. "
            f"Set torch_compile off to skip the attempt.")
        return module, None
    seconds = time.monotonic() - t0
    log(f"compiled the model in {seconds:.1f} s (kept out of the step time)")
    return compiled, seconds


class EagerOnFailure:
    """A compiled model for evaluations that turns to `eager` for good the first time it fails (an
    evaluation can fail to compile where training did not): a failure costs speed, never the run."""

    def __init__(self, compiled: Callable, eager: Callable, log: Callable[[str], None]):
        self.compiled, self.eager, self.log = compiled, eager, log

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # noqa: BLE001 -- a compiler or backend of any kind: evaluate uncompiled
                self.compiled = None
                self.log(f"torch.compile failed on the evaluation ({type(e).__name__}); evaluating uncompiled")
        return self.eager(*args)


def _reset_compiler() -> None:
    try:
        torch._dynamo.reset()  # drop half-made graphs, so the uncompiled module runs plainly
    except Exception:  # noqa: BLE001 -- resetting is a courtesy; eager runs without it
        pass


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    """DDP with gradients living in the buckets (no copy into them) and buckets sized to
    overlap the reduction with the backward pass (see DDP_BUCKET_MB)."""
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=DDP_BUCKET_MB, gradient_as_bucket_view=True)


def compress_fp16(ddp: nn.parallel.DistributedDataParallel, precision: str) -> None:
    """All-reduces gradients in half precision (half the bytes over PCIe); `scripts/gpu-check`
    measures it against the full-precision reduction."""
    hook = default_hooks.bf16_compress_hook if precision == "bf16" else default_hooks.fp16_compress_hook
    ddp.register_comm_hook(dist.group.WORLD, hook)


def trial_context(wrapped: nn.Module):
    """DDP's no_sync for a trial pass: no gradient collective, so a rank whose compile
    fails cannot leave the others waiting in one."""
    return wrapped.no_sync() if isinstance(wrapped, nn.parallel.DistributedDataParallel) else nullcontext()


class Readings:
    """Per-step values (loss, grad norm) kept on the device until the next sync point,
    where they are read in one go: no host sync per step, yet every logged step keeps
    its own values.

    Under a GradScaler (`scaled`), every step is counted as skipped when its gradients
    overflowed (a non-finite grad norm: the scaler skips that step and lowers its scale), and
    a logged row of such a step is marked `"skipped": true`; `skipped` is the session's count."""

    def __init__(self, scaled: bool = False) -> None:
        self.rows: list[dict] = []
        self.losses: list[torch.Tensor] = []
        self.norms: list[torch.Tensor] = []
        self.scaled, self.skipped = scaled, 0
        self._skips: torch.Tensor | None = None  # this window's skipped steps, on the device

    def add(self, row: dict, loss: torch.Tensor, norm: torch.Tensor) -> None:
        self.rows.append(row)
        self.losses.append(loss.detach().reshape(()))
        self.norms.append(norm.detach().reshape(()))

    def count(self, norm: torch.Tensor) -> None:
        """One step taken (logged or not): under a GradScaler, counted when it was skipped."""
        if self.scaled:
            bad = torch.logical_not(torch.isfinite(norm.detach().reshape(()))).double()
            self._skips = bad if self._skips is None else self._skips + bad

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, device: torch.device, extra: list[float], reduce: Callable[[torch.Tensor], None]):
        """(rows with their loss and grad_norm, extra) after one collective: the losses and
        `extra` are summed across ranks by `reduce`; the rows are emptied."""
        loss_t = torch.stack(self.losses).double() if self.losses else torch.zeros(0, dtype=torch.float64,
                                                                                    device=device)
        both = torch.cat([loss_t.to(device), torch.tensor(extra, dtype=torch.float64, device=device)])
        reduce(both)  # the norms are not reduced: every rank has the same, after DDP's all-reduce
        norms = torch.stack(self.norms).double().to(device) if self.norms else both.new_zeros(0)
        skips = self._skips.reshape(1).to(device) if self._skips is not None else both.new_zeros(0)
        values = torch.cat([both, norms, skips]).tolist()  # the one host sync of this window
        rows, n, k = self.rows, len(self.rows), len(both)
        for row, loss, norm in zip(rows, values[:n], values[k:k + n]):
            row["loss"], row["grad_norm"] = loss, norm
            if self.scaled and not math.isfinite(norm):
                row["skipped"] = True
        self.skipped += int(values[k + n]) if self._skips is not None else 0
        self.rows, self.losses, self.norms, self._skips = [], [], [], None
        return rows, values[n:k]


def next_sync_steps(step_s: float, within_s: float = SYNC_TARGET_S) -> int:
    """Steps until the next sync point for a step of `step_s` seconds (see SYNC_TARGET_S); never
    further than `within_s` (the periodic saves and the time limit are agreed at sync points)."""
    target = min(SYNC_TARGET_S, within_s)
    if step_s <= 0 or target <= 0:
        return 1
    return max(1, min(SYNC_MAX_STEPS, int(target / step_s)))
