"""The one place a speed comes from: a card's step-time model (`steptime`), its prior
(`priors`) fitted to every measurement the lab has on that card in that precision (`speeds`).
The form, `lab size`, Auto's quota arithmetic and the run-time figures all ask it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from lab.config import RunConfig
from lab.sizing.cards import Card, card_for, rate_known
from lab.sizing.figures import Figure
from lab.sizing.priors import Prior, prior
from lab.sizing.speeds import Measured, measured_runs, median
from lab.sizing.steptime import NOISE, Z95, Fit, Point, Size, fit


def size_of(cfg: RunConfig, vocab: int, card: Card, **change) -> Size:
    """The run's size on `card`; `change` overrides fields (the evaluation's batch, say)."""
    fields = {"context": cfg.context, "width": cfg.width, "layers": cfg.layers, "vocab": vocab,
              "batch_per_card": cfg.batch_per_card, "grad_accum": cfg.grad_accum, "cards": card.cards, **change}
    return Size(**fields)


def point_of(m: Measured) -> Point:
    size = Size(m.context, m.width, m.layers, m.vocab, m.batch_per_card, m.grad_accum, card_for(m.gpu).cards)
    return Point(m.run, size, size.tokens_per_step / m.tok_s)


@dataclass(frozen=True)
class SpeedModel:
    """A card's speed in one precision: fitted to the lab's measurements, else its prior."""
    card: Card
    precision: str
    prior: Prior
    fit: Fit
    measured: tuple[Measured, ...]  # what it was fitted to; empty: the prior's anchor alone

    def step_s(self, size: Size) -> float:
        return self.fit.step_s(size)

    def tok_s(self, size: Size) -> float:
        return size.tokens_per_step / self.fit.step_s(size)

    @property
    def names(self) -> str:
        return ", ".join(sorted({m.run for m in self.measured}))


_models: dict[tuple, SpeedModel] = {}


def speed_model(card: Card, precision: str, runs: list[Measured], compiled: bool | None = None) -> SpeedModel:
    """The model for `card` in `precision` from `runs` (those of that card and precision;
    of the compile state `compiled` where the runs say theirs, when any do)."""
    own = [r for r in runs if r.gpu == card.name and r.precision == precision]
    same = [r for r in own if r.compiled in (None, compiled)] if compiled is not None else own
    own = same or own
    pri = prior(card, precision)
    key = (card.name, precision, pri.parts, tuple((r.run, r.size_key(), r.tok_s) for r in own))
    hit = _models.get(key)
    if hit is None:  # the form asks on every keystroke: fit once per set of measurements
        points = [point_of(r) for r in own] or [pri.anchor]
        hit = _models[key] = SpeedModel(card, precision, pri, fit(pri.parts, pri.shape_spread, points), tuple(own))
    return hit


def speed_figure(model: SpeedModel, cfg: RunConfig, vocab: int) -> Figure:
    """tokens/s at the run's size, with a 95% interval and the measurements it comes from:
    the lab's runs at exactly this size ("measured"), the fit to its runs at other sizes
    ("calibrated"), or the card's prior ("estimate"; the guide's measurement at its size)."""
    card, size = model.card, size_of(cfg, vocab, model.card)
    key = (cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card, cfg.grad_accum)
    same = [r for r in model.measured if r.size_key() == key]
    shares = {k: round(v, 3) for k, v in model.fit.shares(size).items()}
    if same:
        tok_s, names = median(r.tok_s for r in same), ", ".join(sorted(r.run for r in same))
        spread = math.exp(Z95 * NOISE)
        return Figure(round(tok_s), "measured", "tokens/s", f"median of the lab's runs at this size on {card.name}: {names}",
                      f"медиана прогонов лабы этого размера на {card.name}: {names}",
                      {"interval": [round(tok_s / spread), round(tok_s * spread)], "from": sorted(r.run for r in same),
                       "parts": shares, "basis": "lab"})
    lo, hi = model.fit.tok_s_interval(size)
    extra = {"interval": [round(lo), round(hi)], "from": sorted({r.run for r in model.measured}), "parts": shares,
             "basis": "lab" if model.measured else "guide" if model.prior.measured else "guess"}
    tok_s = round(model.tok_s(size))
    if model.measured:
        n = len(model.measured)
        return Figure(tok_s, "calibrated", "tokens/s",
                      f"the step's parts fitted to the lab's {n} measurement(s) on {card.name}: {model.names}",
                      f"части шага подогнаны по замерам лабы на {card.name} ({n}): {model.names}", extra)
    pri = model.prior
    at_anchor = size == pri.anchor.size and model.precision == card.precision
    if pri.measured and at_anchor:
        return Figure(tok_s, "measured", "tokens/s", f"the guide's measurement on {card.name}",
                      f"замер из гайда на {card.name}", extra)
    other = not rate_known(card, model.precision)  # not corrected for: measure a short run instead
    return Figure(tok_s, "estimate", "tokens/s",
                  f"the step's parts (matrix work, attention, per token, per step) scaled from {pri.note}"
                  + (f", in {card.precision}: {model.precision} will be slower" if other else ""),
                  f"части шага (матрицы, внимание, на токен, на шаг) пересчитаны от {pri.note_ru}"
                  + (f", в {card.precision}: {model.precision} будет медленнее" if other else ""), extra)


def slowdown(cfg: RunConfig, vocab: int, precision: str, **change) -> float | None:
    """How many times slower (tokens/s) the run would be with `change` (layers=24, say), from
    the same model as its own speed; None for a card the calculator does not know."""
    card = card_for(cfg.gpu)
    if card is None:
        return None
    model = speed_model(card, precision, measured_runs(card.name))
    base, other = size_of(cfg, vocab, card), size_of(cfg, vocab, card, **change)
    return model.tok_s(base) / model.tok_s(other)
