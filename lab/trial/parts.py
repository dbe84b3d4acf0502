"""A machine's parts, measured: the short microbenchmark that sets the shape of the calculator's
step-time model (lab.sizing.steptime) for this machine and kind of card.

A step's time is a sum of parts that grow differently with the size (matrix products, attention,
elementwise work per element, the loss per logit, the optimizer per weight, a fixed cost per
layer and per step). A prior fitted on another processor gets their proportions wrong for this
one (issue 41: a larger size's speed predicted at 0.45 of a small one's, measured at 0.69), so
each is timed here on its own, at the run's precision, with the training loop's own pieces:

    matmul       a block's product (d -> 4d) forward and backward, at several widths: seconds per
                 FLOP, which on a CPU falls steeply with the width
    attention    causal scaled-dot-product attention forward and backward at two contexts: seconds
                 per FLOP, which falls with the context
    activations  a block's elementwise work (its two norms, GELU over 4·d, the residual adds, the
                 casts autocast makes), forward and backward, on a tensor that stays in cache and
                 on one that does not: seconds per element, and the extra once it spills
    logits       the loss (fp32 cross-entropy) forward and backward: seconds per logit
    weights      fused AdamW and the clipping over a million weights (16 on a GPU): seconds per weight
    layers, step the lab's GPT at a tiny size, one layer and nine: a whole step's fixed cost, and
                 what each layer adds to it (launches, Python)

Stdlib and torch, and the kernel's model and step: the probe and a box's check paste it into
their worker (lab.trial.sources) after those, and `lab size` and the form run it here once per
precision and thread count (`python -m lab.trial.parts PRECISION`, through lab.api.sizing; kept
under the lab home by lab.sizing.machine). 7-22 s on the 2-vCPU EPYC VM (torch 2.13), a few
seconds on a GPU.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from lab.config import RunConfig
from lab.kernel.model import GPT, norm
from lab.kernel.step import Runtime, autocast, make_optimizer

FORMAT = 1
WIDTHS = {"cpu": (64, 128, 256, 512), "cuda": (128, 256, 512, 1024, 2048)}
CONTEXTS = {"cpu": (128, 512), "cuda": (512, 2048)}  # attention's
TOKENS = {"cpu": 1024, "cuda": 16384}  # rows of a product and of the loss
# The elementwise work's two tensors (batch, n, d): ~0.5 MB, which a core's cache holds, and
# ~16 MB, which it does not (lab.sizing.steptime.CACHE_BYTES: a few MiB); on a GPU neither is cached.
ELEMENTWISE = {"cpu": {"small": (2, 64, 512), "large": (16, 512, 512)},
               "cuda": {"small": (8, 512, 512), "large": (64, 1024, 1024)}}
MIN_S = {"cpu": 0.25, "cuda": 0.05}  # each timing repeats for at least this long
WEIGHTS = {"cpu": 1 << 20, "cuda": 1 << 24}  # the optimizer's: enough that a card's launches do not count


class Timer:
    """Times a piece of work on a device: the lower quartile of its calls after a warm-up call, over
    at least `min_reps` calls and `min_s` seconds (at most 200 calls), and the calls' spread (half
    their 10-90% range over the median). `clock`: wall seconds; a test of the arithmetic or a
    measurement on a busy machine may give process seconds."""

    def __init__(self, device: torch.device, min_s: float, clock=time.perf_counter):
        self.device, self.min_s, self.clock = device, min_s, clock
        self.spreads: list[float] = []

    def __call__(self, work, min_reps: int = 3) -> float:
        work()
        self._sync()
        times: list[float] = []
        start = self.clock()
        while len(times) < min_reps or (self.clock() - start < self.min_s and len(times) < 200):
            t0 = self.clock()
            work()
            self._sync()
            times.append(self.clock() - t0)
        times.sort()
        low, mid = times[(len(times) - 1) // 4], statistics.median(times)
        self.spreads.append((times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / 2 / mid)
        # The lower quartile: other work on the machine only ever slows a call, and the parts' ratios
        # (the model's shape) must not carry which part happened to be timed in a busy second.
        return low

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _dtype(precision: str):
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)


def matmul_rates(rt: Runtime, timer: Timer, tokens: int, widths: tuple[int, ...]) -> list[list[float]]:
    """[[width, seconds per FLOP], ...]: x (tokens × d) times a d × 4d weight, forward and backward
    (both gradients) under the run's autocast."""
    out = []
    for d in widths:
        x = torch.randn(tokens, d, device=rt.device, requires_grad=True)
        w = torch.randn(4 * d, d, device=rt.device, requires_grad=True)

        def work():
            x.grad = w.grad = None  # each gradient written once, as in a step (not added to)
            with autocast(rt):
                y = F.linear(x, w)
            y.float().sum().backward()
        out.append([d, timer(work) / (6.0 * tokens * d * 4 * d)])
    return out


def attention_rates(rt: Runtime, timer: Timer, contexts: tuple[int, ...]) -> list[list[float]]:
    """[[context, seconds per attention FLOP], ...] (12·n·d per token and layer, as lab.sizing.steptime
    counts it): causal scaled-dot-product attention forward and backward at each context, the
    same number of tokens at each (its kernels' blocks make the rate depend on n)."""
    heads, hd, tokens = (4, 32, 1024) if rt.device.type == "cpu" else (8, 64, 16384)
    out = []
    for n in contexts:
        b = max(1, tokens // n)
        q, k, v = (torch.randn(b, heads, n, hd, device=rt.device, requires_grad=True) for _ in range(3))

        def work():
            q.grad = k.grad = v.grad = None
            with autocast(rt):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.float().sum().backward()
        out.append([n, timer(work) / (12.0 * n * heads * hd * b * n)])
    return out


def elementwise_block(x: torch.Tensor, dtype) -> torch.Tensor:
    """A block's work besides its products, on x (batch, n, d): the two norms, the casts autocast
    makes into the products (none in fp32), GELU over the 4·d hidden values, the residual adds."""
    a = norm(x).to(dtype)
    x = x + a.float()
    h = norm(x).to(dtype)
    g = F.gelu(h.repeat(1, 1, 4))
    return x + g.view(*x.shape[:-1], 4, x.size(-1)).sum(-2).float()


def elementwise_rates(rt: Runtime, timer: Timer) -> dict:
    """{"small"|"large": {"batch", "context", "width", "s_per_element"}}: `elementwise_block` forward
    and backward per element (tokens × d of one layer), on a tensor in cache and one beyond it."""
    out = {}
    dtype = _dtype(rt.precision)
    for key, (b, n, d) in ELEMENTWISE[rt.device.type].items():
        x = torch.randn(b, n, d, device=rt.device, requires_grad=True)

        def work():
            x.grad = None
            elementwise_block(x, dtype).sum().backward()
        out[key] = {"batch": b, "context": n, "width": d, "s_per_element": timer(work) / (b * n * d)}
    return out


def logit_rate(rt: Runtime, timer: Timer, tokens: int, vocab: int = 4000) -> float:
    """Seconds per logit of the loss: fp32 cross-entropy forward and backward over tokens × vocab."""
    z = torch.randn(tokens, vocab, device=rt.device, dtype=_dtype(rt.precision), requires_grad=True)
    y = torch.randint(0, vocab, (tokens,), device=rt.device)
    def work():
        z.grad = None
        F.cross_entropy(z.float(), y).backward()
    return timer(work) / (tokens * vocab)


def weight_rate(rt: Runtime, timer: Timer, weights: int) -> float:
    """Seconds per weight of the optimizer's step: the loop's fused AdamW and the clipping, over
    `weights` in one tensor (a tensor's own cost is a layer's: `fixed_costs`)."""
    layer = torch.nn.Linear(1024, weights // 1024, bias=False).to(rt.device)
    layer.weight.grad = torch.randn_like(layer.weight)
    opt = make_optimizer(layer, RunConfig(), rt.device)

    def work():
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        opt.step()
    return timer(work) / weights


def fixed_costs(rt: Runtime, timer: Timer) -> tuple[float, float]:
    """(seconds per step, seconds per layer): the lab's GPT at a tiny size, a whole training step
    (forward, loss, backward, clipping, AdamW) with one layer and with nine."""
    def step_s(layers: int) -> float:
        torch.manual_seed(0)
        model = GPT(64, 8, 16, 1, layers).to(rt.device)
        opt = make_optimizer(model, RunConfig(), rt.device)
        x = torch.randint(0, 64, (1, 8), device=rt.device)

        def work():
            with autocast(rt):
                loss = model(x, x)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return timer(work, min_reps=10)
    one, nine = step_s(1), step_s(9)
    per_layer = max(0.0, (nine - one) / 8)
    return max(0.0, one - per_layer), per_layer


def measure_parts(device: torch.device, precision: str, clock=time.perf_counter) -> dict:
    """The machine's parts at `precision` ("fp32", "bf16", "fp16"), as lab.sizing.machine reads them."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    rt = Runtime(0, 1, device, precision, cards=1)
    timer, started, tokens = Timer(device, MIN_S[kind], clock), time.perf_counter(), TOKENS[kind]
    result = {"format": FORMAT, "device": kind, "precision": precision,
              "matmul": matmul_rates(rt, timer, tokens, WIDTHS[kind]),
              "attention": attention_rates(rt, timer, CONTEXTS[kind]),
              "elementwise": elementwise_rates(rt, timer), "logits": logit_rate(rt, timer, tokens),
              "weights": weight_rate(rt, timer, WEIGHTS[kind])}
    result["step"], result["layer"] = fixed_costs(rt, timer)
    result.update(spread=round(statistics.median(timer.spreads), 3), seconds=round(time.perf_counter() - started, 2),
                  load=_load() if clock is time.perf_counter else None, cpus=os.cpu_count(),  # CPU seconds: not waits
                  threads=torch.get_num_threads() if kind == "cpu" else None,
                  name=torch.cuda.get_device_name(device) if kind == "cuda" else None, torch=torch.__version__)
    return result


def _load() -> float | None:
    """The 1-minute load average as the measurement ends: how busy the machine was meanwhile."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not a Unix
        return None


def main(argv: list[str]) -> None:
    """`python -m lab.trial.parts PRECISION`: this computer's CPU parts as one line of JSON, on the
    threads torch takes here (OMP_NUM_THREADS, else one per core)."""
    print(json.dumps(measure_parts(torch.device("cpu"), argv[0] if argv else "fp32")), flush=True)


# Not under torchrun: pasted into the probe's worker, this module is part of its __main__ there.
if __name__ == "__main__" and "RANK" not in os.environ:
    main(sys.argv[1:])
