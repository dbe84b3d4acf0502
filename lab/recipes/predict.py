"""The calculator's predicted val loss: the lab's fit for the selected data at the form's N
and D, of kind "fitted", with its 95% interval (widening as N and D leave the fitted points:
lab.sizing.law) and the size the fit calls compute-optimal for the tokens the data has.

The callers that show an estimate combine it with this (`predicted(est)`): the form on every
keystroke and `lab size`. Stdlib only (the fit file is read once per change of its mtime), no
numpy, no scipy.
"""
from __future__ import annotations

from lab.config import RunConfig
from lab.sizing.law import law_for
from lab.sizing.figures import Estimate, Figure
from lab.sizing.words import format_count

KIND = "fitted"


def predicted(est: Estimate) -> Figure | None:
    """The estimate's predicted final val loss at its N and D (None without a fit for its data)."""
    cfg = est.config
    if cfg is None:
        return None
    return predict(cfg, est.manifest, est.weights.value, (est.tokens_per_step.value or 0) * cfg.steps_until,
                   est.tokens_available.value)


def predict(cfg: RunConfig, manifest: dict | None, weights: int | None, tokens: int | None,
            tokens_available: int | None = None):
    """A `lab.sizing.Figure` of the predicted final val loss, or None when the lab has no fit
    for this data (its val set and tokenizer) or N or D is unknown."""
    if not manifest or not weights or not tokens:
        return None
    fit = law_for(manifest)
    if fit is None:
        return None
    value = fit.predict(weights, tokens)
    extra: dict = {"fit_points": fit.points, "beyond_largest": round(weights / fit.largest, 2) if fit.largest else None}
    band = fit.predict_interval(weights, tokens)
    if band:
        extra["interval"] = [round(band[0], 4), round(band[1], 4)]
    if tokens_available:
        extra["compute_optimal_weights"] = int(fit.optimal_weights_for_tokens(tokens_available))
    law = f"L = {fit.E:.3f} + {fit.A:.3g}/N^{fit.alpha:.3f} + {fit.B:.3g}/D^{fit.beta:.3f}"
    return Figure(round(value, 4), KIND, "loss", f"{law}, fitted to the lab's {fit.points} points on this val set",
                  f"{law}, подогнано по {fit.points} точкам лабы на этой val-выборке", extra)


def predicted_text(fig, lang: str = "en") -> str:
    """"3.412 (3.39–3.44); compute-optimal for the data: 12.3M weights" for the form and `lab size`."""
    text = f"{fig.value:.3f}"
    band = fig.extra.get("interval")
    if band:
        text += f" ({band[0]:.3f}–{band[1]:.3f})"
    best = fig.extra.get("compute_optimal_weights")
    if best:
        text += (f"; оптимально по вычислениям для этих данных: {format_count(best, lang)} весов" if lang == "ru"
                 else f"; compute-optimal for the data: {format_count(best, lang)} weights")
    return text
