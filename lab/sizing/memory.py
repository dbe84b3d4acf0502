"""Memory per card: the formula for one training micro-step, the largest batch that fits,
and what a card (or this computer) has to give."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lab.sizing.cards import Card, weight_count

GB = 1e9  # memory is in decimal GB: "15 GB usable" on a T4 whose 16 GiB show as ~15.8e9 bytes
CPU_USABLE_FRACTION = 0.75  # of host memory; the rest is the OS, the notebook and data loading
ALLOCATOR_SLACK = 0.10  # PyTorch's caching allocator rounds and fragments blocks


def _bytes_per_value(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@dataclass
class Memory:
    """Peak memory of one card during a training step, in bytes, by part."""
    weights_and_optimizer: int
    activations: int
    logits: int
    slack: int
    cuda_context: int

    @property
    def total(self) -> int:
        return self.weights_and_optimizer + self.activations + self.logits + self.slack + self.cuda_context

    def parts_gb(self) -> dict:
        return {k: round(getattr(self, k) / GB, 3) for k in
                ("weights_and_optimizer", "activations", "logits", "slack", "cuda_context")}


def memory_bytes(context: int, width: int, heads: int, layers: int, vocab: int, batch_per_card: int,
                 precision: str = "fp16", cards: int = 1, cuda_context_gb: float = 0.5) -> Memory:
    """Peak bytes on one card for one micro-step. N weights, T = batch·n tokens,
    c = 2 bytes per activation value under fp16/bf16 autocast, 4 in fp32:

    weights and optimizer = N·(4 fp32 master + 4 fp32 grads + 8 AdamW moments
                              + 2 16-bit copies that autocast casts and backward keeps
                              + 4 DDP gradient buckets when there are 2 cards)
    activations = T·(layers·(8·d + 14·c·d + 8 + 4·heads) + 4·d + c·d + 4)
        per layer (what autograd saves; counted with saved-tensor hooks on this model):
        the fp32 residual stream into both norms (2·4·d) and their 1/rms (2·4);
        attention: norm output cast (d), q k v (3·d), SDPA output (d; flash and
        memory-efficient SDPA keep no n×n matrix, only a log-sum-exp per head, 4·heads);
        its layout makes the transpose before the projection free;
        MLP: norm output cast (d), up-projection (4·d, kept by GELU), GELU (4·d);
        that is 14 values of c bytes. After the last layer: the final norm's fp32 input,
        its 1/rms and its output cast.
    logits = T·max(12·V, 8·c·d + 8·d): the loss keeps fp32 log-softmax (4·V); its
        backward adds the gradient into and out of log-softmax (4·V + 4·V). Once it is
        freed, a layer's backward holds two 4·d gradients (c) and two fp32 residual ones.
    total = (weights and optimizer + activations + logits)·(1 + 10% allocator slack)
            + the CUDA context (0.5 GB on a GPU, none on CPU).
    """
    n_weights = weight_count(layers, width, vocab, context)
    c = _bytes_per_value(precision)
    static = n_weights * (16 + (2 if c == 2 else 0) + (4 if cards > 1 else 0))
    tokens = batch_per_card * context
    per_layer = 8 * width + 14 * c * width + 8 + 4 * heads
    activations = tokens * (layers * per_layer + 4 * width + c * width + 4)
    logits = tokens * max(12 * vocab, 8 * c * width + 8 * width)
    slack = int(ALLOCATOR_SLACK * (static + activations + logits))
    return Memory(static, activations, logits, slack, int(cuda_context_gb * GB))


def max_batch(context: int, width: int, heads: int, layers: int, vocab: int, usable_bytes: float,
              precision: str = "fp16", cards: int = 1, cuda_context_gb: float = 0.5) -> int:
    """The largest batch per card whose `memory_bytes` fits in `usable_bytes` (0: none)."""
    def total(b: int) -> int:
        return memory_bytes(context, width, heads, layers, vocab, b, precision, cards, cuda_context_gb).total
    per_sample = total(1) - total(0)
    b = max(0, int((usable_bytes - total(0)) // per_sample)) if per_sample > 0 else 0
    while b > 0 and total(b) > usable_bytes:  # integer rounding of the slack, at most a step
        b -= 1
    while total(b + 1) <= usable_bytes:
        b += 1
    return b


_host_bytes: float | None = None


def host_memory_bytes() -> float | None:
    """Physical memory of this computer (None where the platform will not say)."""
    global _host_bytes
    if _host_bytes is None:
        try:
            _host_bytes = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None
    return _host_bytes


def usable_bytes(card: Card) -> float | None:
    if card.usable_gb is not None:
        return card.usable_gb * GB
    host = host_memory_bytes()
    return None if host is None else CPU_USABLE_FRACTION * host

