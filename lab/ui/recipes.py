"""The recipe lab in the control notebook: the lab's points per val set, the fit with its
intervals, the law past its data (where the next size is chosen, each prediction with its 95%
interval), its figures, and a cooldown branch from a WSD run's checkpoint.

    from lab.ui.recipes import recipe_lab
    recipe_lab()

numpy, scipy and matplotlib load only when the panel fits or draws.
"""
from __future__ import annotations

import ipywidgets as widgets

from lab.api import recipes
from lab.config import UserError
from lab.ui.branch import BranchRow
from lab.ui.parts import tell
from lab.ui.text import Panel, error_text, esc, on_language, tr

CELL = "padding:2px 8px;text-align:left"


class RecipePanel(Panel):
    """Points, the fit and its plots for one val set; a branch from a run's checkpoint."""

    def __init__(self):
        self.data = widgets.Dropdown(layout=widgets.Layout(width="32em"))
        self.fit_button = widgets.Button(icon="line-chart", layout=widgets.Layout(width="auto"))
        self.refresh_button = widgets.Button(icon="refresh", layout=widgets.Layout(width="auto"))
        self.summary = widgets.HTML()
        self.summary.add_class("lab-recipes-fit")
        self.plots = widgets.VBox([])
        self.branching = BranchRow(on_started=lambda run_id: tell("started", run_id))
        self.box = widgets.VBox([widgets.HBox([self.data, self.fit_button, self.refresh_button]), self.summary,
                                 self.plots, self.branching.box])
        self.box.add_class("lab-recipes")
        self.fit_button.on_click(lambda _: self.fit())
        self.refresh_button.on_click(lambda _: self.refresh())
        self.data.observe(lambda _: self.show_fit(), names="value")
        on_language(self._relabel)
        self._relabel()

    def _relabel(self) -> None:
        self.fit_button.description = tr("Fit the law", "Подогнать закон")
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.refresh()

    # --- points and the fit -----------------------------------------------------------
    def refresh(self) -> None:
        self.runs = recipes.runs()
        self.groups = recipes.groups(self.runs)  # keyed by "val_set|tokenizer": a dropdown's values are strings
        options = [(f"{tr('val set', 'val-выборка')} {(k.split('|')[0] or '?')[:12]} · {len(v)} {tr('points', 'точек')}", k)
                   for k, v in sorted(self.groups.items(), key=lambda kv: -len(kv[1]))]
        self.data.options = options or [(tr("no points yet", "точек пока нет"), "")]
        self.data.value = self.data.options[0][1]
        self.data.description = tr("Data", "Данные")
        self.show_fit()
        self.branching.refresh(self.runs)

    def show_fit(self) -> None:
        key = self.data.value
        if not key:
            self.summary.value = esc(tr("Points come from finished runs and branches whose learning rate ended small "
                                        "(lab sweep, lab branch).",
                                        "Точки дают законченные прогоны и ветки, чья скорость обучения упала в конце "
                                        "(lab sweep, lab branch)."))
            self.plots.children = []
            return
        fit = recipes.saved(key)
        self.summary.value = _fit_html(fit, len(self.groups.get(key, [])))
        self.plots.children = self._figures(key, fit) if fit else []

    def fit(self) -> None:
        key = self.data.value
        if not key:
            return
        try:
            recipes.fit_group(self.groups[key])
        except UserError as e:
            self.summary.value = f"<span style='color:#d32f2f'>{esc(error_text(e))}</span>"
            return
        self.show_fit()

    def _figures(self, key, fit) -> list:
        return [widgets.Image(value=png, format="png", layout=widgets.Layout(max_width="760px"))
                for png in recipes.figures(self.groups[key], fit, self.runs)]


def _fit_html(fit, n_points: int) -> str:
    if fit is None:
        return esc(tr(f"{n_points} points; no fit yet: press Fit the law (it needs ≥ 3 sizes with ≥ 3 D each).",
                      f"{n_points} точек; закон ещё не подогнан: нажмите «Подогнать закон» (нужно ≥ 3 размеров по ≥ 3 D)."))
    rows = []
    for name, sym in (("E", "E"), ("A", "A"), ("B", "B"), ("alpha", "α"), ("beta", "β")):
        lo, hi = fit.intervals.get(name, (None, None))
        band = f"[{lo:.4g}, {hi:.4g}]" if lo is not None else "—"
        rows.append(f"<tr><td style='{CELL}'>{sym}</td><td style='{CELL}'><b>{getattr(fit, name):.4g}</b></td>"
                    f"<td style='{CELL};color:#666'>{band}</td></tr>")
    head = esc(tr(f"L(N, D) = E + A/N^α + B/D^β from {fit.points} points ({fit.sizes} sizes), 95 % intervals",
                  f"L(N, D) = E + A/N^α + B/D^β по {fit.points} точкам ({fit.sizes} размеров), 95 % интервалы"))
    return (f"<div>{head}</div><table class='lab-recipes-params' style='border-collapse:collapse'>{''.join(rows)}</table>"
            + _grow_html(fit))


def _grow_html(fit) -> str:
    """When to grow, by the law: sizes 3× and 20× the largest fitted at 20 tokens per weight, each
    with the 95% interval where a run would land (it widens past the data: the law says how sure
    it is there)."""
    rows = []
    for p in recipes.beyond(fit):
        band = f"{p.interval[0]:.3f}–{p.interval[1]:.3f}" if p.interval else tr("no interval", "без интервала")
        size = tr(f"{p.beyond:g}× the largest: {p.weights:,} weights, {p.tokens:,} tokens",
                  f"{p.beyond:g}× крупнейшего: весов {p.weights:,}, токенов {p.tokens:,}".replace(",", "\u00a0"))
        rows.append(f"<tr><td style='{CELL}'>{esc(size)}</td><td style='{CELL}'><b>{p.loss:.3f}</b></td>"
                    f"<td style='{CELL};color:#666'>{esc(band)}</td></tr>")
    if not rows:
        return ""
    head = esc(tr("When to grow: the law past its data (95 %, where a run would land)",
                  "Когда расти: закон за пределами точек (95 %, где окажется прогон)"))
    return f"<div style='margin-top:6px'>{head}</div><table class='lab-recipes-grow' style='border-collapse:collapse'>{''.join(rows)}</table>"


def recipe_lab() -> RecipePanel:
    """The control notebook's recipe-lab cell."""
    return RecipePanel().show()
