"""When to grow: the guide's advice decided from a run's val history and the data."""
from __future__ import annotations

import math
from dataclasses import dataclass

from lab.config import RunConfig
from lab.sizing.cards import TOKENS_PER_WEIGHT, next_size, weight_count
from lab.sizing.inputs import resolve_vocab, tokens_available
from lab.sizing.law import law_for
from lab.sizing.words import format_count, format_number

MIN_EVALS = 5  # fewer val points say nothing about a trend
RECENT_SHARE = 1 / 3  # "recent": the last third of the tokens seen on this val set
MIN_RECENT_EVALS = 4
NOISE_FLOOR = 0.005  # nats: a fall smaller than this over the recent tokens is no fall


@dataclass
class Verdict:
    grow: bool
    reason_en: str
    reason_ru: str
    plateau: bool | None = None
    data_suffices: bool | None = None
    fall: float | None = None  # val fall over the recent tokens (nats; positive = still falling)
    noise: float | None = None  # what counts as no fall: 2 standard errors of the fitted slope, or the floor
    recent_tokens: int | None = None
    next_size: dict | None = None
    next_weights: int | None = None
    next_tokens_wanted: int | None = None
    tokens_available: int | None = None
    next_loss: float | None = None  # the lab's law for this data at the next size (None: no law yet)
    next_loss_interval: list | None = None  # its 95% interval, where a run would land

    def reason(self, lang: str = "en") -> str:
        return self.reason_ru if lang == "ru" else self.reason_en

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _val_points(metrics: list[dict]) -> list[tuple[float, float]]:
    """(tokens, val_loss) on the latest val set: new data starts val's count again."""
    points = [(r.get("tokens", r.get("step")), r["val_loss"], r.get("val_set")) for r in metrics
              if isinstance(r.get("val_loss"), (int, float))
              and isinstance(r.get("tokens", r.get("step")), (int, float))]
    if not points:
        return []
    last_set = points[-1][2]
    return [(float(t), float(v)) for t, v, s in points if s == last_set]


def _fall_and_noise(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares slope of val over the recent tokens, as the fall over that window, and
    its noise (2 standard errors of the slope over the window, at least NOISE_FLOOR)."""
    first, last = points[0][0], points[-1][0]
    recent = [p for p in points if p[0] >= last - RECENT_SHARE * (last - first)]
    if len(recent) < MIN_RECENT_EVALS:
        recent = points[-MIN_RECENT_EVALS:]
    xs, ys = [p[0] for p in recent], [p[1] for p in recent]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    span = xs[-1] - xs[0]
    if sxx == 0 or span == 0:
        return 0.0, NOISE_FLOOR, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / max(1, len(xs) - 2) / sxx)
    return -slope * span, max(2 * se * span, NOISE_FLOOR), span


def _rose(rise: float, noise: float, window_en: str, window_ru: str, base: dict) -> Verdict:
    """Val went up by more than its noise: the model fits its training text better than the
    held-out text (it memorises), so a bigger model, which memorises faster, would do worse."""
    return Verdict(False, f"val rose: by {rise:.3f} {window_en} (noise ±{noise:.3f}), so this is no plateau: most likely the model "
                          f"now learns its training text by heart rather than what carries over to unseen text. A bigger "
                          f"model would do that sooner: add data (or keep the checkpoint where val was lowest) instead "
                          f"of growing",
                   f"val вырос: на {format_number(round(rise, 3), 'ru')} {window_ru} (шум ±{format_number(round(noise, 3), 'ru')}), "
                   f"так что это не плато: скорее всего, модель теперь заучивает свой обучающий текст, а не то, что переносится на "
                   f"новый. Модель побольше сделает это раньше: добавьте данных (или возьмите чекпоинт, где val был "
                   f"ниже всего), а не растите её",
                   plateau=False, **base)


def when_to_grow(metrics: list[dict], manifest: dict | None = None, cfg: RunConfig | None = None,
                 vocab: int | None = None) -> Verdict:
    """The guide's advice decided from numbers: grow when val has reached a plateau (its
    fall over the recent tokens is within noise) and the data suffice for the next size
    up (20 tokens per weight); while val still falls, training longer is cheaper; when it
    rose beyond its noise, the model memorises its data: add data, do not grow. Where the recipe
    lab has fitted a law to this data, the verdict ends with what it predicts for the next size,
    with its 95% interval."""
    verdict = _verdict(metrics, manifest, cfg, vocab)
    law = law_for(manifest)
    if law is None or not verdict.next_weights:
        return verdict
    tokens = min(verdict.next_tokens_wanted, verdict.tokens_available or verdict.next_tokens_wanted)
    loss, band = law.predict(verdict.next_weights, tokens), law.predict_interval(verdict.next_weights, tokens)
    verdict.next_loss, verdict.next_loss_interval = round(loss, 4), [round(v, 4) for v in band] if band else None
    where = f", {verdict.next_weights / law.largest:.1f}× the largest size it was fitted on" if law.largest else ""
    where_ru = (f", в {format_number(round(verdict.next_weights / law.largest, 1), 'ru')} раза больше крупнейшего из "
                f"подогнанных" if law.largest else "")
    band_en = f" (95%: {band[0]:.3f}–{band[1]:.3f}{where})" if band else f" (no interval{where})"
    band_ru = (f" (95%: {format_number(round(band[0], 3), 'ru')}–{format_number(round(band[1], 3), 'ru')}{where_ru})"
               if band else f" (без интервала{where_ru})")
    verdict.reason_en += (f". The lab's law for this data: the next size on {format_count(tokens)} tokens would reach "
                          f"val ≈ {loss:.3f}{band_en}")
    verdict.reason_ru += (f". Закон лабы для этих данных: следующий размер на {format_count(tokens, 'ru')} токенах "
                          f"дойдёт до val ≈ {format_number(round(loss, 3), 'ru')}{band_ru}")
    return verdict


def _verdict(metrics: list[dict], manifest: dict | None, cfg: RunConfig | None, vocab: int | None) -> Verdict:
    cfg = cfg or RunConfig()
    vocab_n, _ = resolve_vocab(vocab, manifest, None)
    nxt = next_size(cfg)
    nxt_weights = weight_count(nxt.layers, nxt.width, vocab_n, nxt.context)
    nxt_wanted = TOKENS_PER_WEIGHT * nxt_weights
    available = tokens_available(cfg, manifest)
    base = dict(next_size=nxt.model_dict(), next_weights=nxt_weights, next_tokens_wanted=nxt_wanted,
                tokens_available=available)
    points = _val_points(metrics)
    if len(points) < MIN_EVALS:
        return Verdict(False, f"only {len(points)} val evaluation(s) on this val set (need {MIN_EVALS}): train on",
                       f"оценок val на этой выборке пока {len(points)}, нужно не меньше {MIN_EVALS}: учите дальше",
                       **base)
    fall, noise, span = _fall_and_noise(points)
    base.update(fall=round(fall, 4), noise=round(noise, 4), recent_tokens=int(span))
    window_en, window_ru = f"over the last {format_count(span)} tokens", f"за последние {format_count(span, 'ru')} токенов"
    if fall > noise:
        return Verdict(False, f"val still falls: {fall:.3f} {window_en} (noise ±{noise:.3f}); "
                              f"training longer is cheaper than growing",
                       f"val ещё падает: на {format_number(round(fall, 3), 'ru')} {window_ru} "
                       f"(шум ±{format_number(round(noise, 3), 'ru')}); дешевле учить дольше, чем растить модель",
                       plateau=False, **base)
    if -fall > noise:  # val rose beyond its noise: no plateau, and no reason to grow
        return _rose(-fall, noise, window_en, window_ru, base)
    change = f"{-fall:+.3f}"
    plateau_en = f"val is on a plateau (it changed by {change} {window_en}, within noise ±{noise:.3f})"
    plateau_ru = (f"val вышел на плато (изменился на {change.replace('.', ',')} {window_ru}, "
                  f"в пределах шума ±{format_number(round(noise, 3), 'ru')})")
    nxt_en = f"the next size up ({nxt.layers} layers, {format_count(nxt_weights)} weights) wants ≈ {format_count(nxt_wanted)} tokens"
    nxt_ru = (f"следующему размеру (слоёв: {nxt.layers}, весов: {format_count(nxt_weights, 'ru')}) нужно "
              f"≈ {format_count(nxt_wanted, 'ru')} токенов")
    if available is None:
        return Verdict(False, f"{plateau_en}, but the data size is unknown: {nxt_en}; prepare the data to decide",
                       f"{plateau_ru}, но объём данных неизвестен: {nxt_ru}; подготовьте данные, чтобы решить",
                       plateau=True, **base)
    if available < nxt_wanted:
        return Verdict(False, f"{plateau_en}, but {nxt_en} and the data hold {format_count(available)}: add data before growing",
                       f"{plateau_ru}, но {nxt_ru}, а в данных {format_count(available, 'ru')}: сначала добавьте данных",
                       plateau=True, data_suffices=False, **base)
    return Verdict(True, f"{plateau_en} and the data ({format_count(available)} tokens) suffice: {nxt_en}. Grow",
                   f"{plateau_ru}, и данных ({format_count(available, 'ru')} токенов) хватает: {nxt_ru}. Пора расти",
                   plateau=True, data_suffices=True, **base)


