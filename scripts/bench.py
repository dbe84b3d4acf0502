#!/usr/bin/env python3
"""Training speed of one model size on this machine: prints one JSON line.

    scripts/bench.py --context 1024 --width 512 --heads 8 --layers 8 --batch-per-card 6 --steps 5

Runs the real training step (model, AdamW, autocast, GradScaler, clipping) on random
tokens, so it needs no prepared data. MFU is against the device's peak dense matmul
rate for the precision used; the table holds the cards the lab meets.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lab.kernel.model import GPT  # noqa: E402
from lab.kernel.train import autocast, make_optimizer, pick_precision, Runtime  # noqa: E402
from lab.config import RunConfig  # noqa: E402

# Peak dense TFLOP/s by card, for fp16/bf16 tensor cores (fp32 where that is all there is).
PEAK_TFLOPS = {
    "T4": 65.0, "P100": 18.7, "V100": 125.0, "A100": 312.0, "A10": 125.0, "L4": 121.0, "A40": 149.7,
    "RTX 3050": 36.0, "RTX 3060": 51.0, "RTX 3090": 71.0, "RTX 4090": 165.0, "H100": 989.0, "H200": 989.0,
}


def peak_for(name: str) -> float | None:
    if os.environ.get("LAB_PEAK_TFLOPS"):
        return float(os.environ["LAB_PEAK_TFLOPS"])
    for key, value in PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return value
    return None


def flops_per_token(layers: int, width: int, context: int, weights: int) -> int:
    # 6·N for the matmuls forward and backward, plus attention's scores and values: 12·L·n·d.
    return 6 * weights + 12 * layers * context * width


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource  # the process's peak resident set: the CPU's "card memory"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--batch-per-card", type=int, default=6)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", default="auto")
    a = p.parse_args()

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rt = Runtime(0, 1, device, pick_precision(device, a.precision), cards=1)
    torch.manual_seed(0)
    model = GPT(a.vocab, a.context, a.width, a.heads, a.layers).to(device)
    opt = make_optimizer(model, RunConfig(), device)
    scaler = torch.amp.GradScaler(device.type, enabled=rt.precision == "fp16")
    x = torch.randint(0, a.vocab, (a.batch_per_card, a.context), device=device)
    y = torch.randint(0, a.vocab, (a.batch_per_card, a.context), device=device)

    def step() -> None:
        with autocast(rt):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    seconds = (time.perf_counter() - t0) / a.steps
    weights = model.num_weights()
    tokens = a.batch_per_card * a.context
    fpt = flops_per_token(a.layers, a.width, a.context, weights)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peak = peak_for(name)
    tok_s = tokens / seconds
    print(json.dumps({
        "device": name, "precision": rt.precision, "weights": weights, "tokens_per_step": tokens,
        "tok_s": round(tok_s, 1), "ms_per_step": round(seconds * 1000, 2),
        "peak_memory_gb": round(peak_memory_bytes(device) / 1e9, 3),
        "flops_per_token": fpt, "achieved_tflops": round(tok_s * fpt / 1e12, 3),
        "peak_tflops": peak, "mfu": round(tok_s * fpt / (peak * 1e12), 4) if peak else None,
    }))


if __name__ == "__main__":
    main()
