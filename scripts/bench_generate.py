#!/usr/bin/env python3
"""Generation speed with and without the KV cache, in tokens per second (fp32 on a CPU, or the
given device).

Two sizes: the demo's (4 layers, d 128, n 128) and the reference (8 layers, d 512, n 1024),
vocabulary 4000, random weights (speed does not depend on what a model learned). Two
measurements each:

  full context   a prompt of n - K - 1 tokens, then K new tokens: every token sees a whole
                 window. The cache's gain here is the figure to report.
  whole window   from one token until the context is full: K = n - 2 new tokens. Without the
                 cache at the reference size this takes many minutes on a small CPU; it runs
                 only with --whole-without-cache.

Both time the new tokens after the first: the prompt's own pass, one forward over it either
way, is left out.

Without the cache is nanoGPT's way: each token runs the model over the whole window again.
Past the context both paths are that way (positions are learned and absolute: see
`GPT.tokens`), so they are not measured apart there.

    scripts/bench_generate.py [--tokens K] [--repeat R] [--device cuda] [--threads N] [--whole-without-cache]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from lab.kernel.model import GPT, sample_next  # noqa: E402

SIZES = {"demo": dict(layers=4, width=128, heads=4, context=128), "reference": dict(layers=8, width=512, heads=8, context=1024)}
VOCAB = 4000


def with_cache(model: GPT, idx: torch.Tensor, generator: torch.Generator):
    return model.tokens(idx, generator=generator)


@torch.no_grad()
def without_cache(model: GPT, idx: torch.Tensor, generator: torch.Generator):
    while True:
        logits = model(idx[:, -model.context:])[:, -1]
        nxt = sample_next(logits, 0.8, 50, generator=generator)
        yield nxt
        idx = torch.cat([idx, nxt], dim=1)


def rate(fn, model: GPT, prompt: int, count: int, device: torch.device, repeat: int) -> float:
    """New tokens per second after a prompt of `prompt` tokens, from the first new token on:
    the prompt's own pass (one forward over it, with or without the cache) is left out. The
    best of `repeat` timings: on a shared machine the slower ones measure the neighbours."""
    idx = torch.randint(0, VOCAB, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)
    best = float("inf")
    for _ in range(repeat):
        tokens = fn(model, idx, torch.Generator(device=device).manual_seed(1))
        int(next(tokens))  # the prompt's pass and the first token
        t0 = time.perf_counter()
        for _ in range(count):
            int(next(tokens))  # int(): the token reaches the host, as a streamed one must
        best = min(best, time.perf_counter() - t0)
    return count / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32, metavar="K", help="new tokens at full context (32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeat", type=int, default=3, metavar="R", help="timings per figure; the best is shown (3)")
    parser.add_argument("--whole-without-cache", action="store_true",
                        help="also time the whole window without the cache at the reference size (slow)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {device}, fp32, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, best of {args.repeat}")
    print(f"{'size':<10} {'weights':>11} {'measurement':<14} {'no cache':>10} {'cache':>10} {'gain':>7}  tok/s")
    for name, size in SIZES.items():
        torch.manual_seed(0)
        model = GPT(VOCAB, size["context"], size["width"], size["heads"], size["layers"]).to(device).eval()
        n, k = size["context"], min(args.tokens, size["context"] - 2)
        cases = [("full context", n - k - 1, k), ("whole window", 1, n - 2)]
        for label, prompt, count in cases:
            cached = rate(with_cache, model, prompt, count, device, args.repeat)
            slow = label == "whole window" and name == "reference" and not args.whole_without_cache
            plain = None if slow else rate(without_cache, model, prompt, count, device, args.repeat)
            shown = "-" if plain is None else f"{plain:,.1f}"
            gain = "-" if plain is None else f"{cached / plain:.1f}×"
            print(f"{name:<10} {model.num_weights():>11,} {label:<14} {shown:>10} {cached:>10,.1f} {gain:>7}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
