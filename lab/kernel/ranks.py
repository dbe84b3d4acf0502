"""The ranks of a run agreeing: a few numbers summed, or one object from each, in one collective.

In one process there is nothing to agree on and nothing is sent; under DDP every rank calls these
at the same step (the loop's sync points, a save), so none ever waits for another in between.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def all_ranks(obj, rt) -> list:
    """`obj` from every rank, in rank order (`rt`: this process's `step.Runtime`)."""
    if rt.world == 1:
        return [obj]
    out = [None] * rt.world
    dist.all_gather_object(out, obj)
    return out


def agree(values: list[float], rt) -> list[float]:
    """Sums small numbers across ranks (losses, stop flags) in one collective."""
    t = torch.tensor(values, dtype=torch.float64, device=rt.device if rt.device.type == "cuda" else "cpu")
    sum_ranks(t, rt)
    return t.tolist()


def sum_ranks(t: torch.Tensor, rt) -> None:
    """Sums `t` across ranks in place (nothing to do in one process)."""
    if rt.world > 1:
        dist.all_reduce(t)
