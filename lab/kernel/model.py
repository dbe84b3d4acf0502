"""The GPT.

Weights are exactly 12·layers·d² + vocab·d + n·d: each block has the attention's q, k, v
and output projections (4·d²) and a 4·d MLP (8·d²), with no biases and norms without
learned weights; the output head is the token embedding itself; positions are learned.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def norm(x: torch.Tensor) -> torch.Tensor:
    # RMS norm without a learned scale: it adds no weights to the count above.
    return F.rms_norm(x, (x.size(-1),))


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # Flash or memory-efficient attention where the device has it: no t×t matrix is kept.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(norm(x))
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for `idx`, or the mean cross-entropy against `targets` when given."""
        t = idx.size(1)
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens is longer than the context {self.context}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(norm(x), self.tok.weight)  # tied output head
        if targets is None:
            return logits
        # Only the loss goes back: DataParallel would otherwise gather every replica's logits.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def num_weights(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float = 0.8,
                 top_k: int = 50, generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(new_tokens):
            logits = self(idx[:, -self.context:])[:, -1, :].float() / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
