"""The fit: L(N, D) = E + A/N^α + B/D^β from the lab's points (Chinchilla's approach 3).

The parameters are fitted in log space (E = e^e, A = e^a, B = e^b) by minimizing the Huber
loss of log L_predicted − log L_observed, from a grid of starting values (the loss surface
has many shallow minima: one start is not enough). Intervals come from a bootstrap:
the points resampled with replacement, each sample refitted from the best fit and a few
starts around it.

The law fits in either of two scales (`Fit.metric`): "loss", nats per token against tokens,
within one val set and tokenizer (what the calculator predicts with); or "bpb", bits per byte
against bytes of text, across tokenizers on one held-out text (`points.in_bits_per_byte`).

numpy and scipy are imported inside the functions: the calculator imports this module's
light neighbours on every keystroke.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from lab.config import UserError
from lab.home import lab_home
from lab.kernel.checkpoint import atomic_write
from lab.recipes.points import Point, group_key, sizes_with_enough_tokens

PARAMS = ("E", "A", "B", "alpha", "beta")
HUBER_DELTA = 1e-3  # Chinchilla's: the log losses differ by far less than 1
MIN_SIZES, MIN_D_PER_SIZE = 3, 3
MAX_EXPONENT = 10.0  # tiny early-training studies fit steep exponents (3 and more); beyond this it is degenerate


class NotEnoughPoints(UserError):
    """Too few points for the law to say anything; nothing was fitted."""


@dataclass
class Fit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    points: int
    sizes: int
    intervals: dict = field(default_factory=dict)  # name -> [low, high], 95 % bootstrap
    samples: list = field(default_factory=list)  # bootstrap parameter sets [E, A, B, alpha, beta]
    val_set: str | None = None
    tokenizer: str | None = None
    objective: float = 0.0
    metric: str = "loss"  # or "bpb": L in bits per byte, D in bytes of text

    def predict(self, weights: float, tokens: float) -> float:
        return law(weights, tokens, self.E, self.A, self.B, self.alpha, self.beta)

    def predict_interval(self, weights: float, tokens: float) -> tuple[float, float] | None:
        """The 95 % band of the prediction over the bootstrap fits (None without samples)."""
        values = sorted(law(weights, tokens, *s) for s in self.samples)
        if len(values) < 10:
            return None
        return values[int(0.025 * (len(values) - 1))], values[int(math.ceil(0.975 * (len(values) - 1)))]

    def optimal_weights_for_tokens(self, tokens: float) -> float:
        """The size for which `tokens` is the compute-optimal amount: where the two terms'
        marginal gains balance, α·A/N^α = β·B/D^β."""
        return (self.alpha * self.A * tokens ** self.beta / (self.beta * self.B)) ** (1 / self.alpha)

    def optimal_split(self, flops: float) -> tuple[float, float]:
        """(N, D) that minimize the loss at compute C = 6·N·D."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))
        n = g * (flops / 6) ** (self.beta / (self.alpha + self.beta))
        return n, flops / (6 * n)

    def to_dict(self, samples: bool = True) -> dict:
        d = asdict(self)
        if not samples:
            d.pop("samples")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Fit":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def law(weights: float, tokens: float, E: float, A: float, B: float, alpha: float, beta: float) -> float:
    return E + A / weights ** alpha + B / tokens ** beta


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


def fit_law(points: Sequence[Point], *, bootstrap: int = 100, seed: int = 0, metric: str = "loss") -> Fit:
    """Fits the law to points of one val set and tokenizer (mixing them is an error); with
    metric "bpb", to points on the bits-per-byte scale of one val text."""
    keys = {group_key(p) for p in points}
    if len(keys) > 1:
        raise UserError(f"the points come from {len(keys)} different val sets or tokenizers; fit one group "
                        f"at a time (lab fit --val-set ID), or fit in bits per byte across tokenizers (lab fit --bpb)")
    check_enough(points)
    # The bootstrap resamples by position: the same points give the same fit, in whatever order
    # the runs were listed (run ids are random).
    points = sorted(points, key=lambda p: (p.weights, p.tokens, p.val_loss))
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    n = np.log(np.array([p.weights for p in points], dtype=float))
    d = np.log(np.array([p.tokens for p in points], dtype=float))
    y = np.log(np.array([p.val_loss for p in points], dtype=float))
    best, value = _fit_logs(n, d, y, _grid_starts(n, d, y))
    if best is None:
        raise UserError(f"the fit found no law with exponents in (0, {MAX_EXPONENT:g}] for these points: their losses do not "
                        "fall with N and D; check the runs (lab fit --list) or add points")
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap):
        idx = rng.integers(0, len(y), len(y))
        starts = [best] + _grid_starts(n[idx], d[idx], y[idx], keep=1)[:1]
        theta, _ = _fit_logs(n[idx], d[idx], y[idx], starts)
        if theta is not None:  # a sample without a proper law (all one size, say) says nothing
            samples.append(_natural(theta))
    val_set, tokenizer = next(iter(keys))
    fit = Fit(*_natural(best), points=len(points), sizes=len({p.weights for p in points}),
              samples=[list(s) for s in samples], val_set=val_set, tokenizer=tokenizer, objective=float(value),
              metric=metric)
    if samples:
        cols = np.array(samples)
        fit.intervals = {name: [float(np.percentile(cols[:, i], 2.5)), float(np.percentile(cols[:, i], 97.5))]
                         for i, name in enumerate(PARAMS)}
    return fit


def _natural(theta) -> tuple[float, float, float, float, float]:
    e, a, b, alpha, beta = (float(v) for v in theta)
    return math.exp(e), math.exp(a), math.exp(b), alpha, beta


def _grid_starts(n, d, y, keep: int = 8) -> list:
    """Starting values: for a grid of (α, β) the law is linear in (E, A, B), so each grid point
    gets its best non-negative (E, A, B) by least squares; the `keep` best grid points start
    the Huber fit, with a few of Chinchilla's fixed starts beside them."""
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    from scipy.optimize import nnls  # scipy: only for a fit
    loss = np.exp(y)
    scored = []
    for alpha in np.linspace(0.05, 1.5, 30):
        for beta in np.linspace(0.05, 1.5, 30):
            m = np.stack([np.ones_like(n), np.exp(-alpha * n), np.exp(-beta * d)], axis=1) / loss[:, None]
            coef, resid = nnls(m, np.ones_like(loss))
            scored.append((resid, coef, alpha, beta))
    scored.sort(key=lambda t: t[0])
    floor = 1e-6 * float(loss.min())
    starts = [np.array([math.log(max(c[0], floor)), math.log(max(c[1], floor)), math.log(max(c[2], floor)), al, be])
              for _, c, al, be in scored[:keep]]
    lowest = float(np.min(y))
    starts += [np.array(s) for s in itertools.product((lowest + math.log(0.5),), (0.0, 10.0), (0.0, 10.0),
                                                      (0.5,), (0.5,))]
    return starts


def _objective(theta, n, d, y):
    """Huber loss of the log-space residuals, and its gradient."""
    import numpy as np  # numpy: only for a fit (the calculator reads a fit without it)
    e, a, b, alpha, beta = theta
    terms = np.stack([a - alpha * n, b - beta * d, np.full_like(n, e)])
    top = terms.max(axis=0)
    w = np.exp(terms - top)
    pred = top + np.log(w.sum(axis=0))
    r = pred - y
    small = np.abs(r) <= HUBER_DELTA
    loss = np.where(small, 0.5 * r * r, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA)).sum()
    dr = np.where(small, r, HUBER_DELTA * np.sign(r))
    share = w / w.sum(axis=0)  # d pred / d term
    grad = np.array([(dr * share[2]).sum(), (dr * share[0]).sum(), (dr * share[1]).sum(),
                     (dr * share[0] * -n).sum(), (dr * share[1] * -d).sum()])
    # Divided by δ, the objective is of the order of the residuals, where the optimizer's
    # tolerances mean something (the raw Huber sum is ~1e-5 and creeps along flat valleys).
    return loss / HUBER_DELTA, grad / HUBER_DELTA


def _fit_logs(n, d, y, starts) -> tuple:
    from scipy.optimize import minimize  # scipy: only for a fit
    best, best_value = None, math.inf
    for start in starts:
        # Unbounded, as Chinchilla's (scipy's bounded variant is far slower here); exponents
        # outside (0, MAX_EXPONENT] are a degenerate fit and are dropped instead.
        res = minimize(_objective, start, args=(n, d, y), jac=True, method="L-BFGS-B",
                       options={"ftol": 1e-12, "gtol": 1e-9, "maxiter": 1000})
        ok = all(math.isfinite(v) for v in res.x) and 0 < res.x[3] <= MAX_EXPONENT and 0 < res.x[4] <= MAX_EXPONENT
        if ok and res.fun < best_value:
            best, best_value = res.x, float(res.fun)
    return best, best_value


# --- fits on disk: one per val set and tokenizer ------------------------------------------

def fits_dir() -> Path:
    return lab_home() / "recipes" / "fits"


def fit_file(val_set: str | None, tokenizer: str | None, metric: str = "loss") -> Path:
    if metric == "bpb":  # one per val text; the calculator reads only the loss fits
        return fits_dir() / f"bpb-{(val_set or 'any')[:16]}.json"
    return fits_dir() / f"{(val_set or 'any')[:16]}-{(tokenizer or 'any')[:12]}.json"


def save_fit(fit: Fit) -> Path:
    path = fit_file(fit.val_set, fit.tokenizer, fit.metric)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(json.dumps(fit.to_dict(), indent=1).encode("utf-8")))
    return path


_cache: dict[str, tuple[tuple, Fit | None]] = {}


def load_fit_cached(val_set: str | None, tokenizer: str | None) -> Fit | None:
    """`load_fit`, re-read only when the file changed: the calculator asks on every keystroke."""
    path = fit_file(val_set, tokenizer)
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    hit = _cache.get(str(path))
    if hit is None or hit[0] != key:
        hit = _cache[str(path)] = (key, load_fit(val_set, tokenizer))
    return hit[1]


def load_fit(val_set: str | None, tokenizer: str | None) -> Fit | None:
    """The lab's saved fit for this val set and tokenizer, or None."""
    path = fit_file(val_set, tokenizer)
    try:
        return Fit.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
