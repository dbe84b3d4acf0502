"""The words of the control notebook: Russian (the lab's language) and English, and the switch.

The run fields' labels and help texts live with the fields (`lab.config`, in the guide's
words); here are the form's other words. `tr(en, ru)` picks by the current language;
`language_switch()` is the one "RU | EN" toggle every panel follows.
"""
from __future__ import annotations

import html
import re
from datetime import datetime, timezone

import ipywidgets as widgets
import traitlets
from IPython import get_ipython
from IPython.display import display

from lab.api import words
from lab.fields import WORDS, field_help, field_label


class _Language(traitlets.HasTraits):
    lang = traitlets.Unicode("ru")


LANGUAGE = _Language()
_switch: widgets.ToggleButtons | None = None


def lang() -> str:
    return LANGUAGE.lang


def set_language(code: str) -> None:
    if code not in ("ru", "en"):
        raise ValueError(f"language {code!r}: use 'ru' or 'en'")
    LANGUAGE.lang = code


def tr(en: str, ru: str) -> str:
    """The text in the current language. English first, then Russian, as everywhere in the lab
    (`Problem(field, en, ru)`, the fields' labels and help in `lab.config`)."""
    return en if LANGUAGE.lang == "en" else ru


def on_language(callback) -> None:
    """Calls `callback()` whenever the language changes."""
    LANGUAGE.observe(lambda change: callback(), names="lang")


def language_switch() -> widgets.ToggleButtons:
    """The "RU | EN" toggle (one widget, shown wherever it is wanted)."""
    global _switch
    if _switch is None:
        _switch = widgets.ToggleButtons(options=[("RU", "ru"), ("EN", "en")], value=LANGUAGE.lang,
                                        style={"button_width": "44px"}, tooltips=["По-русски", "In English"])
        _switch.add_class("lab-language")
        widgets.link((_switch, "value"), (LANGUAGE, "lang"))
    return _switch


class Panel:
    """A panel of the control notebook: `show()` displays its `box`. The functions in `lab.ui`
    show a panel at once and return it; Jupyter then displays the returned value again,
    which this skips once, so a cell shows each panel one time whether it assigns it or not."""

    box: widgets.Widget
    _skip_display = False

    def show(self) -> "Panel":
        display(self.box)
        shell = get_ipython()
        if shell is not None:  # skip Jupyter's display of this cell's value only
            self._skip_display = True

            def done(*_):
                self._skip_display = False
                shell.events.unregister("post_run_cell", done)
            shell.events.register("post_run_cell", done)
        return self

    def _ipython_display_(self) -> None:
        if self._skip_display:
            self._skip_display = False
            return
        display(self.box)


def esc(text: object) -> str:
    return html.escape(str(text))


# Sections of the "New run" form: (English, Russian).
TITLE = ("New run", "Новый прогон")
SECTIONS = {
    "run": ("Run and checkpoint", "Прогон и чекпоинт"),
    "model": ("Model — only for a run from scratch", "Модель — только для прогона с нуля"),
    "training": ("Training", "Обучение"),
    "more": ("More: schedule and learning rate", "Ещё: расписание и скорость обучения"),
}

# The one field of the form that is no run field: from scratch or from a checkpoint.
# (English, Russian), label then help; the run's fields carry theirs in `lab.config`.
MODE_FIELD = (
    ("Run", "Прогон"),
    ("One training launch, on Kaggle or on your own card. It starts from scratch (random weights) or from "
     "a checkpoint of an earlier run.",
     "Один запуск обучения: на Kaggle или на своей карте. Он начинается либо с нуля — веса случайные, — "
     "либо с чекпоинта прошлого прогона."))

# Under "How to choose a size", beside the calculator: the guide's words, with the form's own
# numbers filled in by `lab.ui.calc` (the guide's example is the reference size).
SIZE_HELP = {
    "weights": (
        "≈ 12 · layers · d² + vocab · d + n · d. For {layers} layers, d {width}, vocab {vocab} and n {context} that "
        "is {weights} — exactly what the training log prints.",
        "≈ 12 · слои · d² + словарь · d + n · d. Для {layers} {of_layers}, d {width}, словаря {vocab} и n {context} "
        "это {weights} — ровно столько печатает лог обучения."),
    "data": (
        "About 20 tokens of data per weight. {weights_short} weights want ≈ {wanted} tokens; a bigger model on the "
        "same data gets fewer tokens than it wants, or reads the data over and over "
        "and overfits.",
        "Ориентир — около 20 токенов данных на один вес. {weights_short} весов хотят ≈ {wanted} токенов; модель "
        "больше этого на тех же данных получит меньше, чем хочет, или прочтёт данные много раз "
        "и переобучится."),
    "time": (
        "A bigger model makes each step slower: {deeper} layers are about {ratio}× slower than {layers}. The form "
        "recomputes the speed for a new size from {source} — {kind}.",
        "Больше модель — медленнее каждый шаг: {deeper} {deeper_layers} примерно в {ratio} раза медленнее "
        "{layers}. Скорость для нового размера форма пересчитывает от {source} — {kind}."),
    "grow": (
        "When val on the current size has reached a plateau and there is enough data for a bigger model. "
        "If val still falls, training longer is cheaper; if it rises, the model memorises its data: add data, "
        "do not grow.",
        "Когда val на текущем размере вышел на плато, а данных хватает на модель побольше. Если val ещё "
        "падает — дешевле учить дольше; если растёт — модель заучивает данные: добавьте данных, а не растите."),
}

MODES = {"scratch": ("From scratch", "С нуля"), "resume": ("From a checkpoint", "С чекпоинта")}
GPU_NAMES = {"auto": ("Auto (the machine's)", "Авто (по машине)"), "2xT4": ("2×T4 (Kaggle)", "2×T4 (Kaggle)"),
             "T4": ("T4", "T4"), "rtx3050": ("RTX 3050", "RTX 3050"), "cpu": ("CPU", "CPU")}
KIND = {kind: (kind, ru) for kind, ru in words.KIND_RU.items()}  # the calculator's words for where a figure comes from
KIND_COLOR = {"exact": "#2e7d32", "measured": "#1565c0", "calibrated": "#6a1b9a", "estimate": "#ef6c00", "fitted": "#00838f",
              "unknown": "#757575"}
STATUS = {"new": ("new", "новый"), "starting": ("starting", "запускается"), "running": ("running", "идёт"),
          "stopped": ("stopped", "остановлен"), "done": ("done", "готово"), "failed": ("failed", "упал"),
          "cancelled": ("cancelled", "отменён"), "waiting": ("waiting", "ждёт машину"),
          "not in this lab": ("not in this lab", "не из этой лабы")}


def pair(texts: tuple[str, str]) -> str:
    return tr(*texts)


def label(name: str) -> str:
    """A form field's label: the run field's own (`lab.config`), or the mode's."""
    return pair(MODE_FIELD[0]) if name == "mode" else field_label(name, lang())


def help_text(name: str, width: int | None = None, heads: int | None = None) -> str:
    """A form field's help, the guide's words: the run field's own, or the mode's. The heads'
    example is the form's own width and heads where they are given."""
    text = pair(MODE_FIELD[1]) if name == "mode" else field_help(name, lang())
    if name == "heads" and width and heads and heads > 0 and (width, heads) != (512, 8):
        text = text.replace(*_heads_example(width, heads))
    return text


def _heads_example(width: int, heads: int) -> tuple[str, str]:
    """(the guide's "512 / 8" example, the same sentence for this width and these heads)."""
    per, rest = divmod(width, heads)
    if lang() == "en":
        guide = "512 / 8 makes 64 per head, the usual size."
        if rest:
            return guide, f"{width} / {heads} leaves {rest} over: pick heads that divide {width} (64 per head is usual)."
        return guide, f"{width} / {heads} makes {per} per head (64 is the usual size)."
    guide = "512 / 8 = 64 на голову, это обычная величина."
    if rest:
        return guide, f"{width} / {heads} даёт остаток {rest}: возьмите число голов, на которое {width} делится (обычно 64 на голову)."
    return guide, f"{width} / {heads} = {per} на голову (обычная величина — 64)."


def kind_badge(kind: str) -> str:
    color = KIND_COLOR.get(kind, "#757575")
    return (f'<span class="lab-kind lab-kind-{esc(kind)}" style="color:{color};border:1px solid {color};'
            f'border-radius:3px;padding:0 3px;font-size:80%">{esc(tr(*KIND.get(kind, (kind, kind))))}</span>')


def status_word(status: str) -> str:
    return tr(*STATUS.get(status, (status, status)))


# The machines a link may name that are this computer: the person's own, and `lab sweep --inline`'s
# loop in the driving process (a machine the lists never show: said here rather than left unexplained).
THIS_COMPUTER = {"local": ("this computer", "этот компьютер"),
                 "inline": ("this computer, without the notebook", "этот компьютер, без блокнота")}


def machine_word(name: str) -> str:
    """A link's machine as the person knows it: this computer in words, any other by its name."""
    return tr(*THIS_COMPUTER[name]) if name in THIS_COMPUTER else name


def num(x: float) -> str:
    """A number as the view's language writes it: "1,500" / "1 500" (a no-break space: it never
    breaks inside), "3.5" / "3,5"."""
    return words.number(x, lang())


def count(x: float) -> str:
    """Tokens or weights as the view's language writes them: "27.7 M" / "27,7 млн"."""
    return words.count(x, lang())


def fixed(x: float, digits: int = 3) -> str:
    """A measured value with `digits` decimals in the view's language: "3.885" / "3,885"."""
    text = f"{x:.{digits}f}"
    return text.replace(".", ",") if lang() == "ru" else text


def hours(h: float | None) -> str:
    return "—" if h is None else words.hours(h, lang())


def span(seconds: float) -> str:
    """A stretch of time as a person says it: "40 s", "12 min", "3 h 20 min", "2 d 5 h"."""
    s = max(0, round(seconds))
    if s < 60:
        return tr(f"{s} s", f"{s} с")
    m = s // 60
    if m < 60:
        return tr(f"{m} min", f"{m} мин")
    h, m = divmod(m, 60)
    if h < 48:
        return tr(f"{h} h {m} min", f"{h} ч {m} мин") if m else tr(f"{h} h", f"{h} ч")
    d, h = divmod(h, 24)
    return tr(f"{d} d {h} h", f"{d} дн {h} ч") if h else tr(f"{d} d", f"{d} дн")


def until_words(iso: str | None) -> str:
    """"until 2026-05-04 09:00 UTC (in 2 d 5 h)", or "until a machine is free" when no time is known."""
    try:
        when = datetime.fromisoformat(iso).astimezone(timezone.utc) if iso else None
    except ValueError:
        when = None
    if when is None:
        return tr("until a machine is free", "пока не освободится машина")
    left = (when - datetime.now(timezone.utc)).total_seconds()
    at = when.strftime("%Y-%m-%d %H:%M UTC")
    return tr(f"until {at} (in {span(left)})", f"до {at} (через {span(left)})") if left > 0 else \
        tr(f"until {at} (due now: it looks again)", f"до {at} (срок настал: лаба смотрит снова)")


def clock(ts: float | None) -> str:
    """A moment as this computer's clock shows it: "14:03:10" ("—" when it never was)."""
    return "—" if ts is None else datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def ago(seconds: float) -> str:
    """"just now", "40 s ago", "12 min ago"."""
    return tr("just now", "только что") if seconds < 5 else tr(f"{span(seconds)} ago", f"{span(seconds)} назад")


def said(en: str | None, ru: str | None) -> str:
    """A message of the lab in the view's language. One the lab has only in English is shown
    so in Russian too, and says so, rather than pass for a translation."""
    if lang() == "en":
        return en or ru or ""
    if ru:
        return ru
    return f"{en} (сообщение есть только по-английски)" if en else ""


# Why a session stopped, as the training loop says it (lab.kernel.train, lab.kernel.checkpoint).
STOP_REASONS = {"steps_until reached": "дошёл до «Шагов до»", "time limit": "лимит времени",
                "another rank stopped": "остановился другой процесс", "SIGTERM received": "пришёл SIGTERM",
                "SIGINT received": "пришёл SIGINT", "stop requested": "попросили остановиться",
                "cancelled on Kaggle": "отменён на Kaggle"}


def stop_reason(text: str | None, ru: str | None = None) -> str:
    """A link's end reason in the view's language."""
    if not text:
        return ""
    return said(text, ru or STOP_REASONS.get(text))


def error_text(e: BaseException) -> str:
    """An error in the view's language: its Russian where the raiser gave one (`UserError.ru`); the
    problems of a run's fields (`ConfigError`) with the fields named by the form's labels."""
    problems = getattr(e, "problems", None)
    if problems:
        return "; ".join(problem_text(p) for p in problems)
    return said(str(e), getattr(e, "ru", None))


def problem_text(problem) -> str:
    """A field's problem (`lab.config.Problem`) in the view's language, fields named by their labels."""
    return with_labels(problem.message(lang()))


# A run field's code name in a message (`steps_until`, `context`), as the lab's checks write it.
_FIELD_CODE = re.compile(r"(?<![\w«“\-])(" + "|".join(sorted(WORDS, key=len, reverse=True)) + r")(?![\w»”\-=])")


def with_labels(text: str) -> str:
    """The message with each run field's code name said as the form labels it: «Шагов до» for
    `steps_until`. In English a code that is also a word ("context 2048 is longer") stays a word
    where it does not start the message."""
    def label_of(m: re.Match) -> str:
        name = m[1]
        if lang() == "en" and "_" not in name and m.start() > 0:
            return name
        return f"«{field_label(name, 'ru')}»" if lang() == "ru" else f"“{field_label(name, 'en')}”"
    return _FIELD_CODE.sub(label_of, text)


def plot_words() -> dict[str, str]:
    """The loss plot's title, axes and legend in the view's language (`lab.kernel.plots`)."""
    return {"train": tr("train", "обучение"), "val": tr("val (set {set})", "val (выборка {set})"),
            "step": tr("step", "шаг"), "tokens": tr("tokens", "токены"),
            "loss": tr("loss (nats per token)", "loss (нат на токен)"), "title": tr("loss", "loss")}
