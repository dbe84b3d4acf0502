"""The probe's worker, run by torchrun inside the probe session (one process per card).

It checks that the cards talk (one all-reduce, its result checked and timed: NCCL on GPUs, gloo
on CPU), then trains the lab's GPT for a short burst with the training loop's own step
(lab.kernel.step: DDP as the loop wraps it, the precision rule, fused AdamW, the GradScaler,
clipping; pasted before this in the probe notebook, with lab.config, lab.kernel.model and
lab.kernel.speed). On CPU, where the probe runs only in tests, fp32. Random tokens: speed does not
depend on what is read. Rank 0 writes the figures as JSON to argv[1] and the burst's rows as
metrics.jsonl beside it, as a run would, so the calculator reads the measured speed the way it
reads a run's. On GPUs rank 0 then measures one card's parts (lab.trial.parts): the shape of the
calculator's step-time model for this kind of card.

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

from lab.config import RunConfig
from lab.kernel.model import GPT
from lab.kernel.step import Runtime, StepParts, make_optimizer, one_step, pick_precision, wrap_for
from lab.trial.parts import measure_parts


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


class SameBatch:
    """The burst's batches: one random batch at every step."""

    def __init__(self, x: torch.Tensor):
        self.x, self.y = x[:, :-1], x[:, 1:]

    def take(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def prepare(self, step: int, micro: int) -> None:
        pass


def burst(device: torch.device, rank: int, world: int, size: dict, steps: int, out: Path | None) -> dict:
    """`steps` training steps at `size`; rows of metrics.jsonl (rank 0); the median tokens/s of
    the steps after the first ten (compilation of kernels, allocator warm-up)."""
    torch.manual_seed(1234 + rank)
    cfg = RunConfig(context=size["context"], width=size["width"], heads=size["heads"], layers=size["layers"],
                    batch_per_card=size["batch_per_card"])
    rt = Runtime(rank, world, device, pick_precision(device, "auto" if device.type == "cuda" else "fp32"), cards=world)
    model = GPT(size["vocab"], cfg.context, cfg.width, cfg.heads, cfg.layers).to(device)
    parts = StepParts(model, wrap_for(model, rt), make_optimizer(model, cfg, device),
                      torch.amp.GradScaler(device.type, enabled=rt.precision == "fp16"), rt)
    tokens_per_step = cfg.batch_per_card * world * cfg.context
    batches = SameBatch(torch.randint(0, size["vocab"], (cfg.batch_per_card, cfg.context + 1), device=device))
    records, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        loss, _ = one_step(parts, batches, step, cfg.lr, clip=cfg.grad_clip)
        sync(device)
        dt = time.perf_counter() - t0
        records.append({"step": step, "tokens": step * tokens_per_step, "loss": float(loss.item()),
                        "tok_s": tokens_per_step / max(dt, 1e-9), "elapsed_s": round(time.perf_counter() - started, 3),
                        "session": 1})
    if out is not None:
        out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    steady = sorted(r["tok_s"] for r in records[10:]) or [records[-1]["tok_s"]]
    return {"tok_s": round(steady[len(steady) // 2], 1), "steps": steps, "precision": rt.precision,
            "tokens_per_step": tokens_per_step, "size": size, "weights": model.num_weights(),
            "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
            "peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 3) if device.type == "cuda"
            else None}


def card_parts(device: torch.device, precision: str) -> dict:
    """One card's parts (lab.trial.parts, pasted before this), the shape of the calculator's model
    for this kind of card; a failure is recorded, never raised."""
    try:
        parts = measure_parts(device, precision)
        print(f"parts: measured in {parts['seconds']:.1f} s", flush=True)
        return parts
    except Exception as e:  # noqa: BLE001 - the burst stands without them
        return {"error": f"{type(e).__name__}: {e}"[:500]}


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
            if device.type == "cuda":  # a CPU's parts are the calculator's only for the computer it runs on
                result["parts"] = card_parts(device, result["burst"]["precision"])
            out.write_text(json.dumps(result), encoding="utf-8")
        # Rank 0 hosts the rendezvous store: it leaves only once every rank is done with it, else a
        # rank still tearing down gloo finds the store gone and aborts (seen under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__" and "RANK" in os.environ:
    worker_main(sys.argv[1:])
