#!/usr/bin/env python3
"""Training speed of one model size on this machine: the real loop against a lean one; prints JSON.

    scripts/bench.py --context 1024 --width 512 --heads 8 --layers 8 --batch-per-card 6 --steps 40

The real loop is the code `lab train` runs (lab.kernel.train.Trainer: data from the
memmap, logging every step into metrics.jsonl, the stop agreement, the saver), on the
embedded `pydoc` data (prepared on first use) or --data. Its speed is the median of the
tok_s its metrics rows report after the warm-up. The lean loop, in the same process, is
the model, AdamW, autocast (and GradScaler under fp16) and the same compile choice, on a
fixed random batch, and nothing else; it is timed over windows as long as the real
loop's sync windows. --rounds alternates lean and real to see through a noisy machine.

It also measures one evaluation at the default eval_batches and one text sample, and
prints their share of a session at the default eval_every. MFU is against the card's
peak dense fp16/bf16 matmul rate with fp32 accumulation (LAB_PEAK_TFLOPS overrides). Under
torchrun both loops run DDP over the processes and rank 0 prints.

--real-only runs the real loop alone (no lean loop, no evaluation timing): a function check,
which reports whether it trained (every loss finite, the steps the GradScaler skipped).
--sdpa efficient forces the memory-efficient attention kernel, the one SDPA picks on a T4.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lab.config import RunConfig, flops_per_token  # noqa: E402
from lab.kernel.model import GPT  # noqa: E402
from lab.kernel.speed import compile_choice, compress_fp16, next_sync_steps, wrap_ddp  # noqa: E402
from lab.kernel.step import Runtime, autocast, make_optimizer  # noqa: E402
from lab.kernel.train import Trainer  # noqa: E402

# Peak dense TFLOP/s by card, for fp16/bf16 tensor cores with fp32 accumulation, as autocast's
# matmuls run (fp32 where that is all there is). GeForce cards accumulate in fp32 at half their
# fp16-accumulate rate: an RTX 3050's 36 TFLOP/s is the fp16-accumulate figure, 18.2 the one here.
PEAK_TFLOPS = {
    "T4": 65.0, "P100": 18.7, "V100": 125.0, "A100": 312.0, "A10": 125.0, "L4": 121.0, "A40": 149.7,
    "RTX 3050": 18.2, "RTX 3060": 25.5, "RTX 3090": 71.0, "RTX 4090": 165.2, "H100": 989.0, "H200": 989.0,
}


def peak_for(name: str) -> float | None:
    if os.environ.get("LAB_PEAK_TFLOPS"):
        return float(os.environ["LAB_PEAK_TFLOPS"])
    for key, value in PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return value
    return None


def host_peak_bytes() -> int:
    import resource  # the process's peak resident set: the CPU's "card memory"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float:
    return round((torch.cuda.max_memory_allocated(device) if device.type == "cuda" else host_peak_bytes()) / 1e9, 3)


def prepared_data(folder: str | None) -> Path:
    if folder:
        return Path(folder)
    from lab import corpus  # the embedded pydoc constellation: no download, works offline
    return corpus.find_prepared(["pydoc"]) or corpus.prepare(["pydoc"], progress=False)


def real_loop(cfg: RunConfig, data: Path, warmup: int, steps: int, fp16_compress: bool, timed: bool = True) -> dict:
    """The loop `lab train` runs, for warmup + steps steps; speed from its own metrics rows, and
    (`timed`) one evaluation and one text sample timed after it."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as out:
        cfg = dataclasses.replace(cfg, steps_until=warmup + steps)  # RunConfig is frozen
        trainer = Trainer(cfg, Path(out) / "run", data, log=lambda _: None, on_metrics=rows.append)
        if fp16_compress and trainer.rt.world > 1:
            compress_fp16(trainer.parts.wrapped, trainer.rt.precision)
        reset_peak(trainer.rt.device)
        result = trainer.run()
        peak = peak_gb(trainer.rt.device)
        eval_s, sample_s = (time_evaluation(trainer, cfg) if timed else (None, None))
    losses = [r["loss"] for r in rows if "loss" in r]  # rank 0 logs the rows
    rates = [r["tok_s"] for r in rows if "tok_s" in r and r["step"] > warmup]
    tok_s = statistics.median(rates) if rates else None
    return {"tok_s": tok_s, "peak_memory_gb": peak, "compile_s": trainer.compile_s,
            "compiled": trainer.parts.forward is not trainer.parts.wrapped, "world": trainer.rt.world,
            "device": trainer.rt.device, "precision": trainer.rt.precision, "vocab": trainer.data.vocab,
            "tokens_per_step": trainer.tokens_per_step, "weights": trainer.model.num_weights(),
            "eval_s": eval_s, "sample_s": sample_s, "step_s": tok_s and trainer.tokens_per_step / tok_s,
            "trains": {"steps": len(losses), "losses_finite": bool(losses) and all(map(math.isfinite, losses)),
                       "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                       "skipped_steps": result.get("skipped_steps")}}


def time_evaluation(trainer: Trainer, cfg: RunConfig) -> tuple[float, float | None]:
    """(seconds of one evaluation at the default number of batches, of one text sample on rank 0),
    as a session does them."""
    trainer.val = trainer.data.val_batches(rank=trainer.rt.rank, world=trainer.rt.world, rows=trainer.rows,
                                           batches=RunConfig().eval_batches, context=cfg.context)
    sync(trainer.rt.device)
    t0 = time.monotonic()
    trainer.evaluate()
    eval_s = time.monotonic() - t0
    sample_s = None
    if trainer.rt.main:
        t0 = time.monotonic()
        trainer.sample()
        sample_s = time.monotonic() - t0
    return eval_s, sample_s


def lean_loop(cfg: RunConfig, vocab: int, device: torch.device, precision: str, compiled: bool, world: int,
              warmup: int, steps: int) -> dict:
    """Model, AdamW, autocast (GradScaler under fp16), compile: nothing else."""
    rt = Runtime(int(os.environ.get("RANK", "0")), world, device, precision, cards=world)
    torch.manual_seed(cfg.seed)
    model = GPT(vocab, cfg.context, cfg.width, cfg.heads, cfg.layers).to(device)
    opt = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    net = wrap_ddp(model, device) if world > 1 else model
    fwd = torch.compile(net) if compiled else net
    x = torch.randint(0, vocab, (cfg.batch_per_card, cfg.context), device=device)
    y = torch.randint(0, vocab, (cfg.batch_per_card, cfg.context), device=device)

    def step() -> None:
        with autocast(rt):
            loss = fwd(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    reset_peak(device)
    t0 = time.monotonic()
    for _ in range(warmup):
        step()
    sync(device)
    window = next_sync_steps((time.monotonic() - t0) / warmup)  # windows as long as the real loop's
    tokens = cfg.batch_per_card * cfg.context * world
    rates, done = [], 0
    while done < steps:
        n = min(window, steps - done)
        t0 = time.monotonic()
        for _ in range(n):
            step()
        sync(device)
        rates += [tokens / ((time.monotonic() - t0) / n)] * n
        done += n
    return {"tok_s": statistics.median(rates), "peak_memory_gb": peak_gb(device)}


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1),
            "all": [round(v, 1) for v in values]}


def force_sdpa(kernel: str) -> str:
    """`efficient`: attention only through the memory-efficient kernel, the one SDPA picks on a T4
    (flash needs compute capability 8.0; no math fallback either: a kernel that cannot run fails).
    A CUDA kernel: on a CPU nothing is forced. Returns what attention runs with."""
    if kernel == "efficient" and torch.cuda.is_available():
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        return "efficient (forced)"
    return "auto" if kernel == "auto" else "auto (no memory-efficient kernel to force on a CPU)"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch-per-card", type=int, default=6)
    p.add_argument("--steps", type=int, default=40, help="measured steps per loop, after the warm-up")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="lean, real, lean, real, ...: medians and spread")
    p.add_argument("--precision", default="auto")
    p.add_argument("--torch-compile", default="auto", choices=("auto", "on", "off"),
                   help="auto: what `lab train` picks for a long run on this machine")
    p.add_argument("--ddp-fp16-compress", action="store_true", help="under torchrun: all-reduce gradients in 16 bits")
    p.add_argument("--sdpa", default="auto", choices=("auto", "efficient"), help="efficient: force a T4's attention kernel")
    p.add_argument("--real-only", action="store_true", help="the real loop alone: does it train (a function check)")
    p.add_argument("--data", help="prepared data folder (default: the embedded pydoc constellation)")
    return p.parse_args()


def main() -> None:
    a = parse_args()
    a.sdpa = force_sdpa(a.sdpa)
    data = prepared_data(a.data)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else torch.device("cpu")
    compiled, _ = compile_choice(a.torch_compile, device, train_flops=float('inf'))
    cfg = RunConfig(context=a.context, width=a.width, heads=a.heads, layers=a.layers, batch_per_card=a.batch_per_card,
                    precision=a.precision, torch_compile="on" if compiled else "off", data_dir=str(data),
                    eval_every=10**9, eval_batches=1, warmup_steps=1, limit_min=600, machine="local")
    reals, leans = [], []
    for _ in range(a.rounds):
        real = real_loop(RunConfig.from_dict(cfg.to_dict()), data, a.warmup, a.steps, a.ddp_fp16_compress,
                         timed=not a.real_only)
        if not a.real_only:
            leans.append(lean_loop(cfg, real["vocab"], real["device"], real["precision"], real["compiled"],
                                   real["world"], a.warmup, a.steps))
        reals.append(real)
    if dist.is_initialized():  # every rank done before rank 0, the rendezvous store's host, may leave
        dist.barrier()
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(report(a, device, reals, leans)))


def report(a: argparse.Namespace, device: torch.device, reals: list[dict], leans: list[dict]) -> dict:
    """The figures as measured on this machine (no other card's figure is derived from them)."""
    real = reals[-1]
    real_tok_s = [r["tok_s"] for r in reals]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peak, fpt = peak_for(name), flops_per_token(a.layers, a.width, real["vocab"], a.context)
    mfu = (lambda tok_s: round(tok_s * fpt / (peak * 1e12 * real["world"]), 4) if peak else None)
    out = {
        "device": name, "world": real["world"], "precision": real["precision"], "compiled": real["compiled"],
        "sdpa": a.sdpa, "compile_s": real["compile_s"] and round(real["compile_s"], 1), "weights": real["weights"],
        "context": a.context, "width": a.width, "heads": a.heads, "layers": a.layers, "vocab": real["vocab"],
        "batch_per_card": a.batch_per_card, "tokens_per_step": real["tokens_per_step"],
        "real_tok_s": spread(real_tok_s), "mfu_real": mfu(statistics.median(real_tok_s)), "peak_tflops": peak,
        "peak_memory_gb": {"real": real["peak_memory_gb"]}, "trains": real["trains"],
    }
    if leans:
        lean_tok_s = [r["tok_s"] for r in leans]
        out.update(lean_tok_s=spread(lean_tok_s), mfu_lean=mfu(statistics.median(lean_tok_s)),
                   real_over_lean=round(statistics.median(r / l for r, l in zip(real_tok_s, lean_tok_s)), 3),
                   eval=evaluation_share(reals))
        out["peak_memory_gb"]["lean"] = leans[-1]["peak_memory_gb"]
    if device.type == "cuda":
        from lab.sizing import memory_bytes
        est = memory_bytes(a.context, a.width, a.heads, a.layers, real["vocab"], a.batch_per_card,
                           real["precision"], real["world"])
        out["estimated_memory_gb"] = round(est.total / 1e9, 3)
        out["peak_memory_gb"]["real_with_context"] = round(real["peak_memory_gb"] + est.cuda_context / 1e9, 3)
    return out


def evaluation_share(reals: list[dict]) -> dict:
    """What one evaluation and one sample cost against the training between two of them."""
    defaults = RunConfig()
    eval_s = statistics.median(r["eval_s"] for r in reals)
    sample_s = statistics.median(r["sample_s"] for r in reals)
    train_s = defaults.eval_every * statistics.median(r["step_s"] for r in reals)
    return {"eval_batches": defaults.eval_batches, "eval_s": round(eval_s, 3), "sample_s": round(sample_s, 3),
            "eval_every": defaults.eval_every, "train_s_between": round(train_s, 2),
            "share_of_session": round((eval_s + sample_s) / (train_s + eval_s + sample_s), 4)}


if __name__ == "__main__":
    main()
