"""Token data for training: uint16 shards described by a manifest, batches, the val set.

A prepared data folder (written by `lab prepare`, uploaded as a Kaggle dataset) holds
`manifest.json`, `tokenizer.model` and flat uint16 token shards. Batches are a pure
function of (seed, step): the rows of step s are drawn from a generator seeded by both,
and each rank takes its own slice of them. So the data position after a resume is just
the step, and two processes with batch B read exactly what one process with batch 2·B
reads.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

MANIFEST = "manifest.json"


class DataError(ValueError):
    """Missing or unreadable data: the message says which file and what to do."""


class TokenData:
    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise DataError(f"no {MANIFEST} in {self.folder}: run `lab prepare` for these constellations")
        self.manifest = json.loads(path.read_text(encoding="utf-8"))
        self.train = [self._open(s) for s in self.manifest["train"]]
        self.val = [self._open(s) for s in self.manifest["val"]]
        if not self.train or not self.val:
            raise DataError(f"{path} lists no train or no val shards: run `lab prepare` again")
        self.vocab = int(self.manifest["tokenizer"]["vocab"])
        self.val_set = self.manifest["val_set"]
        self.constellations = sorted(self.manifest["constellations"])

    def _open(self, shard: dict) -> np.ndarray:
        path = self.folder / shard["path"]
        if not path.is_file():
            raise DataError(f"missing shard {path}: run `lab prepare` again or upload the whole data folder")
        arr = np.memmap(path, dtype=np.uint16, mode="r")
        if len(arr) != shard["tokens"]:
            raise DataError(f"shard {path} holds {len(arr)} tokens, the manifest says {shard['tokens']}: "
                            f"it is truncated; run `lab prepare` again")
        return arr

    @property
    def shortest_split(self) -> int:
        return min(len(a) for a in self.train + self.val)

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / self.manifest["tokenizer"]["file"]

    def train_batch(self, *, seed: int, step: int, micro: int, accum: int, rank: int, world: int,
                    rows: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of micro-step `micro` of optimizer step `step`."""
        total = rows * world * accum
        starts = _uniform_starts(self.train, context, total, np.random.default_rng([seed, step]))
        first = (micro * world + rank) * rows
        return _windows(starts[first:first + rows], context)

    def val_batches(self, *, rank: int, world: int, rows: int, batches: int,
                    context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed windows spread evenly over the val shards, split across ranks, so every
        evaluation of a run sees the same text."""
        count = rows * world * batches
        starts = _even_starts(self.val, context, count)
        mine = starts[rank::world]
        return [_windows(mine[i:i + rows], context) for i in range(0, len(mine), rows)]


class Prefetcher:
    """The next batch, made ready ahead: read from the memmap and, on a GPU, pinned and
    copied without blocking while the card still works on the current step, so page
    faults and the copy overlap the card's work instead of following it.

    `read(step, micro)` gives a batch; `take` returns the prepared one when the keys
    match and reads on the spot otherwise (the first step, or after an out-of-memory retry).
    """

    def __init__(self, read, device: torch.device):
        self.read, self.device = read, device
        self.ready: tuple[tuple[int, int], torch.Tensor, torch.Tensor] | None = None

    def _load(self, key: tuple[int, int]):
        # Contiguous first: a batch is a view into one array (inputs and targets overlap), and
        # pinning a view keeps its strides, so the copy to the card would go through an
        # unpinned temporary and block.
        x, y = (t.contiguous() for t in self.read(*key))
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        return key, x, y

    def prepare(self, step: int, micro: int) -> None:
        self.ready = self._load((step, micro))

    def take(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        ready, self.ready = self.ready, None
        if ready is None or ready[0] != (step, micro):
            ready = self._load((step, micro))
        return ready[1], ready[2]


def _valid_starts(shards: list[np.ndarray], context: int) -> np.ndarray:
    return np.array([max(0, len(a) - context) for a in shards], dtype=np.int64)


def _uniform_starts(shards, context, count, rng) -> list[tuple[np.ndarray, int]]:
    counts = _valid_starts(shards, context)
    cum = np.cumsum(counts)
    flat = rng.integers(0, cum[-1], size=count)
    which = np.searchsorted(cum, flat, side="right")
    offsets = flat - (cum[which] - counts[which])
    return [(shards[w], int(o)) for w, o in zip(which, offsets)]


def _even_starts(shards, context, count) -> list[tuple[np.ndarray, int]]:
    counts = _valid_starts(shards, context)
    cum = np.cumsum(counts)
    flat = np.linspace(0, cum[-1] - 1, num=count).astype(np.int64)
    which = np.searchsorted(cum, flat, side="right")
    offsets = flat - (cum[which] - counts[which])
    return [(shards[w], int(o)) for w, o in zip(which, offsets)]


def _windows(starts, context) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = np.stack([np.asarray(a[o:o + context + 1], dtype=np.int64) for a, o in starts])
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]
