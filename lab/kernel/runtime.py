"""Where and how this process trains: its device and process group, its precision, whether its
model is compiled, its random state.

`setup_runtime` reads torchrun's environment: under torchrun each process takes its own card and
joins the process group (nccl on GPU, gloo on CPU); alone, it takes the first card, or all of them
under DataParallel. `compile_model` compiles the training forward where it pays (`speed`). The
random state (Python's, NumPy's, torch's, each card's) is saved in every checkpoint, so a resumed
run draws what it would have drawn.
"""
from __future__ import annotations

import os
import random
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from lab.config import RunConfig, card_set, flops_per_token
from lab.kernel.launch import COLLECTIVE_TIMEOUT_MIN
from lab.kernel.ranks import agree
from lab.kernel.speed import EagerOnFailure, compile_choice, compile_or_eager, trial_context
from lab.kernel.step import Runtime, autocast, pick_precision


def setup_runtime(cfg: RunConfig) -> Runtime:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            # A rank left waiting in a collective (its peer crashed or hangs) fails within minutes.
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=timedelta(minutes=COLLECTIVE_TIMEOUT_MIN))
        return Runtime(rank, world, device, pick_precision(device, cfg.precision), cards=world)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    gpus = torch.cuda.device_count()
    use_dp = cfg.parallel == "dp" and gpus > 1
    return Runtime(0, 1, device, pick_precision(device, cfg.precision), cards=gpus if use_dp else 1,
                   data_parallel=use_dp)


def precision_warning(device: torch.device, precision: str) -> str | None:
    """What a forced precision costs on this card, for the log: bf16 below compute capability
    8.0 (a T4) trains, but without bf16 tensor cores and with the slowest attention kernel (the
    flash and memory-efficient ones take bf16 only from 8.0). Warned, not refused: the session
    has started by now, and a slow run is still a correct one."""
    if device.type != "cuda" or precision != "bf16":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:
        return None
    return (f"warning: precision bf16 on {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}): "
            f"this card has no bf16 tensor cores, so bf16 is emulated and attention takes its slowest kernel; "
            f"expect steps several times slower. precision auto trains in fp16 with a GradScaler here")


def describe_runtime(rt: Runtime, vocab: int) -> dict:
    """What a session trained on, as its device.json says it: the card set, precision, processes."""
    name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    return {"gpu": card_set(name, rt.cards), "device": rt.device.type, "name": name, "cards": rt.cards,
            "precision": rt.precision, "world": rt.world, "vocab": vocab, "torch": torch.__version__,
            "threads": torch.get_num_threads()}  # a CPU's speed is its threads' (lab.sizing.priors)


def compile_model(trainer) -> None:
    """Compiles a `train.Trainer`'s training forward when the config and the machine call for it
    (`speed.compile_choice`), with one trial pass so compiling happens now, not in step one; its
    evaluations then go through the compiled model too (uncompiled again if that fails)."""
    cfg, rt, parts = trainer.cfg, trainer.rt, trainer.parts
    work = flops_per_token(cfg.layers, cfg.width, trainer.data.vocab, cfg.context) * trainer.tokens_per_step \
        * (cfg.steps_until - trainer.step)
    wanted, why = compile_choice(cfg.torch_compile, rt.device, work)
    if not wanted:
        trainer.log(f"not compiling: {why}")
        return
    trainer.log(f"compiling the model: {why}")
    parts.forward, trainer.compile_s = compile_or_eager(
        parts.wrapped, lambda forward: _trial_pass(trainer, forward), trainer.log,
        agree_ok=lambda ok: agree([0.0 if ok else 1.0], rt)[0] == 0.0)
    if trainer.compile_s is not None:  # evaluations must stay within 3% of a session: compiled too
        trainer.eval_model = EagerOnFailure(parts.forward, trainer.eval_model, trainer.log)


def _trial_pass(trainer, forward: nn.Module) -> None:
    x = torch.zeros(trainer.rows, trainer.cfg.context, dtype=torch.long, device=trainer.rt.device)
    try:
        with trial_context(trainer.parts.wrapped), autocast(trainer.rt):
            loss = forward(x, x).mean()
        loss.backward()
    finally:
        trainer.parts.optimizer.zero_grad(set_to_none=True)


def rng_state() -> dict:
    """This process's RNG states as tensors and plain values (a checkpoint loads as data)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    # Format 1 kept NumPy's own array; format 2 a tensor of the same keys.
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((name, keys.astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
