"""Validation: everything wrong with a run's fields once the figures are known (the
field checks of `lab.config`, the data, the checkpoint, whether the batch fits)."""
from __future__ import annotations

from lab.config import Problem, RunConfig, check, check_against_data
from lab.sizing.cards import TOKENS_PER_WEIGHT, Card, card_where
from lab.sizing.figures import Estimate
from lab.sizing.words import format_count, format_number


def problems(run_cfg: RunConfig, est: Estimate, card: Card | None, vocab_given: int | None,
             manifest: dict | None) -> list[Problem]:
    """Where the run starts (its checkpoint, the locked fields) is `lab.settle.preview`'s to check."""
    out = check(run_cfg)  # a machine's own limits: lab.machines.registry.limits, in lab.settle.preview
    if est.vocab < 1:
        out.append(Problem("vocab", f"vocab must be at least 1 (got {est.vocab})",
                           f"словарь должен быть не меньше 1 (сейчас {est.vocab})"))
    out += _data_problems(run_cfg, est, manifest, vocab_given)
    if card is not None and card.precision == "fp16" and est.precision == "bf16":
        out.append(Problem("precision", f"{card.name} has no native bf16: it is emulated and slow; "
                                        f"use precision auto (fp16 + GradScaler)",
                           f"у {card.name} нет настоящего bf16: он эмулируется и медленный; "
                           f"выберите precision auto (fp16 + GradScaler)", severity="warning"))
    out += _fit_problems(run_cfg, est, card)
    return out


def _data_problems(cfg: RunConfig, est: Estimate, manifest: dict | None, vocab_given: int | None) -> list[Problem]:
    out: list[Problem] = []
    if manifest is None:
        names = ", ".join(cfg.constellations) or cfg.data_dir
        out.append(Problem("constellations", f"{names} is not prepared yet: the run prepares it when it starts, "
                                             f"so the tokens available are unknown until then",
                           f"{names} ещё не подготовлено: прогон подготовит данные сам при запуске, "
                           f"а до тех пор сколько в них токенов, неизвестно", severity="warning"))
        return out
    per = manifest.get("constellations")
    if isinstance(per, dict) and per and not cfg.data_dir:
        missing = [n for n in cfg.constellations if n not in per]
        if missing:
            out.append(Problem("constellations", f"not in the prepared data: {', '.join(missing)}; "
                                                 f"prepare them with `lab prepare`",
                               f"нет в подготовленных данных: {', '.join(missing)}; подготовьте их `lab prepare`"))
    shortest = manifest.get("shortest_val_tokens")
    if isinstance(shortest, int) and cfg.context >= 1:
        out += check_against_data(cfg, shortest)
    mvocab = (manifest.get("tokenizer") or {}).get("vocab")
    if vocab_given is not None and isinstance(mvocab, int) and mvocab != vocab_given:
        out.append(Problem("vocab", f"vocab {vocab_given} differs from the prepared data's tokenizer ({mvocab})",
                           f"словарь {vocab_given} не совпадает с токенизатором данных ({mvocab})",
                           severity="warning"))
    wanted, available = est.tokens_wanted.value, est.tokens_available.value
    if wanted and available and wanted > available:
        out.append(_too_big(cfg, est, wanted, available))
    return out


def _fit_problems(cfg: RunConfig, est: Estimate, card: Card | None) -> list[Problem]:
    mem, best = est.memory_per_card_gb, est.max_batch_per_card
    if card is None or best.value is None or cfg.batch_per_card <= best.value:
        return []  # the same formula decides both, so the warning and the largest batch agree
    usable = mem.extra["usable_gb"]
    where, where_ru = card_where(card)
    need, have = f"≈ {mem.value:g} GB", f"{usable:g} GB"
    need_ru, have_ru = f"≈ {format_number(mem.value, 'ru')} ГБ", f"{format_number(usable, 'ru')} ГБ"
    if best.value == 0:
        return [Problem("batch_per_card",
                        f"the model does not fit on {where} even at batch 1 ({need} at batch {cfg.batch_per_card}, "
                        f"{have} usable): lower width, layers or context",
                        f"модель не помещается даже с батчем 1 ({need_ru} при батче {cfg.batch_per_card}, "
                        f"доступно {have_ru} {where_ru}): уменьшите d, слои или контекст", severity="warning")]
    return [Problem("batch_per_card",
                    f"batch {cfg.batch_per_card} per card needs {need}, more than the {have} usable on {where}: "
                    f"out of memory is likely. Lower batch_per_card to {best.value} or less "
                    f"(raise grad_accum to keep the tokens per step)",
                    f"батч {cfg.batch_per_card} на карту требует {need_ru}, больше {have_ru}, доступных {where_ru}: "
                    f"вероятна нехватка памяти. Уменьшите батч до {best.value} или меньше "
                    f"(увеличьте grad_accum, чтобы сохранить токены на шаг)", severity="warning")]




def _too_big(cfg: RunConfig, est: Estimate, wanted: int, available: int) -> Problem:
    """A model that wants more tokens than the data hold: given them, it would read the same text
    many times over and learn it by heart (overfit). The size the data suit, unless that is below
    the embedding alone (no model of this vocabulary and width is that small)."""
    times, fits, embedding = wanted / available, available / TOKENS_PER_WEIGHT, est.vocab * cfg.width
    runs = est.epochs.value
    run_en = f"; this run reads them {format_number(runs)} time(s)" if runs is not None else ""
    run_ru = f"; этот прогон прочтёт их {format_number(runs, 'ru')} раз(а)" if runs is not None else ""
    over = format_number(round(times, 1) if times < 10 else round(times))
    over_ru = format_number(round(times, 1) if times < 10 else round(times), "ru")
    if times >= 2:
        then_en = f"Given them, it would read the data ~{over} times over and learn the text by heart: it will overfit. "
        then_ru = f"Получив их, она прочтёт данные ~{over_ru} раз и заучит текст наизусть: модель переобучится. "
    else:
        then_en = f"Given them, it would read the data {over} times: a size the data suit learns as much for less. "
        then_ru = f"Получив их, она прочтёт данные {over_ru} раза: размер по данным выучит столько же дешевле. "
    head_en = (f"the model is bigger than the data can train: {format_count(est.weights.value)} weights want "
               f"≈ {format_count(wanted)} tokens ({TOKENS_PER_WEIGHT} per weight), the data hold {format_count(available)}"
               f"{run_en}. {then_en}")
    head_ru = (f"модель больше, чем данные могут обучить: {format_count(est.weights.value, 'ru')} весов хотят "
               f"≈ {format_count(wanted, 'ru')} токенов ({TOKENS_PER_WEIGHT} на вес), а в данных "
               f"{format_count(available, 'ru')}{run_ru}. {then_ru}")
    if fits >= embedding:
        return Problem("layers", head_en + f"Pick a size up to ~{format_count(fits)} weights, or add data",
                       head_ru + f"Возьмите размер до ~{format_count(fits, 'ru')} весов или добавьте данных",
                       severity="warning")
    return Problem("layers", head_en + f"No size of this vocabulary and width suits them: the embedding alone "
                                       f"({est.vocab} × {cfg.width}) is {format_count(embedding)} weights. Add data "
                                       f"(≈ {format_count(TOKENS_PER_WEIGHT * embedding)} tokens for the embedding alone), "
                                       f"or make the width and the vocabulary smaller",
                   head_ru + f"Ни один размер с таким словарём и шириной им не подходит: одно только вложение "
                             f"({est.vocab} × {cfg.width}) — это {format_count(embedding, 'ru')} весов. Добавьте данных "
                             f"(≈ {format_count(TOKENS_PER_WEIGHT * embedding, 'ru')} токенов на одно вложение) "
                             f"или уменьшите ширину и словарь", severity="warning")
