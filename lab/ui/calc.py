"""The sizing calculator beside the "New run" form: `lab.sizing.estimate`'s figures as HTML,
each marked with where it comes from (exact, measured, calibrated, estimate)."""
from __future__ import annotations

from lab import sizing
from lab.config import Problem, RunConfig
from lab.ui.text import SIZE_HELP, esc, hours, kind_badge, lang, pair, tr

RED, ORANGE = "#d32f2f", "#ef6c00"


def calculator_html(est: sizing.Estimate | None, cfg: RunConfig, choice, choice_error: str | None,
                    loose: list[Problem], general: list[str]) -> str:
    """The calculator: each figure with its kind (exact, measured, calibrated, estimate)."""
    if est is None:
        return ""
    lang_ = lang()
    fmt, cnt = (lambda x: sizing.format_number(x, lang_)), (lambda x: sizing.format_count(x, lang_))

    def note(f: sizing.Figure) -> str:
        return f.note_ru if lang_ == "ru" else f.note

    rows = []

    def row(key: str, title: str, f: sizing.Figure, text: str, extra: str = "") -> None:
        value = "—" if f.value is None else text
        rows.append(f"<tr class='lab-calc-row-{key}'><td style='padding:2px 8px 2px 0;vertical-align:top;white-space:nowrap'>{esc(title)}</td>"
                    f"<td style='padding:2px 6px;vertical-align:top'><b class='lab-calc-{key}'>{esc(value)}</b> "
                    f"{kind_badge(f.kind)}<div style='color:#666;font-size:80%'>{esc(note(f))}{extra}</div></td></tr>")

    w = est.weights
    row("weights", tr("Weights", "Веса"), w, fmt(w.value) if w.value is not None else "",
        esc(tr(f"; vocab {est.vocab}", f"; словарь {est.vocab}")))
    row("tokens_per_step", tr("Tokens per step", "Токенов на шаг"), est.tokens_per_step,
        fmt(est.tokens_per_step.value) if est.tokens_per_step.value is not None else "")
    want, have = est.tokens_wanted, est.tokens_available
    row("tokens_wanted", tr("Tokens the size wants", "Токенов хочет размер"), want,
        f"≈ {cnt(want.value)}" if want.value is not None else "")
    short = want.value and have.value and want.value > have.value
    row("tokens_available", tr("Tokens in the data", "Токенов в данных"), have,
        cnt(have.value) if have.value is not None else "",
        f"<div style='color:{ORANGE}'>⚠ {esc(tr('less data than the size wants: the model will be undertrained', 'данных меньше, чем хочет размер: модель недообучится'))}</div>" if short else "")
    row("tok_s", tr("Speed", "Скорость"), est.tok_s,
        f"{fmt(est.tok_s.value)} {tr('tok/s', 'ток/с')}" if est.tok_s.value else "")
    rh = est.run_hours
    capped = ""
    if rh.value is not None and rh.extra.get("capped_by_limit"):
        capped = esc(tr(f"; to steps until: {hours(rh.extra['to_steps_until'])}, sessions: {rh.extra['sessions']}",
                        f"; до «Шагов до» — {hours(rh.extra['to_steps_until'])}, сессий: {rh.extra['sessions']}"))
    row("run_hours", tr("Time", "Время"), rh, hours(rh.value) if rh.value is not None else "", capped)
    mem, best = est.memory_per_card_gb, est.max_batch_per_card
    usable = mem.extra.get("usable_gb")
    oom = ""
    if mem.value is not None and best.value is not None and cfg.batch_per_card > best.value:
        oom = (f"<div class='lab-oom' style='color:{RED};font-weight:bold'>⚠ "
               f"{esc(tr('Will not fit — CUDA out of memory', 'Не поместится — CUDA out of memory'))}: "
               + esc(tr(f"batch {cfg.batch_per_card} > the largest {best.value}; lower the batch",
                        f"батч {cfg.batch_per_card} > наибольшего {best.value}; уменьшите батч")
                     if best.value else tr("not even batch 1 fits: make the model smaller",
                                           "не влезает даже батч 1: уменьшите модель")) + "</div>")
    elif best.value is not None:
        oom = esc(tr(f"; largest batch: {best.value}", f"; наибольший батч: {best.value}"))
    mem_text = f"{fmt(mem.value)} {tr('GB', 'ГБ')}" + (f" {tr('of', 'из')} {fmt(usable)}" if usable else "") \
        if mem.value is not None else ""
    row("memory", tr("Memory per card", "Память на карту"), mem, mem_text, oom)
    if est.predicted_val_loss is not None:  # the recipe lab's fit for this data
        from lab.recipes.predict import predicted_text
        row("predicted_val_loss", tr("Predicted val loss", "Ожидаемый val loss"), est.predicted_val_loss,
            predicted_text(est.predicted_val_loss, lang_))
    q = est.quota_hours
    row("quota", tr("Kaggle quota", "Квота Kaggle"), q, hours(q.value) if q.value is not None else "")
    card = f"{est.gpu} · {est.precision}" + (tr(" (auto)", " (авто)") if est.gpu_auto else "")
    head = (f"<div style='color:#666;font-size:85%'>{esc(tr('Sized for', 'Расчёт для'))} {esc(card)}</div>")
    auto = ""
    if cfg.machine == "auto":
        if choice_error:
            text = f"<span style='color:{RED}'>{esc(choice_error)}</span>"
        elif choice is None:
            text = f"<i>{esc(tr('working it out…', 'считаю…'))}</i>"
        else:
            name = tr("this computer", "этот компьютер") if choice.machine == "local" else choice.machine or "—"
            text = (f"<b class='lab-auto-machine'>{esc(name)}</b><div class='lab-auto-reason' style='font-size:85%'>"
                    f"{esc(choice.reason_ru if lang_ == 'ru' else choice.reason_en)}</div>")
            if choice.continues:
                text += f"<div style='color:{ORANGE};font-size:85%'>⚠ {esc(tr('the quota will not cover the whole run: the lab continues on another machine', 'квоты не хватит на весь прогон: лаба продолжит на другой машине'))}</div>"
        auto = (f"<tr class='lab-calc-row-auto'><td style='padding:2px 8px 2px 0;vertical-align:top;white-space:nowrap'>"
                f"{esc(tr('Auto picks', 'Авто выберет'))}</td><td style='padding:2px 6px'>{text}</td></tr>")
    issues = "".join(f"<div style='color:{RED if p.severity == 'error' else ORANGE};font-size:90%'>"
                     f"{'✖' if p.severity == 'error' else '⚠'} {esc(p.message(lang_))}</div>" for p in loose)
    issues += "".join(f"<div style='color:{RED};font-size:90%'>✖ {esc(g)}</div>" for g in general)
    guide = "".join(f"<p style='margin:4px 0'>{esc(pair(SIZE_HELP[k]))}</p>" for k in ("weights", "data", "time"))
    return (f"<div class='lab-calculator'><h4 style='margin:4px 0'>{esc(tr('Calculator', 'Калькулятор'))}</h4>{head}"
            f"<table style='border-collapse:collapse;line-height:1.3'>{''.join(rows)}{auto}</table>{issues}"
            f"<div style='color:#777;font-size:80%;line-height:1.3'>{guide}</div></div>")


