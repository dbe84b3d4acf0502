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


# A CPU run at another thread count informs this one through the two counts' priors (how the
# parts spread over the threads), which are themselves measurements of another processor: it
# counts as a measurement this far off.
OTHER_THREADS_NOISE = 0.25
# A measurement taken while other work used a share of the machine's cores says that much less
# about a run with the cores to itself: its noise is at least that share.
BUSY_FROM = 0.15  # below this, the figure is for the machine to itself


def point_of(m: Measured, pri: Prior | None = None, scatter: float = 0.0) -> Point:
    """`m` as a point of the fit, with how sure it is: one run's noise against another's on that card
    (`pri.run_noise`), or more where its own steps moved more (its sync windows' spread), where other
    work shared the machine, or where runs of its size disagreed by more (`scatter`: a size whose
    speed moves with the machine's state weighs less). On a CPU, `pri` (the prior on the threads
    the prediction is for) converts a run on other threads."""
    size = Size(m.context, m.width, m.layers, m.vocab, m.batch_per_card, m.grad_accum, card_for(m.gpu).cards)
    floor = pri.run_noise if pri is not None else NOISE
    step_s, noise = size.tokens_per_step / m.tok_s, max(floor, m.spread, m.others_cpu or 0.0, scatter)
    if pri is not None and pri.threads and m.threads and m.threads != pri.threads:
        own = prior(card_for("cpu"), m.precision, m.threads)
        step_s *= _step(pri, size) / _step(own, size)
        noise = max(noise, OTHER_THREADS_NOISE)
    return Point(m.run, size, step_s, noise)


def _step(pri: Prior, size: Size) -> float:
    return sum(c * x for c, x in zip(pri.parts, size.parts(pri.curves)))


def scatters(runs: list[Measured]) -> dict[tuple, float]:
    """Per size measured more than once: how far its runs stand from their median (the largest
    relative distance), the size's own sensitivity to the machine's state."""
    by_size: dict[tuple, list[float]] = {}
    for r in runs:
        by_size.setdefault((r.size_key(), r.threads), []).append(r.tok_s)
    return {key: max(abs(v / median(vs) - 1) for v in vs) for key, vs in by_size.items() if len(vs) > 1}


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


def speed_model(card: Card, precision: str, runs: list[Measured], compiled: bool | None = None,
                threads: int | None = None) -> SpeedModel:
    """The model for `card` in `precision` from `runs` (those of that card and precision;
    of the compile state `compiled` where the runs say theirs, when any do); a CPU's on
    `threads` (default: the threads a run here takes), its runs on other counts converted."""
    own = [r for r in runs if r.gpu == card.name and r.precision == precision]
    same = [r for r in own if r.compiled in (None, compiled)] if compiled is not None else own
    own = same or own
    pri = prior(card, precision, threads)
    key = (card.name, precision, pri,
           tuple((r.run, r.size_key(), r.tok_s, r.spread, r.others_cpu, r.threads) for r in own))
    hit = _models.get(key)
    if hit is None:  # the form asks on every keystroke: fit once per set of measurements
        apart = scatters(own)
        points = [point_of(r, pri, apart.get((r.size_key(), r.threads), 0.0)) for r in own] or [pri.anchor]
        hit = _models[key] = SpeedModel(card, precision, pri, fit(pri.parts, pri.shape_spread, points, pri.curves),
                                        tuple(own))
    return hit


def speed_figure(model: SpeedModel, cfg: RunConfig, vocab: int) -> Figure:
    """tokens/s at the run's size, with a 95% interval and the measurements it comes from:
    the lab's runs at exactly this size ("measured"), the fit to its runs at other sizes
    ("calibrated"), or the card's prior ("estimate"; the guide's measurement at its size)."""
    card, size = model.card, size_of(cfg, vocab, model.card)
    key = (cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card, cfg.grad_accum)
    threads = model.prior.threads
    same = [r for r in model.measured if r.size_key() == key and r.threads in (None, threads)]
    shares = {k: round(v, 3) for k, v in model.fit.shares(size).items()}
    on = f"{card.name}" + (f" on {threads} thread(s)" if threads else "")
    on_ru = f"{card.name}" + (f", потоков: {threads}" if threads else "")
    load, load_ru, others = _load_words(model.measured)
    shape = {"shape": "measured parts" if model.prior.shape else "prior", "shape_note": model.prior.shape_note,
             "shape_note_ru": model.prior.shape_note_ru}
    if same:
        tok_s, names = median(r.tok_s for r in same), ", ".join(sorted(r.run for r in same))
        spread = math.exp(Z95 * _noise_of(same, model.prior.run_noise))
        return Figure(round(tok_s), "measured", "tokens/s", f"median of the lab's runs at this size on {on}: {names}{load}",
                      f"медиана прогонов лабы этого размера на {on_ru}: {names}{load_ru}",
                      {"interval": [round(tok_s / spread), round(tok_s * spread)], "from": sorted(r.run for r in same),
                       "parts": shares, "basis": "lab", "threads": threads, "others_cpu": others, **shape})
    lo, hi = model.fit.tok_s_interval(size)
    extra = {"interval": [round(lo), round(hi)], "from": sorted({r.run for r in model.measured}), "parts": shares,
             "basis": "lab" if model.measured else "guide" if model.prior.measured else "parts" if model.prior.shape
             else "guess", "threads": threads,
             "others_cpu": others, **shape}
    tok_s = round(model.tok_s(size))
    if model.measured:
        n = len(model.measured)
        return Figure(tok_s, "calibrated", "tokens/s",
                      f"the step's parts fitted to the lab's {n} measurement(s) on {on}: {model.names}{load}; "
                      f"its shape from {model.prior.shape_note}",
                      f"части шага подогнаны по замерам лабы на {on_ru} ({n}): {model.names}{load_ru}; "
                      f"форма: {model.prior.shape_note_ru}", extra)
    pri = model.prior
    at_anchor = size == pri.anchor.size and model.precision == card.precision
    if pri.measured and at_anchor:
        return Figure(tok_s, "measured", "tokens/s", f"the guide's measurement on {card.name}",
                      f"замер из гайда на {card.name}", extra)
    other = not rate_known(card, model.precision)  # not corrected for: measure a short run instead
    card_shape = pri.shape is not None and card.name != "cpu"  # a CPU's note says it already
    return Figure(tok_s, "estimate", "tokens/s",
                  f"the step's parts (matrix work, attention, per token, per step) scaled from {pri.note}"
                  + (f"; its shape from {pri.shape_note}" if card_shape else "")
                  + (f", in {card.precision}: {model.precision} will be slower" if other else ""),
                  f"части шага (матрицы, внимание, на токен, на шаг) пересчитаны от {pri.note_ru}"
                  + (f"; форма: {pri.shape_note_ru}" if card_shape else "")
                  + (f", в {card.precision}: {model.precision} будет медленнее" if other else ""), extra)


def _noise_of(runs: list[Measured], floor: float) -> float:
    """One more run's spread around the median of `runs` at its size: the card's run-to-run noise,
    their own spreads and loads (`point_of`), and how far they stand apart."""
    mid = median(r.tok_s for r in runs)
    apart = max(abs(r.tok_s / mid - 1) for r in runs)
    return max(floor, apart, median(max(r.spread, r.others_cpu or 0.0) for r in runs))


def _load_words(runs: tuple[Measured, ...]) -> tuple[str, str, float | None]:
    """Which load the figure predicts: a machine to itself, or the load the measurements ran under
    where other work used a good share of the cores then (CPU runs record it)."""
    loads = [r.others_cpu for r in runs if r.others_cpu is not None]
    if not loads:
        return "", "", None
    others = round(median(loads), 2)
    if others < BUSY_FROM:
        return ("; for the machine to itself (other work used under 15% of its cores then)",
                "; для машины без другой работы (та занимала меньше 15% ядер)", others)
    return (f"; at the load the measurements ran under (other work used ~{others:.0%} of the cores): "
            f"with the machine to itself it would run faster",
            f"; при той нагрузке, что была при замерах (другая работа занимала ~{others:.0%} ядер): на "
            f"свободной машине будет быстрее", others)


def slowdown(cfg: RunConfig, vocab: int, precision: str, **change) -> float | None:
    """How many times slower (tokens/s) the run would be with `change` (layers=24, say), from
    the same model as its own speed; None for a card the calculator does not know."""
    card = card_for(cfg.gpu)
    if card is None:
        return None
    model = speed_model(card, precision, measured_runs(card.name))
    base, other = size_of(cfg, vocab, card), size_of(cfg, vocab, card, **change)
    return model.tok_s(base) / model.tok_s(other)
