"""Loss curves: train loss and val loss, val drawn as separate segments per val set.

A val set is the held-out text of one selection of data; when a continued run adds data,
its val set changes and its val loss is no longer comparable with the old one, so each
val set gets its own line. Sessions (links of a run continued across machines) are
marked with a thin vertical line. Needs only matplotlib: it is also pasted into the
training notebook.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

from lab.kernel.checkpoint import atomic_write
from lab.kernel.metrics import read_metrics


def val_segments(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Consecutive val evaluations grouped by val set, in order."""
    out: list[tuple[str, list[dict]]] = []
    for r in rows:
        if "val_loss" not in r:
            continue
        if not out or out[-1][0] != r.get("val_set"):
            out.append((r.get("val_set"), []))
        out[-1][1].append(r)
    return out


def _smooth(values: list[float], weight: float) -> list[float]:
    # Debiased EMA (as TensorBoard draws it): it does not lag behind at the start.
    out, avg = [], 0.0
    for i, v in enumerate(values):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** (i + 1)))
    return out


# The plot's words; the control notebook passes its own language's (lab.ui.text.plot_words).
PLOT_WORDS = {"train": "train", "val": "val (set {set})", "step": "step", "tokens": "tokens",
              "loss": "loss (nats per token)", "title": "loss"}


def loss_figure(runs: dict[str, list[dict]], x: str = "step", title: str | None = None, words: dict | None = None):
    """A matplotlib Figure of one or more runs' losses; `x` is "step" or "tokens"; `words` the
    labels (PLOT_WORDS' keys), English when not given."""
    w = {**PLOT_WORDS, **(words or {})}
    # A bare Figure needs no pyplot and no backend: it renders with Agg wherever it runs.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.8), dpi=100)
    ax = fig.add_subplot()
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for i, (name, rows) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        label = f"{name}: " if len(runs) > 1 else ""
        train = [r for r in rows if "loss" in r]
        if train:
            xs = [r[x] for r in train]
            ys = [r["loss"] for r in train]
            ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(xs, _smooth(ys, 0.9 if len(ys) > 50 else 0.0), color=color, linewidth=1.5,
                    label=f"{label}{w['train']}")
        for j, (val_set, seg) in enumerate(val_segments(rows)):
            # One run: each val set its own colour. Several: the run's colour, dashed.
            val_color = colors[(j + 1) % len(colors)] if len(runs) == 1 else color
            ax.plot([r[x] for r in seg], [r["val_loss"] for r in seg], marker="o", markersize=3,
                    linestyle="-" if len(runs) == 1 else "--", color=val_color,
                    label=f"{label}{w['val'].format(set=str(val_set)[:8])}")
        for prev, cur in zip(train, train[1:]):
            if cur.get("session") != prev.get("session"):
                ax.axvline(cur[x], color="gray", linewidth=0.6, linestyle=":")
    ax.set_xlabel(w["tokens"] if x == "tokens" else w["step"])
    ax.set_ylabel(w["loss"])
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or w["title"])
    fig.tight_layout()
    return fig


class LiveCurve:
    """A run's curve for a live plot, kept small whatever the session's length: every evaluation,
    and the training rows thinned to at most `most` points (when it is full, neighbouring points
    of the same session merge into their mean), so a redraw at hour twelve costs what one at hour
    one did. `rows()` is what `loss_figure` draws."""

    def __init__(self, most: int = 2000):
        self.most, self.train, self.evals = most, [], []

    def add(self, rows: list[dict]) -> None:
        for r in rows:
            if "loss" in r:
                self.train.append({"step": r["step"], "tokens": r.get("tokens"), "loss": r["loss"],
                                   "session": r.get("session"), "n": 1})
            if "val_loss" in r:
                self.evals.append({k: r.get(k) for k in ("step", "tokens", "val_loss", "val_set", "session")})
        while len(self.train) > self.most and self._halve():
            pass

    def _halve(self) -> bool:
        """Merges neighbouring pairs of one session; whether that made the curve shorter."""
        merged, i, train = [], 0, self.train
        while i < len(train):
            a, b = train[i], train[i + 1] if i + 1 < len(train) else None
            if b is not None and a["session"] == b["session"]:
                n = a["n"] + b["n"]
                merged.append({**b, "loss": (a["loss"] * a["n"] + b["loss"] * b["n"]) / n, "n": n})
                i += 2
            else:
                merged.append(a)
                i += 1
        shorter = len(merged) < len(train)
        self.train = merged
        return shorter

    def rows(self) -> list[dict]:
        return self.train + self.evals


def figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save_loss_plot(run_dir: str | os.PathLike, x: str = "step", title: str | None = None) -> Path:
    """Draws a run's metrics.jsonl into `loss.png` beside it and returns the path."""
    run_dir = Path(run_dir)
    fig = loss_figure({run_dir.name: read_metrics(run_dir)}, x=x, title=title or run_dir.name)
    path = run_dir / "loss.png"
    png = figure_png(fig)
    atomic_write(path, lambda f: f.write(png))
    return path
