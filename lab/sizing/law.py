"""The lab's law L(N, D) = E + A/N^α + B/D^β as the calculator reads it: the recipe lab fits it
(lab.recipes.fit) and keeps one per val set and tokenizer; here it predicts, with how sure it is.

A prediction's 95% interval is where a run of that size would land: the law's own uncertainty
there (the parameters' covariance carried to the prediction through its gradient, in log space
where the fit is made) and one run's noise about the law, scaled by Student's t on the points'
degrees of freedom. It widens as the prediction leaves the data: a size 20 times the largest
fitted rests on the exponent alone. Stdlib only: the form predicts on every keystroke.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.home import lab_home

PARAMS = ("E", "A", "B", "alpha", "beta")


def law(weights: float, tokens: float, E: float, A: float, B: float, alpha: float, beta: float) -> float:
    return E + A / weights ** alpha + B / tokens ** beta


@dataclass
class Fit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    points: int
    sizes: int
    intervals: dict = field(default_factory=dict)  # name -> [low, high], 95 %
    val_set: str | None = None
    tokenizer: str | None = None
    objective: float = 0.0
    metric: str = "loss"  # or "bpb": L in bits per byte, D in bytes of text
    # Over (E, log A, log B, α, β): the parameters' covariance, empty where the fit could not tell
    # them apart (then no interval is claimed).
    cov: list = field(default_factory=list)
    noise: float = 0.0  # one point's relative noise about the law (its log residuals' deviation)
    t95: float = 1.96  # Student's t at 97.5% on the points' degrees of freedom
    largest: float = 0.0  # the largest size fitted (weights)

    def predict(self, weights: float, tokens: float) -> float:
        return law(weights, tokens, self.E, self.A, self.B, self.alpha, self.beta)

    def predict_interval(self, weights: float, tokens: float) -> tuple[float, float] | None:
        """The 95% interval of a run's loss at (weights, tokens); None without a covariance."""
        if len(self.cov) != len(PARAMS):
            return None
        value = self.predict(weights, tokens)
        n_term, d_term = self.A / weights ** self.alpha, self.B / tokens ** self.beta
        grad = [1 / value, n_term / value, d_term / value, -n_term * math.log(weights) / value,
                -d_term * math.log(tokens) / value]  # of log L over (E, log A, log B, α, β)
        var = sum(grad[i] * self.cov[i][j] * grad[j] for i in range(5) for j in range(5))
        half = self.t95 * math.sqrt(max(var, 0.0) + self.noise ** 2)
        return value * math.exp(-half), value * math.exp(half)

    def optimal_weights_for_tokens(self, tokens: float) -> float:
        """The size for which `tokens` is the compute-optimal amount: where the two terms'
        marginal gains balance, α·A/N^α = β·B/D^β."""
        return (self.alpha * self.A * tokens ** self.beta / (self.beta * self.B)) ** (1 / self.alpha)

    def optimal_split(self, flops: float) -> tuple[float, float]:
        """(N, D) that minimize the loss at compute C = 6·N·D."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))
        n = g * (flops / 6) ** (self.beta / (self.alpha + self.beta))
        return n, flops / (6 * n)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Fit":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


# --- fits on disk: one per val set and tokenizer ------------------------------------------

def fits_dir() -> Path:
    return lab_home() / "recipes" / "fits"


def fit_file(val_set: str | None, tokenizer: str | None, metric: str = "loss") -> Path:
    if metric == "bpb":  # one per val text; the calculator reads only the loss fits
        return fits_dir() / f"bpb-{(val_set or 'any')[:16]}.json"
    return fits_dir() / f"{(val_set or 'any')[:16]}-{(tokenizer or 'any')[:12]}.json"


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


def law_for(manifest: dict | None) -> Fit | None:
    """The lab's fit for the prepared data of `manifest` (its val set and tokenizer), or None."""
    if not manifest:
        return None
    return load_fit_cached(manifest.get("val_set"), (manifest.get("tokenizer") or {}).get("sha256"))
