"""The fit: L(N, D) = E + A/N^α + B/D^β from the lab's points (Chinchilla's approach 3).

The parameters are fitted in log space (E = e^e, A = e^a, B = e^b) by least squares on
log L_predicted − log L_observed, robustly: residuals beyond 1.345 of the points' own robust
deviation count by their size, not its square (Huber's loss with its scale taken from the points,
so that one broken run does not bend the law), from a grid of starting values (the loss surface
has shallow minima: one start is not enough).

How sure the fit is: the parameters' covariance from the curvature of that least squares at its
minimum, with the points' own scatter (Gauss-Newton's (JᵀWJ)⁻¹ times their deviation, on n − 5
degrees of freedom); intervals from Student's t. Four sizes tell the law's N-side apart far less
than twenty points suggest, and this says so: the intervals of E, A and α are as wide as the sizes
leave them, and a prediction's interval (lab.sizing.law) widens as it leaves the data. A
bootstrap over the points did not (issue 41: E's and β's intervals missed the made-up law).

The law fits in either of two scales (`Fit.metric`): "loss", nats per token against tokens,
within one val set and tokenizer (what the calculator predicts with); or "bpb", bits per byte
against bytes of text, across tokenizers on one held-out text (`points.in_bits_per_byte`).
The fitted law, its predictions and the fits on disk are lab.sizing.law's (the calculator reads
them without numpy); numpy and scipy are imported inside the functions here.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from lab.config import UserError
from lab.kernel.checkpoint import atomic_write
from lab.recipes.points import Point, group_key, sizes_with_enough_tokens
from lab.sizing.law import PARAMS, Fit, fit_file, law  # noqa: F401 (law: the recipe lab's name for it too)

MIN_SIZES, MIN_D_PER_SIZE = 3, 3
MAX_EXPONENT = 10.0  # tiny early-training studies fit steep exponents (3 and more); beyond this it is degenerate
EXPONENT_MIN = 1e-4  # and an exponent at zero is a term that does not fall: a constant E already is
HUBER_K = 1.345  # Huber's scale in robust deviations: 95% as efficient as least squares on clean points
NOISE_FLOOR = 1e-4  # a relative deviation below which points are as good as exact (a made-up law without noise)


class NotEnoughPoints(UserError):
    """Too few points for the law to say anything; nothing was fitted."""


def check_enough(points: Sequence[Point]) -> None:
    """Raises NotEnoughPoints unless at least three sizes each have three token counts."""
    enough = sizes_with_enough_tokens(points, MIN_D_PER_SIZE)
    if len(enough) < MIN_SIZES:
        per = {}
        for p in points:
            per.setdefault(p.weights, set()).add(p.tokens)
        have = ", ".join(f"{n:,} weights: {len(d)} D" for n, d in sorted(per.items())) or "no points"
        raise NotEnoughPoints(
            f"too few points to fit the law ({have}): it needs at least {MIN_SIZES} sizes with "
            f"{MIN_D_PER_SIZE} token counts each; run more sizes or cooldown branches (lab sweep)")


def fit_law(points: Sequence[Point], *, metric: str = "loss") -> Fit:
    """Fits the law to points of one val set and tokenizer (mixing them is an error); with
    metric "bpb", to points on the bits-per-byte scale of one val text."""
    keys = {group_key(p) for p in points}
    if len(keys) > 1:
        raise UserError(f"the points come from {len(keys)} different val sets or tokenizers; fit one group "
                        f"at a time (lab fit --val-set ID), or fit in bits per byte across tokenizers (lab fit --bpb)")
    check_enough(points)
    points = sorted(points, key=lambda p: (p.weights, p.tokens, p.val_loss))  # the same fit in any order
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    n = np.log(np.array([p.weights for p in points], dtype=float))
    d = np.log(np.array([p.tokens for p in points], dtype=float))
    y = np.log(np.array([p.val_loss for p in points], dtype=float))
    best, scale = _fit_logs(n, d, y, _grid_starts(n, d, y))
    if best is None:
        raise UserError(f"the fit found no law with exponents in (0, {MAX_EXPONENT:g}] for these points: their losses do not "
                        "fall with N and D; check the runs (lab fit --list) or add points")
    val_set, tokenizer = next(iter(keys))
    fit = Fit(*_natural(best.x), points=len(points), sizes=len({p.weights for p in points}), val_set=val_set,
              tokenizer=tokenizer, objective=float(best.cost), metric=metric, largest=float(max(p.weights for p in points)))
    r, jac = _residuals(best.x, n, d, y)
    jac[:, 0] = np.exp(-(r + y))  # over E itself, not log E (1/L): a law whose floor is near 0 is still told apart
    _how_sure(fit, best.x, r, jac, scale)
    return fit


def _how_sure(fit: Fit, theta, r, jac, scale: float) -> None:
    """The covariance, the points' noise, t and the parameters' 95% intervals, from the curvature of
    the robust least squares at its minimum θ (residuals `r`, their Jacobian `jac` over E, log A,
    log B, α, β); none where it cannot tell the parameters apart."""
    import numpy as np  # numpy: only for a fit
    from scipy.stats import t as student  # scipy: only for a fit
    count = len(r)
    weights = np.minimum(1.0, scale / np.maximum(np.abs(r), 1e-300))  # Huber's: 1 within its scale
    dof = max(count - len(PARAMS), 1)
    noise = max(math.sqrt(float(np.sum(weights * r * r)) / dof), NOISE_FLOOR)
    info = jac.T @ (weights[:, None] * jac)
    eig = np.linalg.eigvalsh(info)
    fit.noise, fit.t95 = noise, float(student.ppf(0.975, dof))
    if eig[0] <= 1e-12 * eig[-1]:
        return  # a direction the points do not constrain: no interval is claimed
    cov = noise ** 2 * np.linalg.inv(info)
    fit.cov = [[float(v) for v in row] for row in cov]
    for i, name in enumerate(PARAMS):
        half = fit.t95 * math.sqrt(cov[i, i])
        centre = math.exp(theta[0]) if i == 0 else float(theta[i])
        lo, hi = centre - half, centre + half
        fit.intervals[name] = [max(lo, 0.0), hi] if i == 0 else [math.exp(lo), math.exp(hi)] if i < 3 else [lo, hi]


def _natural(theta) -> tuple[float, float, float, float, float]:
    e, a, b, alpha, beta = (float(v) for v in theta)
    return math.exp(e), math.exp(a), math.exp(b), alpha, beta


def _grid_starts(n, d, y, keep: int = 3) -> list:
    """Starting values: for a grid of (α, β) the law is linear in (E, A, B), so each grid point
    gets its best non-negative (E, A, B) by least squares; the `keep` best grid points start
    the fit, with one of Chinchilla's fixed starts beside them (Gauss-Newton takes each from
    there to its minimum in a few dozen steps: a coarse grid is enough)."""
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    from scipy.optimize import nnls  # scipy: only for a fit
    loss = np.exp(y)
    scored = []
    for alpha in np.linspace(0.05, 1.5, 16):
        for beta in np.linspace(0.05, 1.5, 16):
            m = np.stack([np.ones_like(n), np.exp(-alpha * n), np.exp(-beta * d)], axis=1) / loss[:, None]
            coef, resid = nnls(m, np.ones_like(loss))
            scored.append((resid, coef, alpha, beta))
    scored.sort(key=lambda t: t[0])
    floor = 1e-6 * float(loss.min())
    starts = [np.array([math.log(max(c[0], floor)), math.log(max(c[1], floor)), math.log(max(c[2], floor)), al, be])
              for _, c, al, be in scored[:keep]]
    lowest = float(np.min(y))
    starts.append(np.array([lowest + math.log(0.5), 5.0, 5.0, 0.5, 0.5]))
    return starts


def _residuals(theta, n, d, y):
    """log L_predicted − log L_observed of every point, and their Jacobian over θ."""
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    e, a, b, alpha, beta = theta
    terms = np.stack([np.full_like(n, e), a - alpha * n, b - beta * d])
    top = terms.max(axis=0)
    w = np.exp(terms - top)
    pred = top + np.log(w.sum(axis=0))
    share = w / w.sum(axis=0)  # d pred / d term
    jac = np.stack([share[0], share[1], share[2], -share[1] * n, -share[2] * d], axis=1)
    return pred - y, jac


def _fit_logs(n, d, y, starts) -> tuple:
    """The best robust least-squares fit over `starts` (scipy's result, or None) and Huber's scale:
    first plain least squares, whose residuals give the points' robust deviation, then Huber's
    loss at that scale from the best of them."""
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    from scipy.optimize import least_squares  # scipy: only for a fit
    lower, upper = [-np.inf] * 3 + [EXPONENT_MIN] * 2, [np.inf] * 3 + [MAX_EXPONENT] * 2
    fun = lambda th: _residuals(th, n, d, y)[0]  # noqa: E731
    jac = lambda th: _residuals(th, n, d, y)[1]  # noqa: E731

    def solve(start, loss: str = "linear", scale: float = 1.0):
        try:
            res = least_squares(fun, np.clip(start, lower, upper), jac=jac, bounds=(lower, upper), method="trf",
                                loss=loss, f_scale=scale, x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12,
                                max_nfev=400)
        except (ValueError, FloatingPointError):
            return None
        # An exponent at its bound is a degenerate law (no minimum inside), not a fit.
        ok = all(math.isfinite(v) for v in res.x) and all(1.01 * EXPONENT_MIN < v < 0.999 * MAX_EXPONENT
                                                          for v in res.x[3:])
        return res if ok else None
    found = [r for r in map(solve, starts) if r is not None]
    if not found:
        return None, 0.0
    plain = min(found, key=lambda r: r.cost)
    mad = float(np.median(np.abs(plain.fun - np.median(plain.fun))))
    scale = HUBER_K * max(1.4826 * mad * math.sqrt(len(y) / max(len(y) - len(PARAMS), 1)), NOISE_FLOOR)
    robust = solve(plain.x, "huber", scale)
    return (robust or plain), scale


# --- fits on disk: one per val set and tokenizer (lab.sizing.law reads them) -----------------

def save_fit(fit: Fit) -> Path:
    path = fit_file(fit.val_set, fit.tokenizer, fit.metric)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(json.dumps(fit.to_dict(), indent=1).encode("utf-8")))
    return path
