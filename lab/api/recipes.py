"""The recipe lab: the points the lab's runs give, and L(N, D) = E + A/N^α + B/D^β fitted to them.

    points(file)              the lab's points (finished runs whose rate ended small), or a file's
    unpointed()               the lab's runs that gave no point, and why
    fit(...)                  the points of one val set (or, in bits per byte, one held-out text)
                              fitted with 95% intervals; saved for the calculator and drawn
    predict(fit, N, D)        a Prediction: the law's loss at N weights and D tokens with its 95%
                              interval, which widens as N and D leave the fitted points
    beyond(fit)               the predictions that choose the next size: 3× and 20× the largest
                              size fitted, each at 20 tokens per weight
    groups(), saved(key), fit_group(key), figures(key, fit)   the control notebook's recipe panel
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.config import UserError
from lab.home import lab_home
from lab.kernel.plots import figure_png
from lab.recipes import plots
from lab.recipes.fit import Fit, fit_law, save_fit
from lab.recipes.plots import write_plots
from lab.recipes.points import Point, groups as point_groups, in_bits_per_byte, lab_points, read_points_file, run_point
from lab.runs import Run, list_runs
from lab.sizing import TOKENS_PER_WEIGHT
from lab.sizing.law import load_fit


@dataclass(frozen=True)
class Fitted:
    """A fit of the chosen group of points: which group (val set or held-out text, tokenizer),
    how many other groups were fitted apart, where it was saved and drawn."""
    fit: Fit
    group: tuple
    points: int
    others: int = 0
    saved: Path | None = None
    plots: list[str] = field(default_factory=list)


def points(points_file: str | None = None) -> list[Point]:
    return lab_points() if points_file is None else read_points_file(points_file)


def unpointed() -> list[tuple[str, str]]:
    """(run id, why) for each of the lab's runs that gave no point."""
    out = []
    for r in list_runs():
        point, why = run_point(r)
        if point is None:
            out.append((r.id, why))
    return out


def fit(points_file: str | None = None, val_set: str | None = None, bpb: bool = False,
        plots_dir: str | None = None) -> Fitted:
    """Fits the group with the most points (or the one of `val_set`, an id prefix). The lab's own
    points' fit is saved (the calculator then predicts val loss for that data) and drawn into
    `plots_dir` (default `$LAB_HOME/recipes/plots`); a file's is drawn only where asked."""
    own = points_file is None
    found = points(points_file)
    if bpb:
        found = in_bits_per_byte(found)  # val_set is now the held-out text's id, tokenizer None
    by_group = point_groups(found)
    if val_set:
        by_group = {k: v for k, v in by_group.items() if (k[0] or "").startswith(val_set)}
        if not by_group:
            raise UserError(f"no points on val set {val_set!r}; `lab fit --list` shows the points")
    if not by_group:
        raise UserError("no points yet: finished runs whose rate ended small give points (lab sweep, lab branch)"
                        + ("; in bits per byte, only those whose data is in this lab home" if bpb else ""))
    key, chosen = max(by_group.items(), key=lambda kv: len(kv[1]))
    law = fit_law(chosen, metric="bpb" if bpb else "loss")
    saved = save_fit(law) if own and key != (None, None) else None
    plots_dir = plots_dir or (str(lab_home() / "recipes" / "plots") if own else None)
    drawn = [str(p) for p in write_plots(plots_dir, chosen, law, _runs_of(chosen) if own else [])] if plots_dir else []
    return Fitted(law, key, len(chosen), len(by_group) - 1, saved, drawn)


def _runs_of(chosen: list[Point]) -> list[Run]:
    """The registry runs behind the points, with the parents of branches (for the plots)."""
    ids = {p.run for p in chosen} | {p.branch_of for p in chosen}
    return [r for r in list_runs() if r.id in ids or (r.parent or {}).get("run") in ids]


@dataclass(frozen=True)
class Prediction:
    """The law's loss at `weights` and `tokens`, its 95% interval (None: the fit could not say),
    and how far that is from the data (the size over the largest fitted)."""
    weights: int
    tokens: int
    loss: float
    interval: tuple[float, float] | None
    beyond: float | None

    def to_dict(self) -> dict:
        return {"weights": self.weights, "tokens": self.tokens, "loss": round(self.loss, 5),
                "interval": [round(v, 5) for v in self.interval] if self.interval else None,
                "beyond_largest": self.beyond}


def predict(law: Fit, weights: float, tokens: float) -> Prediction:
    if weights <= 0 or tokens <= 0:
        raise UserError(f"a prediction needs weights and tokens above 0 (got {weights:g}:{tokens:g})")
    return Prediction(int(weights), int(tokens), law.predict(weights, tokens), law.predict_interval(weights, tokens),
                      round(weights / law.largest, 2) if law.largest else None)


def beyond(law: Fit, factors: tuple[float, ...] = (3.0, 20.0)) -> list[Prediction]:
    """The law past its data, where the next size is chosen: sizes `factors` times the largest
    fitted, each trained on the tokens it wants (20 per weight)."""
    if not law.largest:
        return []
    return [predict(law, law.largest * f, TOKENS_PER_WEIGHT * law.largest * f) for f in factors]


# --- the control notebook's recipe panel -------------------------------------------------

def groups(runs: list[Run] | None = None) -> dict[str, list[Point]]:
    """The lab's points by "val_set|tokenizer" (a dropdown's values are plain strings)."""
    return {f"{k[0] or ''}|{k[1] or ''}": v for k, v in point_groups(lab_points(runs)).items()}


def saved(key: str) -> Fit | None:
    """The saved fit of a group ("val_set|tokenizer"), or None."""
    val_set, _, tokenizer = key.partition("|")
    return load_fit(val_set or None, tokenizer or None)


def fit_group(points: list[Point]) -> Fit:
    """Fits a group's points and saves the fit for the calculator."""
    law = fit_law(points)
    save_fit(law)
    return law


def figures(points: list[Point], law: Fit, runs: list[Run]) -> list[bytes]:
    """The panel's plots as PNGs: loss against tokens, iso-loss, residuals, loss against the
    learning rate, the schedules (those the points allow)."""
    figs = [plots.loss_vs_tokens(points, law), plots.isoloss(law, points), plots.residuals(points, law),
            plots.loss_vs_lr(points), plots.schedules(runs)]
    out = []
    import matplotlib.pyplot as plt  # matplotlib: only when a plot is drawn
    for fig in figs:
        if fig is not None:
            out.append(figure_png(fig))
            plt.close(fig)
    return out


def runs() -> list[Run]:
    return list_runs()
