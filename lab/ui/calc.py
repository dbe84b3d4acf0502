"""The sizing calculator beside the "New run" form: `lab.sizing.estimate`'s figures as HTML,
each marked with where it comes from (exact, measured, calibrated, estimate), and under them
the guide's hints with the form's own numbers."""
from __future__ import annotations

from dataclasses import replace

from lab.api import sizing
from lab.config import Problem, RunConfig
from lab.ui.text import SIZE_HELP, clock, esc, hours, kind_badge, lang, tr

RED, ORANGE = "#d32f2f", "#ef6c00"
TD = "padding:2px 8px 2px 0;vertical-align:top;white-space:nowrap"
SMALL = "color:#666;font-size:80%"


def calculator_html(est: sizing.Estimate | None, cfg: RunConfig, choice, choice_error: str | None,
                    loose: list[Problem], general: list[str], read_at: float | None = None) -> str:
    """The calculator: each figure with its kind, Auto's pick (over the machines as read at
    `read_at`), the problems, the hints."""
    if est is None:
        return ""
    rows = _size_rows(est) + _time_rows(est, choice) + [_memory_row(est, cfg)]
    if est.predicted_val_loss is not None:  # the recipe lab's fit for this data
        rows.append(_row("predicted_val_loss", tr("Predicted val loss", "Ожидаемый val loss"), est.predicted_val_loss,
                         sizing.predicted_text(est.predicted_val_loss, lang())))
    rows.append(_quota_row(est, cfg, choice))
    card = f"{est.gpu} · {est.precision}" + (tr(" (auto)", " (авто)") if est.gpu_auto else "")
    head = f"<div style='color:#666;font-size:85%'>{esc(tr('Sized for', 'Расчёт для'))} {esc(card)}</div>" + _parts_line(est)
    auto = (_unsized_auto_row() if est.errors else _auto_row(choice, choice_error, read_at)) if cfg.machine == "auto" else ""
    return (f"<div class='lab-calculator'><h4 style='margin:4px 0'>{esc(tr('Calculator', 'Калькулятор'))}</h4>{head}"
            f"<table style='border-collapse:collapse;line-height:1.3'>{''.join(rows)}{auto}</table>"
            f"{_issues(loose, general)}<div style='color:#777;font-size:80%;line-height:1.3'>{_hints(est)}</div></div>")


def _parts_line(est: sizing.Estimate) -> str:
    """This computer's parts, measured once in the background the first time the calculator sizes a
    run here (the speed's shape is the lab's prior until they are in: the next change of a field
    uses them)."""
    wanted = sizing.parts_wanted(est)
    if wanted is None or not sizing.auto_measure():
        return ""
    state = sizing.measure_in_background(*wanted)
    if state == "measuring":
        said = tr("measuring this computer's parts once (about 10 s): until then the speed's shape is the lab's prior",
                  "измеряю части этого компьютера (один раз, около 10 с): до тех пор форма скорости — априорная лабы")
    elif state == "busy":
        said = tr("this computer is busy now: its parts will be measured when it is quiet (the speed's shape is "
                  "the lab's prior meanwhile)",
                  "этот компьютер сейчас занят: его части измерятся, когда он освободится (до тех пор форма "
                  "скорости — априорная лабы)")
    elif state == "unsteady":
        said = tr("this computer's parts were measured while other work kept it busy and are not used: "
                  "`lab size --measure-parts` measures them again (the speed's shape is the lab's prior meanwhile)",
                  "части этого компьютера измерены, пока его занимала другая работа, и не используются: "
                  "`lab size --measure-parts` измерит их снова (до тех пор форма скорости — априорная лабы)")
    elif state.startswith("failed"):
        said = tr(f"this computer's parts could not be measured ({state[8:]}): the speed's shape is the lab's prior",
                  f"части этого компьютера измерить не вышло ({state[8:]}): форма скорости — априорная лабы")
    else:
        return ""
    return f"<div class='lab-calc-parts' style='{SMALL}'>{esc(said)}</div>"


def _note(f: sizing.Figure) -> str:
    return f.note_ru if lang() == "ru" else f.note


def _row(key: str, title: str, f: sizing.Figure, text: str, extra: str = "", note: str | None = None) -> str:
    """One figure: its value, its kind, its note (escaped here) and `extra` (HTML)."""
    value = "—" if f.value is None else text
    return (f"<tr class='lab-calc-row-{key}'><td style='{TD}'>{esc(title)}</td>"
            f"<td style='padding:2px 6px;vertical-align:top'><b class='lab-calc-{key}'>{esc(value)}</b> "
            f"{kind_badge(f.kind)}<div style='{SMALL}'>{esc(_note(f) if note is None else note)}{extra}</div></td></tr>")


def _fmt(x) -> str:
    return sizing.format_number(x, lang())


def _size_rows(est: sizing.Estimate) -> list[str]:
    cnt = lambda x: sizing.format_count(x, lang())  # noqa: E731
    w, per, want, have = est.weights, est.tokens_per_step, est.tokens_wanted, est.tokens_available
    short = want.value and have.value and want.value > have.value
    warn = (f"<div style='color:{ORANGE}'>⚠ {esc(tr('less data than the size wants: read over and over, it will be learned by heart (the model will overfit)', 'данных меньше, чем хочет размер: прочитанные много раз, они заучатся наизусть (модель переобучится)'))}</div>"
            if short else "")
    epochs = est.epochs.value
    if epochs is not None:  # the run's own passes over its data, as `lab size` says them
        warn = esc(tr(f"; this run reads them {_fmt(epochs)} time(s) (epochs)",
                      f"; этот прогон прочтёт их {_fmt(epochs)} раз(а) (эпох)")) + warn
    return [_row("weights", tr("Weights", "Веса"), w, _fmt(w.value) if w.value is not None else "",
                 esc(tr(f"; vocab {est.vocab}", f"; словарь {est.vocab}"))),
            _row("tokens_per_step", tr("Tokens per step", "Токенов на шаг"), per,
                 _fmt(per.value) if per.value is not None else ""),
            _row("tokens_wanted", tr("Tokens the size wants", "Токенов хочет размер"), want,
                 f"≈ {cnt(want.value)}" if want.value is not None else ""),
            _row("tokens_available", tr("Tokens in the data", "Токенов в данных"), have,
                 cnt(have.value) if have.value is not None else "", warn)]


def _interval(f: sizing.Figure, fmt) -> str:
    """"likely 9 min–14 min"; nothing where both ends read the same ("11 min–11 min" says no more
    than the figure)."""
    lo_hi = f.extra.get("interval")
    if not lo_hi or f.kind == "exact" or fmt(lo_hi[0]) == fmt(lo_hi[1]):
        return ""
    return f"{tr('likely', 'вероятно')} {fmt(lo_hi[0])}–{fmt(lo_hi[1])}"


def _time_rows(est: sizing.Estimate, choice) -> list[str]:
    """Speed (with its interval and sources) and the whole run's time, its sessions labelled."""
    s, t = est.tok_s, est.run_hours
    speed_extra = esc(f"; {_interval(s, _fmt)}") if _interval(s, _fmt) else ""
    sessions = t.extra.get("sessions") or 0
    per = tr(f"; {sessions} sessions of up to {hours(t.extra.get('session_hours'))} each (the limit)",
             f"; сессий {sessions}, каждая до {hours(t.extra.get('session_hours'))} (лимит)") if sessions > 1 else ""
    time_extra = esc(per + (f"; {_interval(t, hours)}" if _interval(t, hours) else ""))
    return [_row("tok_s", tr("Speed", "Скорость"), s, f"{_fmt(s.value)} {tr('tok/s', 'ток/с')}" if s.value else "",
                 speed_extra),
            _row("run_hours", tr("Time, whole run", "Время всего прогона"), t,
                 hours(t.value) if t.value is not None else "", time_extra)]


def _memory_row(est: sizing.Estimate, cfg: RunConfig) -> str:
    mem, best = est.memory_per_card_gb, est.max_batch_per_card
    usable = mem.extra.get("usable_gb")
    if mem.value is not None and best.value is not None and cfg.batch_per_card > best.value:
        oom = (f"<div class='lab-oom' style='color:{RED};font-weight:bold'>⚠ "
               f"{esc(tr('Will not fit — CUDA out of memory', 'Не поместится — CUDA out of memory'))}: "
               + esc(tr(f"batch {cfg.batch_per_card} > the largest {best.value}; lower the batch",
                        f"батч {cfg.batch_per_card} > наибольшего {best.value}; уменьшите батч")
                     if best.value else tr("not even batch 1 fits: make the model smaller",
                                           "не влезает даже батч 1: уменьшите модель")) + "</div>")
    elif best.value is not None:
        oom = esc(tr(f"; largest batch: {best.value}", f"; наибольший батч: {best.value}"))
    else:
        oom = ""
    text = f"{_fmt(mem.value)} {tr('GB', 'ГБ')}" + (f" {tr('of', 'из')} {_fmt(usable)}" if usable else "") \
        if mem.value is not None else ""
    return _row("memory", tr("Memory per card", "Память на карту"), mem, text, oom)


def _quota_row(est: sizing.Estimate, cfg: RunConfig, choice) -> str:
    """The Kaggle quota the whole run spends where it will run: Auto's pick when it has one."""
    q = est.quota_hours
    title = tr("Kaggle quota, whole run", "Квота Kaggle на весь прогон")
    if est.errors:  # no run to spend it on until the fields are right
        return _row("quota", title, sizing.Figure(None, "unknown"), "",
                    note=tr("fix the fields first", "сначала исправьте поля"))
    if cfg.machine == "auto" and choice is not None and choice.machine == "local":
        zero = sizing.Figure(0.0, "exact", "hours", "this computer spends no Kaggle quota",
                             "этот компьютер не тратит квоту Kaggle")
        return _row("quota", title, zero, hours(0.0))
    picked = (cfg.machine == "auto" and choice is not None and choice.machine)
    note = tr(f"on {choice.machine}: ", f"на {choice.machine}: ") + _note(q) if picked else None
    extra = esc(f"; {_interval(q, hours)}") if _interval(q, hours) else ""
    return _row("quota", title, q, hours(q.value) if q.value is not None else "", extra, note)


def _unsized_auto_row() -> str:
    """Auto with a field wrong: no run's time to cover yet, so no machine is said to cover it."""
    text = f"<i>{esc(tr('fix the fields first: Auto picks for the run they describe', 'сначала исправьте поля: «Авто» выбирает под прогон, который они описывают'))}</i>"
    return (f"<tr class='lab-calc-row-auto'><td style='{TD}'>{esc(tr('Auto picks', 'Авто выберет'))}</td>"
            f"<td style='padding:2px 6px'>{text}</td></tr>")


def _auto_row(choice, choice_error: str | None, read_at: float | None = None) -> str:
    if choice_error:
        text = f"<span style='color:{RED}'>{esc(choice_error)}</span>"
    elif choice is None:
        text = f"<i>{esc(tr('working it out…', 'считаю…'))}</i>"
    else:
        name = tr("this computer", "этот компьютер") if choice.machine == "local" else choice.machine or "—"
        text = (f"<b class='lab-auto-machine'>{esc(name)}</b><div class='lab-auto-reason' style='font-size:85%'>"
                f"{esc(choice.reason_ru if lang() == 'ru' else choice.reason_en)}</div>")
        if choice.continues:
            text += f"<div style='color:{ORANGE};font-size:85%'>⚠ {esc(tr('the quota will not cover the whole run: the lab continues on another machine', 'квоты не хватит на весь прогон: лаба продолжит на другой машине'))}</div>"
        if read_at is not None:  # the pick is as good as the machines' figures: when they were read
            text += (f"<div class='lab-auto-read' style='{SMALL}'>"
                     f"{esc(tr(f'machines as read at {clock(read_at)}', f'машины по данным на {clock(read_at)}'))}</div>")
    return (f"<tr class='lab-calc-row-auto'><td style='{TD}'>{esc(tr('Auto picks', 'Авто выберет'))}</td>"
            f"<td style='padding:2px 6px'>{text}</td></tr>")


def _issues(loose: list[Problem], general: list[str]) -> str:
    out = "".join(f"<div style='color:{RED if p.severity == 'error' else ORANGE};font-size:90%'>"
                  f"{'✖' if p.severity == 'error' else '⚠'} {esc(p.message(lang()))}</div>" for p in loose)
    return out + "".join(f"<div style='color:{RED};font-size:90%'>✖ {esc(g)}</div>" for g in general)


def _hints(est: sizing.Estimate) -> str:
    """The guide's three hints, their numbers the form's (its size, its weights, its speed)."""
    cfg = est.config
    if cfg is None or est.weights.value is None or est.tokens_wanted.value is None:
        return ""
    ru = lang() == "ru"
    num, cnt = (lambda x: sizing.format_number(x, lang())), (lambda x: sizing.format_count(x, lang()))
    deeper = cfg.layers * 3
    ratio = sizing.slowdown(replace(cfg, gpu=est.gpu), est.vocab, est.precision, layers=deeper)
    where, what = _speed_source(est, ru)
    values = {"layers": cfg.layers, "width": cfg.width, "vocab": est.vocab, "context": cfg.context,
              "weights": num(est.weights.value), "weights_short": cnt(est.weights.value),
              "wanted": cnt(est.tokens_wanted.value), "deeper": deeper, "source": where, "kind": what,
              "ratio": num(round(ratio, 1)) if ratio else "?", "of_layers": _layers_ru(cfg.layers, genitive=True),
              "deeper_layers": _layers_ru(deeper)}
    return "".join(f"<p style='margin:4px 0'>{esc(SIZE_HELP[k][1 if ru else 0].format(**values))}</p>"
                   for k in ("weights", "data", "time"))


def _layers_ru(n: int, genitive: bool = False) -> str:
    """"слой", "слоя", "слоёв" as Russian says them after the number n."""
    one, few = n % 10 == 1 and n % 100 != 11, n % 10 in (2, 3, 4) and n % 100 not in (12, 13, 14)
    if genitive:
        return "слоя" if one else "слоёв"
    return "слой" if one else "слоя" if few else "слоёв"


def _speed_source(est: sizing.Estimate, ru: bool) -> tuple[str, str]:
    """Where the form's speed comes from, and what that makes it, in the hint's words."""
    speed = est.tok_s
    runs = ", ".join(speed.extra.get("from") or [])
    basis = speed.extra.get("basis")
    if basis == "lab":
        where = f"замеров лабы ({runs})" if ru else f"the lab's measurements ({runs})"
    elif basis == "guide":
        where = f"замера {est.gpu} из гайда" if ru else f"the guide's {est.gpu} measurement"
    elif basis == "parts":
        where = "измеренных частей этого компьютера" if ru else "this computer's measured parts"
    else:
        where = "грубой прикидки лабы" if ru else "the lab's rough guess"
    what = {"measured": ("a measurement of this size", "это замер этого размера"),
            "calibrated": ("calibrated, not a measurement of this size", "это пересчёт, а не замер этого размера")}
    return where, what.get(speed.kind, ("an estimate, not a measurement", "это оценка, а не замер"))[1 if ru else 0]
