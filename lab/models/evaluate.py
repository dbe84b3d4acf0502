"""A model measured on a text: the loss per token and the bits per byte.

The documents are tokenized as training data is (each followed by EOS, the stream starting
with one), then scored in windows of the context, each token predicted once from the tokens
before it in its window: ids[0:n+1] gives the losses of ids[1..n], ids[n:2n+1] those of
ids[n+1..2n], and so on. Bits per byte are the summed losses over the documents' UTF-8 bytes
(`lab.models.bpb`), so texts, tokenizers and vocabularies compare on one scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.models.bpb import bits_per_byte
from lab.models.loading import Loaded

ROWS = 8  # windows scored per forward pass


@dataclass
class Score:
    documents: int
    bytes: int
    tokens: int  # tokens predicted (every one after the first EOS)
    nats: float  # their losses summed

    @property
    def loss(self) -> float:
        """Mean loss per token, in nats (what training calls the loss)."""
        return self.nats / self.tokens

    @property
    def bpb(self) -> float:
        return bits_per_byte(self.nats, self.bytes)

    def to_dict(self) -> dict:
        return {"documents": self.documents, "bytes": self.bytes, "tokens": self.tokens, "nats": self.nats,
                "loss": self.loss, "bpb": self.bpb}


def token_stream(loaded: Loaded, documents: list[str]) -> list[int]:
    eos = loaded.eos_id
    out = [eos]
    for ids in loaded.tokenizer.encode(documents):
        out += ids + [eos]
    return out


@torch.no_grad()
def token_losses(loaded: Loaded, ids: list[int], rows: int = ROWS) -> torch.Tensor:
    """The loss (nats) of each of ids[1:], in order, as float64 on the CPU."""
    n = loaded.model.context
    data = torch.tensor(ids, dtype=torch.long)
    starts = list(range(0, len(ids) - 1, n))
    out = []
    for first in range(0, len(starts), rows):
        group = starts[first:first + rows]
        length = min(n, len(ids) - 1 - group[-1])  # the last window may be shorter: it goes alone
        if length < n and len(group) > 1:
            out += [_window_losses(loaded, data, group[:-1], n), _window_losses(loaded, data, group[-1:], length)]
        else:
            out.append(_window_losses(loaded, data, group, length))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _window_losses(loaded: Loaded, data: torch.Tensor, starts: list[int], length: int) -> torch.Tensor:
    x = torch.stack([data[s:s + length] for s in starts]).to(loaded.device)
    y = torch.stack([data[s + 1:s + 1 + length] for s in starts]).to(loaded.device)
    with loaded.autocast():
        logits = loaded.model(x)
    losses = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
    return losses.double().cpu()


def evaluate(loaded: Loaded, documents: list[str], rows: int = ROWS) -> Score:
    """The score of the model on these documents (an empty document counts no bytes)."""
    ids = token_stream(loaded, documents)
    losses = token_losses(loaded, ids, rows)
    return Score(documents=len(documents), bytes=sum(len(d.encode("utf-8")) for d in documents),
                 tokens=len(losses), nats=float(losses.sum()))
