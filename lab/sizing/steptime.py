"""How long one training step takes on a card: a sum of parts that scale differently with the
size, each part's cost per unit fitted from the lab's measurements on that card.

A small model's step is not its FLOPs over a FLOP rate: the optimizer, the embedding and the
loss, Python and the kernel launches cost a share that a big model does not pay, so scaling one
run's rate by FLOPs per token is far off for another size (issue 22: 31% low). The parts, per
optimizer step on one card, with T = batch_per_card · n · grad_accum tokens and N weights:

    matmul       6·N·T           matrix products, forward and backward
    attention    12·layers·n·d·T  attention's scores and weighted sums (grows as n²)
    activations  T·layers·d       elementwise work per token and layer (norms, GELU, residuals)
    spill        T·layers·d·B/(B+C)  the same work again where its tensors outgrow the cache
    logits       T·vocab          the output's softmax and loss per token
    weights      N                per step and weight: AdamW, clipping, casts, DDP's all-reduce
    layers       layers·grad_accum per step and layer: kernel launches, Python
    step         grad_accum       per micro-step: the loop, the batch, the loss

On a CPU the matrix products' rate also depends on the width (a product d wide runs far below the
processor's peak at d 64 and near it at d 512), and attention's on the context. Where the machine's
parts were measured (`lab.sizing.machine`), `Curves` hold those rates, and the matmul and attention
units are their FLOPs times the cost per FLOP at the size's width (context) relative to the widest
(longest) measured (`rate_factor`).

B is one layer's activation tensor of a micro-step (batch_per_card · n · d fp32 values) and C a
core's share of cache (`CACHE_BYTES`): on a CPU the elementwise passes slow down per element as B
outgrows it (on this machine's lean step, 4 layers d 128 n 128: 11,900 tokens/s at batch 16,
10,900 at 32, 9,500 at 64), which no part proportional to the tokens or fixed can say. A GPU's
prior has no spill (its elementwise work is timed at memory bandwidth already).

Each card has a prior (`lab.sizing.priors`): seconds per unit of each part, anchored to one
measurement. The fit (`fit`) keeps the prior's shape and lets the lab's measurements move each
part: it minimizes the measurements' relative misfit plus a penalty on each part's factor moving
away from a common scale (a ridge toward the prior's shape, the common scale left free), with
every factor non-negative. One measurement rescales the prior as a whole; two or more also tilt
it between the parts that scale differently, as far as they tell apart. The same least squares
gives each prediction an interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lab.config import weight_count
from lab.sizing.nnls import inverse_spd, normal_equations, nnls

PARTS = ("matmul", "attention", "activations", "spill", "logits", "weights", "layers", "step")
CACHE_BYTES = 4 * 2 ** 20  # the saturation point of the spill (a core's L2 and its share of L3: a few MiB)
NOISE = 0.05  # one run's tokens/s against another's at the same size: the spread a fit cannot beat
Z95 = 1.96
Curve = tuple[tuple[float, float], ...]  # (width or context, seconds per FLOP), ascending


@dataclass(frozen=True)
class Curves:
    """A machine's measured rates where they depend on the size: the matrix products' by width,
    attention's by context (empty: not measured, the parts' rates hold at every size)."""
    matmul: Curve = ()
    attention: Curve = ()


NO_CURVES = Curves()


def rate_factor(curve: Curve, x: float) -> float:
    """The cost per FLOP at `x` over the cost at the curve's last (widest, longest) point,
    interpolated in log-log between the measured points and held flat beyond them; 1 without one."""
    if not curve:
        return 1.0
    last = curve[-1][1]
    if x <= curve[0][0]:
        return curve[0][1] / last
    for (x0, s0), (x1, s1) in zip(curve, curve[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))) / last
    return 1.0


@dataclass(frozen=True)
class Size:
    """What the step time depends on: the model, the batch, and how many cards share it."""
    context: int
    width: int
    layers: int
    vocab: int
    batch_per_card: int
    grad_accum: int = 1
    cards: int = 1

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step, all cards together."""
        return self.batch_per_card * self.context * self.grad_accum * self.cards

    def parts(self, curves: Curves = NO_CURVES) -> tuple[float, ...]:
        """The units of each part of PARTS in one optimizer step on one card; with a machine's
        `curves`, the matmul and attention FLOPs weighted by their cost at this width and context."""
        n, d, L, g = self.context, self.width, self.layers, self.grad_accum
        tokens = self.batch_per_card * n * g
        weights = weight_count(L, d, self.vocab, n)
        tensor = 4.0 * self.batch_per_card * n * d
        elementwise = float(tokens * L * d)
        return (6.0 * weights * tokens * rate_factor(curves.matmul, d),
                12.0 * L * n * d * tokens * rate_factor(curves.attention, n), elementwise,
                elementwise * tensor / (tensor + CACHE_BYTES),
                float(tokens * self.vocab), float(weights), float(L * g), float(g))


@dataclass(frozen=True)
class Point:
    """One measurement: a size and its step time (from a run's median tokens/s)."""
    name: str
    size: Size
    step_s: float
    noise: float = NOISE  # its relative uncertainty


@dataclass(frozen=True)
class Fit:
    """Seconds per unit of each part (`unit` × the fitted factors), and the covariance of the
    factors and the common scale."""
    seconds: tuple[float, ...]
    unit: tuple[float, ...]  # the prior's seconds per unit, rescaled to the points
    cov: tuple[tuple[float, ...], ...]  # over (factor of each part..., common scale)
    points: tuple[str, ...]
    noise: float  # the relative noise of one measurement, as the fit saw it
    curves: Curves = field(default=NO_CURVES)  # the machine's rates by width and context, where measured

    def step_s(self, size: Size) -> float:
        return sum(c * x for c, x in zip(self.seconds, size.parts(self.curves)))

    def shares(self, size: Size) -> dict[str, float]:
        """Each part's share of the step (what the time goes to)."""
        secs = [c * x for c, x in zip(self.seconds, size.parts(self.curves))]
        total = sum(secs) or 1.0
        return {name: s / total for name, s in zip(PARTS, secs)}

    def spread(self, size: Size) -> float:
        """The relative standard deviation of a run's step time at `size`: the fit's own
        uncertainty there plus one run's noise."""
        total = self.step_s(size) or 1.0
        g = [u * x / total for u, x in zip(self.unit, size.parts(self.curves))] + [0.0]
        var = sum(g[i] * self.cov[i][j] * g[j] for i in range(len(g)) for j in range(len(g)))
        return math.sqrt(max(var, 0.0) + self.noise ** 2)

    def tok_s_interval(self, size: Size) -> tuple[float, float]:
        """A 95% interval of tokens/s at `size`."""
        tok_s, sd = size.tokens_per_step / self.step_s(size), self.spread(size)
        return tok_s * math.exp(-Z95 * sd), tok_s * math.exp(Z95 * sd)


def fit(prior: tuple[float, ...], shape_spread: float, points: list[Point], curves: Curves = NO_CURVES) -> Fit:
    """The parts' costs from `points`, regularized toward `prior`'s shape.

    Unknowns: a factor w_k on each part's prior cost and a common scale s. Rows: each point's
    relative misfit over its noise; each part's (w_k − s) over `shape_spread`. With one point
    every w_k equals s (the prior rescaled); the ridge keeps two or three points, which cannot
    tell seven parts apart, to the smallest change of shape that explains them."""
    if not points:
        raise ValueError("fit needs at least one measurement")
    x = [p.size.parts(curves) for p in points]
    base = [[c * u for c, u in zip(prior, row)] for row in x]
    # Rescale the prior first, so that the factors are near 1 and the ridge is relative.
    ratios = [sum(b) / p.step_s for b, p in zip(base, points)]
    scale = sum(ratios) / sum(r * r for r in ratios)
    k = len(prior)
    rows, rhs = [], []
    for b, p in zip(base, points):
        rows.append([scale * u / p.step_s / p.noise for u in b] + [0.0])
        rhs.append(1.0 / p.noise)
    for i in range(k):
        rows.append([(1.0 if j == i else 0.0) / shape_spread for j in range(k)] + [-1.0 / shape_spread])
        rhs.append(0.0)
    z = nnls(rows, rhs)
    seconds = tuple(scale * c * w for c, w in zip(prior, z[:k]))
    resid = [sum(c * u for c, u in zip(seconds, row)) / p.step_s - 1.0 for row, p in zip(x, points)]
    noise = max(min(p.noise for p in points), math.sqrt(sum(r * r for r in resid) / len(resid)))
    ata, _ = normal_equations(rows, rhs, list(range(k + 1)))
    # Residuals above the points' stated noise widen the intervals by as much.
    inflate = (noise / min(p.noise for p in points)) ** 2
    cov = tuple(tuple(v * inflate for v in row) for row in inverse_spd(ata))
    return Fit(seconds, tuple(scale * c for c in prior), cov, tuple(p.name for p in points), noise, curves)
