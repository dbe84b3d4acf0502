"""The GPT.

Weights are exactly 12·layers·d² + vocab·d + n·d: each block has the attention's q, k, v
and output projections (4·d²) and a 4·d MLP (8·d²), with no biases and norms without
learned weights; the output head is the token embedding itself; positions are learned.

Sampling feeds the prompt once and then each new token alone, through a `KVCache` that keeps
the keys and values of the positions seen so far; training never passes one.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F


def norm(x: torch.Tensor) -> torch.Tensor:
    # RMS norm without a learned scale: it adds no weights to the count above.
    return F.rms_norm(x, (x.size(-1),))


class KVCache:
    """The keys and values of the positions fed so far, one pair of buffers per attention layer,
    so that sampling a token feeds the model that one token, not the whole context. Feed it
    the prompt first (up to the context), then one token at a time."""

    def __init__(self, context: int):
        self.context, self.length = context, 0
        self.kv: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

    def extend(self, layer: nn.Module, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of every position so far, the new ones written after the old."""
        if self.length and k.size(2) > 1:
            raise ValueError("after the prompt, a KV cache takes one token at a time")
        if layer not in self.kv:
            shape = (*k.shape[:2], self.context, k.size(3))
            self.kv[layer] = (k.new_empty(shape), v.new_empty(shape))
        keys, values = self.kv[layer]
        end = self.length + k.size(2)
        keys[:, :, self.length:end], values[:, :, self.length:end] = k, v
        return keys[:, :, :end], values[:, :, :end]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = cache.extend(self, k, v)
        # Flash or memory-efficient attention where the device has it: no t×t matrix is kept.
        # One new token after cached ones sees them all: it needs no mask.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = Attention(width, heads)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(norm(x), cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} does not divide by heads {heads}")
        self.context = context
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        for name, p in self.named_parameters():
            std = 0.02
            if name.endswith("proj.weight") or name.endswith("down.weight"):
                std = 0.02 / math.sqrt(2 * layers)  # GPT-2: residual branches scaled by depth
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits for `idx`, or the mean cross-entropy against `targets` when given. With a
        `cache`, `idx` follows the positions it holds."""
        start, t = (0 if cache is None else cache.length), idx.size(1)
        if start + t > self.context:
            raise ValueError(f"sequence of {start + t} tokens is longer than the context {self.context}")
        x = self.tok(idx) + self.pos(torch.arange(start, start + t, device=idx.device))
        for block in self.blocks:
            x = block(x, cache)
        if cache is not None:
            cache.length += t
        logits = F.linear(norm(x), self.tok.weight)  # tied output head
        if targets is None:
            return logits
        # Only the loss goes back: DataParallel would otherwise gather every replica's logits.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def num_weights(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def tokens(self, idx: torch.Tensor, temperature: float = 0.8, top_k: int = 50, top_p: float = 1.0,
               generator: torch.Generator | None = None,
               banned: Callable[[], torch.Tensor | None] | None = None) -> Iterator[torch.Tensor]:
        """Sampled tokens after `idx`, one (batch, 1) tensor at a time, for as long as asked;
        `banned()` may mask the tokens that cannot come next (True: never drawn).

        Each new token costs one position through the KV cache. Past the context the window
        slides: the positions are learned and absolute, so every one shifts and nothing cached
        stays valid; each token then recomputes the last `context` tokens, as nanoGPT does."""
        idx = idx[:, -self.context:]
        cache = KVCache(self.context)
        logits = self(idx, cache=cache)[:, -1]
        while True:
            if banned is not None:
                logits = logits.masked_fill(banned(), float("-inf"))
            nxt = sample_next(logits, temperature, top_k, top_p, generator)
            yield nxt
            idx = torch.cat([idx, nxt], dim=1)[:, -self.context:]
            logits = (self(nxt, cache=cache) if cache.length < self.context else self(idx))[:, -1]

    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float = 0.8, top_k: int = 50,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """`idx` followed by `new_tokens` sampled tokens."""
        new = itertools.islice(self.tokens(idx, temperature, top_k, generator=generator), new_tokens)
        return torch.cat([idx, *new], dim=1)


def sample_next(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from the last position's logits: scaled by the temperature, cut to the
    `top_k` likeliest (0: all) and to the smallest set whose probability reaches `top_p`.
    Temperature 0 is greedy: the likeliest token (the first of equals), drawing nothing."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        p = F.softmax(ordered, dim=-1)
        beyond = p.cumsum(dim=-1) - p >= top_p  # the likelier ones before it already reach top_p
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(1, order, beyond), float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
