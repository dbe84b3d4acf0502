"""Named points where the control side may die between a side effect and its record.

The Kaggle host calls `reached(point)` right after each side effect it records only afterwards:
an upload (`after-data-upload`, `after-checkpoints-upload`), the push (`after-push`), the
download (`after-download`). In the kit nothing is registered at any point, and `reached` does
nothing. A test kills the control side exactly there (`with at("after-push", crash): ...`) and
checks that the next driver neither loses nor repeats what was done.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

POINTS = frozenset({"after-data-upload", "after-checkpoints-upload", "after-push", "after-download"})
_actions: dict[str, Callable[[str], None]] = {}


def reached(point: str) -> None:
    """The control side is at `point`: runs what a test registered there, in this process."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r} (known: {', '.join(sorted(POINTS))})")
    action = _actions.get(point)
    if action is not None:
        action(point)


@contextmanager
def at(point: str, action: Callable[[str], None]) -> Iterator[None]:
    """`action(point)` runs whenever `point` is reached inside the block (a test's fault)."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r} (known: {', '.join(sorted(POINTS))})")
    _actions[point] = action
    try:
        yield
    finally:
        _actions.pop(point, None)
