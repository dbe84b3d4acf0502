"""The words of the control notebook: Russian (the lab's language) and English, and the switch.

The run fields' labels and help texts live with the fields (`lab.config`, in the guide's
words); here are the form's other words. `tr(en, ru)` picks by the current language;
`language_switch()` is the one "RU | EN" toggle every panel follows.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import traitlets

from lab.config import field_help, field_label
from lab.sizing.words import KIND_RU, format_hours


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
        from IPython import get_ipython
        from IPython.display import display
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
        from IPython.display import display
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
        "same data will be undertrained.",
        "Ориентир — около 20 токенов данных на один вес. {weights_short} весов хотят ≈ {wanted} токенов; модель "
        "больше этого на тех же данных недообучится."),
    "time": (
        "A bigger model makes each step slower: {deeper} layers are about {ratio}× slower than {layers}. The form "
        "recomputes the speed for a new size from {source} — {kind}.",
        "Больше модель — медленнее каждый шаг: {deeper} {deeper_layers} примерно в {ratio} раза медленнее "
        "{layers}. Скорость для нового размера форма пересчитывает от {source} — {kind}."),
    "grow": (
        "When val on the current size has reached a plateau and there is enough data for a bigger model. "
        "If val still falls, training longer is cheaper.",
        "Когда val на текущем размере вышел на плато, а данных хватает на модель побольше. Если val ещё "
        "падает — дешевле учить дольше."),
}

MODES = {"scratch": ("From scratch", "С нуля"), "resume": ("From a checkpoint", "С чекпоинта")}
GPU_NAMES = {"auto": ("Auto (the machine's)", "Авто (по машине)"), "2xT4": ("2×T4 (Kaggle)", "2×T4 (Kaggle)"),
             "T4": ("T4", "T4"), "rtx3050": ("RTX 3050", "RTX 3050"), "cpu": ("CPU", "CPU")}
KIND = {kind: (kind, ru) for kind, ru in KIND_RU.items()}  # the calculator's words for where a figure comes from
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


def help_text(name: str) -> str:
    """A form field's help, the guide's words: the run field's own, or the mode's."""
    return pair(MODE_FIELD[1]) if name == "mode" else field_help(name, lang())


def kind_badge(kind: str) -> str:
    color = KIND_COLOR.get(kind, "#757575")
    return (f'<span class="lab-kind lab-kind-{esc(kind)}" style="color:{color};border:1px solid {color};'
            f'border-radius:3px;padding:0 3px;font-size:80%">{esc(tr(*KIND.get(kind, (kind, kind))))}</span>')


def status_word(status: str) -> str:
    return tr(*STATUS.get(status, (status, status)))


def hours(h: float | None) -> str:
    return "—" if h is None else format_hours(h, lang())


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
    """An error in the view's language: its Russian where the raiser gave one (`UserError.ru`)."""
    return said(str(e), getattr(e, "ru", None))


def plot_words() -> dict[str, str]:
    """The loss plot's title, axes and legend in the view's language (`lab.kernel.plots`)."""
    return {"train": tr("train", "обучение"), "val": tr("val (set {set})", "val (выборка {set})"),
            "step": tr("step", "шаг"), "tokens": tr("tokens", "токены"),
            "loss": tr("loss (nats per token)", "loss (нат на токен)"), "title": tr("loss", "loss")}
