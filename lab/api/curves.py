"""Runs' loss curves as the faces draw them, and what a curve says about growing.

    curve(run_id, ancestors)      the run's rows, each step once; with its ancestors' parts joined
                                  at the checkpoint step each child started from
    now(run_id, live)             the curve as far as the lab knows it now: the run's rows, then its
                                  running session's live ones (the monitor)
    png(curves, x, title, words)  the loss plot of one run or several (a comparison's y axis fits the
                                  curves where they are compared, not their first steps)
    draw(run_id, x)               the run's loss.png redrawn (`lab plot`)
    grow(run_id)                  "when to grow", decided from the run's curve with its ancestors'
"""
from __future__ import annotations

from pathlib import Path

from lab import sizing
from lab.kernel.metrics import read_metrics
from lab.kernel.plots import figure_png, loss_figure, save_loss_plot
from lab.machines.live import curve_rows
from lab.runs import lineage, load_run

FIT_FROM = 0.5  # a comparison's y axis fits the curves over the last half of the steps shown
MARGIN = 0.08  # of the fitted span, above and below


def one_curve(rows: list[dict]) -> list[dict]:
    """Each step once, in order: a training row per step and a val row per (step, val set), the
    later of two for the same step (a session that repeated steps after its checkpoint)."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        if isinstance(r.get("step"), int):
            last[(r["step"], "val", r.get("val_set")) if "val_loss" in r else (r["step"], "train")] = i
    keep = sorted(last.values(), key=lambda i: (rows[i]["step"], "val_loss" in rows[i], i))
    return [rows[i] for i in keep]


def lineage_rows(run_id: str) -> list[dict]:
    """A run's curve with its ancestors': each one's rows up to the step the next one started
    from, then the next one's after that step, so the parts join at the checkpoint step. A
    child's own copy of its parent's curve (a branch or a run started from another's checkpoint
    keeps one) is that parent's part: it is not drawn twice."""
    chain = [load_run(r) for r in lineage(load_run(run_id))]
    rows: list[dict] = []
    after = None
    for i, r in enumerate(chain):
        cut = (chain[i + 1].parent or {}).get("step") if i + 1 < len(chain) else None
        rows += [x for x in one_curve(read_metrics(r.folder))
                 if (after is None or x["step"] > after) and (cut is None or x["step"] <= cut)]
        after = cut if cut is not None else after
    return rows


def curve(run_id: str, ancestors: bool = False) -> list[dict]:
    """The run's rows, each step once; with `ancestors`, its ancestors' parts before its own."""
    return lineage_rows(run_id) if ancestors else one_curve(read_metrics(load_run(run_id).folder))


def now(run_id: str, live: dict | None = None) -> list[dict]:
    """The run's curve as far as the lab knows it now: its metrics up to the running session's
    first step, then that session's live rows (`RunStatus.live`; none once its outputs are in)."""
    return curve_rows(load_run(run_id), live)


def png(curves: dict[str, list[dict]], x: str = "step", title: str | None = None,
        words: dict[str, str] | None = None) -> bytes:
    """The loss plot of one run or several. Several are compared where they lie: the y axis spans
    their losses over the last part of the steps shown, so three runs near 0.4 are not drawn on
    one another at the bottom of a 0–7 axis that their first steps ask for."""
    fig = loss_figure(curves, x=x, title=title, words=words)
    if len(curves) > 1:
        span = compared_span(curves, x)
        if span is not None:
            fig.axes[0].set_ylim(*span)
    return figure_png(fig)


def compared_span(curves: dict[str, list[dict]], x: str = "step") -> tuple[float, float] | None:
    """(low, high) of the losses the curves have over the last (1 − FIT_FROM) of the x range they
    span together, with a margin; None when there is nothing there."""
    xs = [r[x] for rows in curves.values() for r in rows if isinstance(r.get(x), (int, float))]
    if not xs:
        return None
    start = min(xs) + FIT_FROM * (max(xs) - min(xs))
    ys = [r[k] for rows in curves.values() for r in rows for k in ("loss", "val_loss")
          if isinstance(r.get(k), (int, float)) and isinstance(r.get(x), (int, float)) and r[x] >= start]
    if not ys:
        return None
    low, high = min(ys), max(ys)
    pad = MARGIN * (high - low or abs(high) or 1.0)
    return low - pad, high + pad


def draw(run_id: str, x: str = "step") -> Path:
    """The run's loss.png drawn anew from its metrics; its path."""
    run = load_run(run_id)
    return save_loss_plot(run.folder, x=x, title=run.id)


def grow(run_id: str) -> sizing.Verdict:
    """The guide's "when to grow" for the run, from its curve with its ancestors' and its data."""
    cfg = load_run(run_id).cfg
    return sizing.when_to_grow(lineage_rows(run_id), sizing.find_manifest(cfg), cfg)
