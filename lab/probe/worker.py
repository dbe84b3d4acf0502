"""The probe's worker, run by torchrun inside the probe session (one process per card).

It checks that the cards talk (one all-reduce, its result checked and timed: NCCL on GPUs, gloo
on CPU), then trains the lab's GPT (lab.kernel.model, pasted before this in the probe notebook)
for a short burst with the training loop's step: DDP, fp16 with a GradScaler below compute
capability 8.0 (a T4), bf16 above, fp32 on CPU (tests only), fused AdamW, gradient clipping. Random tokens:
speed does not depend on what is read. Rank 0 writes the figures as JSON to argv[1] and the
burst's rows as metrics.jsonl beside it, as a run would, so the calculator reads the measured
speed the way it reads a run's.

    python -m torch.distributed.run --standalone --nproc_per_node N lab_probe_worker.py OUT.json SIZE_JSON STEPS
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from lab.kernel.model import GPT


def precision_for(device: torch.device) -> str:
    """As the training loop picks it on a GPU (lab.kernel.train.pick_precision). On CPU, where the
    probe only runs in tests, fp32: the loop's CPU rule lives in lab.config, not pasted here."""
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_reduce_check(device: torch.device, world: int, megabytes: float) -> dict:
    """One warm-up and one timed all-reduce of `megabytes` of fp32 ones: every element must
    come back as `world`."""
    x = torch.ones(int(megabytes * 1e6 / 4), device=device)
    dist.all_reduce(x)
    x.fill_(1.0)
    sync(device)
    t0 = time.perf_counter()
    dist.all_reduce(x)
    sync(device)
    seconds = time.perf_counter() - t0
    ok = bool(torch.all(x == world).item())
    # Bus bandwidth as nccl-tests defines it for all-reduce: bytes × 2(world-1)/world per second.
    busbw = x.numel() * 4 * 2 * (world - 1) / world / max(seconds, 1e-9) / 1e9
    return {"ok": ok, "megabytes": megabytes, "seconds": round(seconds, 6), "bus_gb_s": round(busbw, 3)}


def burst(device: torch.device, rank: int, world: int, size: dict, steps: int, out: Path | None) -> dict:
    """`steps` training steps at `size`; rows of metrics.jsonl (rank 0); the median tokens/s of
    the steps after the first ten (compilation of kernels, allocator warm-up)."""
    torch.manual_seed(1234 + rank)
    model = GPT(size["vocab"], size["context"], size["width"], size["heads"], size["layers"]).to(device)
    wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    precision = precision_for(device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), **fused)
    rows, tokens_per_step = size["batch_per_card"], size["batch_per_card"] * world * size["context"]
    x = torch.randint(0, size["vocab"], (rows, size["context"] + 1), device=device)
    records, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        if dtype is None:
            loss = wrapped(x[:, :-1], x[:, 1:])
        else:
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = wrapped(x[:, :-1], x[:, 1:])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sync(device)
        dt = time.perf_counter() - t0
        records.append({"step": step, "tokens": step * tokens_per_step, "loss": float(loss.item()),
                        "tok_s": tokens_per_step / max(dt, 1e-9), "elapsed_s": round(time.perf_counter() - started, 3),
                        "session": 1})
    if out is not None:
        out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    steady = sorted(r["tok_s"] for r in records[10:]) or [records[-1]["tok_s"]]
    return {"tok_s": round(steady[len(steady) // 2], 1), "steps": steps, "precision": precision,
            "tokens_per_step": tokens_per_step, "size": size, "weights": model.num_weights(),
            "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
            "peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 3) if device.type == "cuda"
            else None}


def worker_main(argv: list[str]) -> None:
    out, size, steps = Path(argv[0]), json.loads(argv[1]), int(argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        result = {"world": world, "backend": dist.get_backend(), "device": device.type}
        result["all_reduce"] = all_reduce_check(device, world, 64.0 if device.type == "cuda" else 1.0)
        if rank == 0:
            print(f"all-reduce across {world}: {'ok' if result['all_reduce']['ok'] else 'WRONG RESULT'}", flush=True)
        result["burst"] = burst(device, rank, world, size, steps, out.with_name("metrics.jsonl") if rank == 0 else None)
        if rank == 0:
            print(f"burst: {result['burst']['tok_s']:,.0f} tokens/s ({result['burst']['precision']})", flush=True)
            out.write_text(json.dumps(result), encoding="utf-8")
        # Rank 0 hosts the rendezvous store: it leaves only once every rank is done with it, else a
        # rank still tearing down gloo finds the store gone and aborts (seen under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__" and "RANK" in os.environ:
    worker_main(sys.argv[1:])
