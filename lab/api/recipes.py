"""The recipe lab: the points the lab's runs give, and L(N, D) = E + A/N^α + B/D^β fitted to them.

    points(file)              the lab's points (finished runs whose rate ended small), or a file's
    unpointed()               the lab's runs that gave no point, and why
    fit(...)                  the points of one val set (or, in bits per byte, one held-out text)
                              fitted with bootstrap intervals; saved for the calculator and drawn
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.config import UserError
from lab.home import lab_home
from lab.recipes.fit import Fit, fit_law, save_fit
from lab.recipes.plots import write_plots
from lab.recipes.points import Point, groups, in_bits_per_byte, lab_points, read_points_file, run_point
from lab.runs import Run, list_runs


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


def fit(points_file: str | None = None, val_set: str | None = None, bpb: bool = False, bootstrap: int = 100,
        plots_dir: str | None = None) -> Fitted:
    """Fits the group with the most points (or the one of `val_set`, an id prefix). The lab's own
    points' fit is saved (the calculator then predicts val loss for that data) and drawn into
    `plots_dir` (default `$LAB_HOME/recipes/plots`); a file's is drawn only where asked."""
    own = points_file is None
    found = points(points_file)
    if bpb:
        found = in_bits_per_byte(found)  # val_set is now the held-out text's id, tokenizer None
    by_group = groups(found)
    if val_set:
        by_group = {k: v for k, v in by_group.items() if (k[0] or "").startswith(val_set)}
        if not by_group:
            raise UserError(f"no points on val set {val_set!r}; `lab fit --list` shows the points")
    if not by_group:
        raise UserError("no points yet: finished runs whose rate ended small give points (lab sweep, lab branch)"
                        + ("; in bits per byte, only those whose data is in this lab home" if bpb else ""))
    key, chosen = max(by_group.items(), key=lambda kv: len(kv[1]))
    law = fit_law(chosen, bootstrap=bootstrap, metric="bpb" if bpb else "loss")
    saved = save_fit(law) if own and key != (None, None) else None
    plots_dir = plots_dir or (str(lab_home() / "recipes" / "plots") if own else None)
    drawn = [str(p) for p in write_plots(plots_dir, chosen, law, _runs_of(chosen) if own else [])] if plots_dir else []
    return Fitted(law, key, len(chosen), len(by_group) - 1, saved, drawn)


def _runs_of(chosen: list[Point]) -> list[Run]:
    """The registry runs behind the points, with the parents of branches (for the plots)."""
    ids = {p.run for p in chosen} | {p.branch_of for p in chosen}
    return [r for r in list_runs() if r.id in ids or (r.parent or {}).get("run") in ids]
