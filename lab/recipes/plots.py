"""The recipe lab's figures, as PNG files and as matplotlib figures for the control notebook.

    loss_vs_tokens    val loss against tokens, one colour per size, with the fitted curves
    isoloss           iso-loss contours of the fit in (N, D) with the compute-optimal line
    residuals         observed − fitted loss of every point
    loss_vs_lr        final loss against the learning rate, one line per size (an lr sweep)
    schedules         the schedules side by side at equal N and D: their rates and val curves
    branches          a WSD run with its cooldown branches bending down from it

Every function takes what it draws and returns a Figure; `write_plots` saves the ones the
data allows. matplotlib is imported inside (the Agg backend unless one is chosen).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from lab.kernel.metrics import read_metrics
from lab.kernel.schedule import lr_for_config
from lab.recipes.branch import branches_of
from lab.recipes.fit import Fit
from lab.recipes.points import Point, ends_small, is_branch


def _plt():
    import matplotlib  # matplotlib: only when a plot is drawn
    if matplotlib.get_backend().lower().startswith(("qt", "tk", "gtk", "wx", "macosx")):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: only when a plot is drawn
    return plt


def _by_size(points: Sequence[Point]) -> dict[int, list[Point]]:
    out: dict[int, list[Point]] = {}
    for p in sorted(points, key=lambda p: (p.weights, p.tokens)):
        out.setdefault(p.weights, []).append(p)
    return out


def _size_label(p: Point) -> str:
    shape = f"{p.layers}×{p.width}, " if p.layers and p.width else ""
    return f"{shape}{_count(p.weights)} weights"


def _count(x: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _axes(fit: Fit | None) -> tuple[str, str]:
    """The words of D and L on the fit's scale."""
    if fit is not None and fit.metric == "bpb":
        return "bytes of text D", "final val bits per byte"
    return "tokens D", "final val loss"


def loss_vs_tokens(points: Sequence[Point], fit: Fit | None = None):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = _by_size(points)
    colors = plt.cm.viridis([i / max(1, len(sizes) - 1) for i in range(len(sizes))])
    d_lo = min(p.tokens for p in points) / 1.5
    d_hi = max(p.tokens for p in points) * 3
    for color, (n, pts) in zip(colors, sizes.items()):
        ax.scatter([p.tokens for p in pts], [p.val_loss for p in pts], color=color, label=_size_label(pts[0]), zorder=3)
        if fit is not None:
            ds = [d_lo * (d_hi / d_lo) ** (i / 60) for i in range(61)]
            ax.plot(ds, [fit.predict(n, d) for d in ds], color=color, lw=1.2)
    if fit is not None:
        ax.axhline(fit.E, color="grey", ls=":", lw=1, label=f"E = {fit.E:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel(_axes(fit)[0])
    ax.set_ylabel(_axes(fit)[1])
    ax.set_title(_law_title(fit) if fit else "val loss against tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _law_title(fit: Fit) -> str:
    return (f"L = {fit.E:.3f} + {fit.A:.3g}/N^{fit.alpha:.3f} + {fit.B:.3g}/D^{fit.beta:.3f}"
            f"  ({fit.points} points)")


def isoloss(fit: Fit, points: Sequence[Point] = ()):
    import numpy as np  # numpy: only when a plot is drawn
    plt = _plt()
    ns = [p.weights for p in points] or [1e5, 1e8]
    ds = [p.tokens for p in points] or [1e6, 1e10]
    n_axis = np.logspace(math.log10(min(ns)) - 1, math.log10(max(ns)) + 1.5, 120)
    d_axis = np.logspace(math.log10(min(ds)) - 1, math.log10(max(ds)) + 1.5, 120)
    nn, dd = np.meshgrid(n_axis, d_axis)
    loss = fit.E + fit.A / nn ** fit.alpha + fit.B / dd ** fit.beta
    fig, ax = plt.subplots(figsize=(7, 5))
    cs = ax.contour(nn, dd, loss, levels=12, cmap="viridis")
    ax.clabel(cs, fontsize=7, fmt="%.2f")
    flops = np.logspace(math.log10(6 * n_axis[0] * d_axis[0]), math.log10(6 * n_axis[-1] * d_axis[-1]), 80)
    opt = [fit.optimal_split(c) for c in flops]
    ax.plot([o[0] for o in opt], [o[1] for o in opt], color="crimson", lw=2, label="compute-optimal (C = 6ND)")
    if points:
        ax.scatter(ns, ds, color="black", s=12, label="points", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(n_axis[0], n_axis[-1])
    ax.set_ylim(d_axis[0], d_axis[-1])
    ax.set_xlabel("weights N")
    ax.set_ylabel("tokens D")
    ax.set_title("iso-loss contours of the fit")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def residuals(points: Sequence[Point], fit: Fit):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    sizes = _by_size(points)
    colors = plt.cm.viridis([i / max(1, len(sizes) - 1) for i in range(len(sizes))])
    for color, (n, pts) in zip(colors, sizes.items()):
        ax.scatter([p.tokens for p in pts], [p.val_loss - fit.predict(p.weights, p.tokens) for p in pts],
                   color=color, label=_size_label(pts[0]))
    ax.axhline(0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel(_axes(fit)[0])
    ax.set_ylabel(f"observed − fitted {_axes(fit)[1].removeprefix('final val ')}")
    ax.set_title("residuals")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_vs_lr(points: Sequence[Point]):
    """Needs points of one size at several learning rates (an lr sweep); None otherwise."""
    plt = _plt()
    sizes = {n: pts for n, pts in _by_size([p for p in points if p.lr]).items() if len({p.lr for p in pts}) > 1}
    if not sizes:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for n, pts in sizes.items():
        best: dict[float, Point] = {}
        tokens = max(p.tokens for p in pts)  # equal D: the sweep's full runs, not its branches
        for p in pts:
            if p.tokens == tokens:
                best[p.lr] = p
        lrs = sorted(best)
        ax.plot(lrs, [best[lr].val_loss for lr in lrs], marker="o", label=f"{_size_label(pts[0])}, {_count(tokens)} tokens")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final val loss")
    ax.set_title("loss against learning rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def schedules(runs: Sequence) -> object | None:
    """Runs of equal N and D with different schedules: their rates (left) and val curves
    (right), the final losses in the legend. None unless two schedules meet at one (N, D)."""
    groups: dict[tuple, dict[str, object]] = {}
    for run in runs:
        cfg = run.cfg
        if run.status != "done" or is_branch(run) or not ends_small(cfg):
            continue
        key = (cfg.layers, cfg.width, cfg.context, cfg.batch_per_card, cfg.grad_accum, cfg.steps_until, cfg.lr)
        groups.setdefault(key, {})[cfg.schedule] = run
    best = max(groups.values(), key=len, default={})
    if len(best) < 2:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in sorted(best.items()):
        cfg = run.cfg
        steps = list(range(0, cfg.steps_until + 1, max(1, cfg.steps_until // 200)))
        left.plot(steps, [lr_for_config(s, cfg) for s in steps], label=name)
        vals = [r for r in read_metrics(run.folder) if "val_loss" in r]
        if vals:
            right.plot([r["tokens"] for r in vals], [r["val_loss"] for r in vals], marker=".",
                       label=f"{name}: {vals[-1]['val_loss']:.4f}")
    cfg = next(iter(best.values())).cfg
    left.set_xlabel("step")
    left.set_ylabel("learning rate")
    left.set_title("the schedules")
    right.set_xlabel("tokens")
    right.set_ylabel("val loss")
    right.set_title(f"{cfg.layers}×{cfg.width}, {cfg.steps_until} steps: final val loss")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def branches(parent, kids: Sequence) -> object:
    """The parent's val curve with its cooldown branches: each bends down where it starts."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    vals = [r for r in read_metrics(parent.folder) if "val_loss" in r]
    train = [r for r in read_metrics(parent.folder) if "loss" in r]
    if train:
        ax.plot([r["tokens"] for r in train], [r["loss"] for r in train], color="lightgrey", lw=0.8, label="train loss")
    ax.plot([r["tokens"] for r in vals], [r["val_loss"] for r in vals], color="black", marker=".", label=parent.id)
    for kid in kids:
        at = kid.parent.get("step", 0)
        rows = [r for r in read_metrics(kid.folder) if "val_loss" in r and r["step"] >= at]
        if rows:
            ax.plot([r["tokens"] for r in rows], [r["val_loss"] for r in rows], marker="o", ms=3,
                    label=f"branch at step {at}")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss")
    ax.set_title("a WSD run and its cooldown branches")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_plots(folder: str | Path, points: Sequence[Point], fit: Fit | None = None, runs: Sequence = ()) -> list[Path]:
    """Saves every figure the data allows into `folder`; returns the files. A fit in bits per
    byte gets its law's own two (C = 6·N·D counts tokens, so no iso-loss; runs plot in tokens)."""
    plt = _plt()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    figures = {}
    in_bpb = fit is not None and fit.metric == "bpb"
    if in_bpb and points:
        figures["bpb-vs-bytes.png"] = loss_vs_tokens(points, fit)
        figures["bpb-residuals.png"] = residuals(points, fit)
    if not in_bpb and points:
        figures["loss-vs-tokens.png"] = loss_vs_tokens(points, fit)
        figures["loss-vs-lr.png"] = loss_vs_lr(points)
    if not in_bpb and fit is not None:
        figures["isoloss.png"] = isoloss(fit, points)
        figures["residuals.png"] = residuals(points, fit) if points else None
    if runs and not in_bpb:
        figures["schedules.png"] = schedules(runs)
        for run in runs:
            kids = branches_of(run.id, list(runs))
            if kids:
                figures[f"branches-{run.id}.png"] = branches(run, kids)
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written.append(folder / name)
    return written
