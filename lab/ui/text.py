"""The words of the control notebook: Russian (the lab's language) and English, and the switch.

Field labels and help texts are the guide's (`shared/seeds/run-form-guide.ru.txt`), in its
order; the English ones follow the guide's English summary. `tr(ru, en)` picks by the
current language; `language_switch()` is the one "RU | EN" toggle every panel follows.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import traitlets


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


def tr(ru: str, en: str) -> str:
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


# Sections and fields of the "New run" form: (Russian, English).
TITLE = ("Новый прогон", "New run")
SECTIONS = {
    "run": ("Прогон и чекпоинт", "Run and checkpoint"),
    "model": ("Модель — только для прогона с нуля", "Model — only for a run from scratch"),
    "training": ("Обучение", "Training"),
    "more": ("Ещё: расписание и скорость обучения", "More: schedule and learning rate"),
}

# name -> (label ru, label en, help ru, help en). Help texts are the guide's.
FIELDS = {
    "mode": (
        "Прогон", "Run",
        "Один запуск обучения: на Kaggle или на своей карте. Он начинается либо с нуля — веса случайные, — "
        "либо с чекпоинта прошлого прогона.",
        "One training launch, on Kaggle or on your own card. It starts from scratch (random weights) or from "
        "a checkpoint of an earlier run."),
    "resume_from": (
        "Продолжить с чекпоинта", "Continue from checkpoint",
        "Обучение подхватывает веса и номер шага прошлого прогона. Архитектура при этом та же, что у "
        "чекпоинта: другой формы веса просто не лягут, поэтому поля модели закрыты.",
        "Training picks up the weights and the step number of the earlier run. The architecture is the "
        "checkpoint's: weights of another shape will not fit, so the model fields are locked."),
    "constellations": (
        "Созвездия в обучении", "Constellations in training",
        "Из каких групп датасетов берётся текст. Новые данные — новая отложенная выборка, поэтому val "
        "начинает счёт заново.",
        "Which groups of datasets the text comes from. New data means a new held-out set, so val starts "
        "counting again."),
    "context": (
        "Контекст n", "Context n",
        "Сколько токенов модель видит за раз. Длиннее — держит более длинную мысль, но внимание дорожает: "
        "память и время растут вместе с n.",
        "Tokens the model sees at once. Longer holds a longer thought, but attention gets dearer: memory "
        "and time grow with n."),
    "width": (
        "Ширина d", "Width d",
        "Длина вектора, которым модель описывает каждый токен. Веса растут как d²: удвоить d — примерно "
        "вчетверо больше весов.",
        "The length of the vector that describes each token. Weights grow as d²: doubling d gives about "
        "4× the weights."),
    "heads": (
        "Головы", "Heads",
        "На сколько параллельных «взглядов» делится внимание. d делится на головы без остатка: 512 / 8 = 64 "
        "на голову, это обычная величина.",
        "How many parallel \"views\" attention is split into. d must divide by heads: 512 / 8 = 64 per "
        "head, the usual size."),
    "layers": (
        "Слои", "Layers",
        "Глубина: сколько раз подряд модель перерабатывает текст. Веса и время растут почти линейно: "
        "12 слоёв — примерно в полтора раза больше и медленнее, чем 8.",
        "Depth: how many times in a row the model reworks the text. Weights and time grow almost linearly: "
        "12 layers are about 1.5× bigger and slower than 8."),
    "gpu": (
        "Видеокарта", "GPU",
        "2×T4 на Kaggle вдвое быстрее одной T4: около 102 тыс. токенов в секунду против 49 тыс. Своя RTX 3050 "
        "медленнее одной T4 и греется.",
        "2×T4 on Kaggle is twice as fast as one T4: about 102 thousand tokens/s against 49 thousand. An own "
        "RTX 3050 is slower than one T4 and runs hot."),
    "machine": (
        "Машина", "Machine",
        "Аккаунт Kaggle со своей квотой. «Авто» выбирает свободную машину: сперва ту, где квоты хватит на весь "
        "прогон, потом ту, где уже есть чекпоинт и данные. Если квота кончилась раньше, лаба продолжит "
        "обучение на другой свободной машине.",
        "A Kaggle account with its own quota. \"Auto\" picks a free machine: first one whose quota covers the "
        "whole run, then one that already has the checkpoint and the data. If the quota runs out early, the "
        "lab continues training on another free machine."),
    "batch_per_card": (
        "Батч на карту", "Batch per card",
        "Сколько кусков по n токенов карта обрабатывает за шаг. Шаг на 2×T4 с батчем 6 — это 6 × 2 × 1024 = "
        "12 288 токенов. Больше батч — ровнее обучение, но больше памяти. Упало с «CUDA out of memory» — "
        "уменьшите батч.",
        "Chunks of n tokens a card processes per step. A step on 2×T4 with batch 6 is 6 × 2 × 1024 = 12,288 "
        "tokens. Bigger batch: smoother training, more memory. Failed with \"CUDA out of memory\": lower "
        "the batch."),
    "steps_until": (
        "Шагов до", "Steps until",
        "Номер шага, на котором обучение закончится. Он же задаёт расписание скорости обучения: к этому шагу "
        "она плавно падает. Добавили данных — увеличьте.",
        "The step at which training ends. It also sets the learning-rate schedule: the rate decays smoothly "
        "towards this step. Added data: raise it."),
    "limit_min": (
        "Лимит, мин", "Limit, min",
        "Сколько минут отвести. По лимиту обучение само остановится и сохранит чекпоинт, даже если до «Шагов "
        "до» не дошло. 630 минут оставляют запас до лимита сессии Kaggle.",
        "Minutes allotted. At the limit training stops by itself and saves a checkpoint, even if \"Steps "
        "until\" was not reached. 630 minutes leave a margin before Kaggle's session limit."),
    "schedule": (
        "Расписание", "Schedule",
        "Как скорость обучения меняется по шагам: wsd (разогрев, ровно, спад), cosine, linear, inv_sqrt "
        "(1/√t). К концу нужна малая скорость, чтобы сойтись точно.",
        "How the learning rate changes with the step: wsd (warmup, stable, decay), cosine, linear, inv_sqrt "
        "(1/√t). A small rate at the end is what converges precisely."),
    "lr": (
        "Скорость обучения", "Learning rate",
        "Пиковая скорость обучения. Больше — быстрее подгоняет каждый батч, но выше порога loss взрывается.",
        "The peak learning rate. Higher fits each batch faster, but above a threshold the loss explodes."),
    "warmup_steps": (
        "Шагов разогрева", "Warmup steps",
        "Шаги, за которые скорость растёт от нуля до пика (не больше десятой части «Шагов до»).",
        "Steps over which the rate rises from zero to its peak (at most a tenth of \"Steps until\")."),
    "eval_every": (
        "Оценка val каждые", "Val every",
        "Шагов между оценками на отложенной выборке (и примерами текста).",
        "Steps between evaluations on the held-out set (and text samples)."),
}

# Under "How to choose a size", beside the calculator.
SIZE_HELP = {
    "weights": (
        "≈ 12 · слои · d² + словарь · d + n · d. Для 8 слоёв, d 512, словаря 4000 и n 1024 это 27 738 112 — "
        "ровно столько печатает лог обучения.",
        "≈ 12 · layers · d² + vocab · d + n · d. For 8 layers, d 512, vocab 4000 and n 1024 that is "
        "27,738,112 — exactly what the training log prints."),
    "data": (
        "Ориентир — около 20 токенов данных на один вес. 27,7 млн весов хотят ≈ 550 млн токенов; модель "
        "больше этого на тех же данных недообучится.",
        "About 20 tokens of data per weight. 27.7 M weights want ≈ 550 M tokens; a bigger model on the same "
        "data will be undertrained."),
    "time": (
        "Больше модель — медленнее каждый шаг: 24 слоя примерно втрое медленнее 8. Скорость для нового размера "
        "форма пересчитывает от замера 2×T4 — это оценка, а не замер.",
        "A bigger model makes each step slower: 24 layers are about 3× slower than 8. The form recomputes "
        "the speed for a new size from the 2×T4 measurement — an estimate, not a measurement."),
    "grow": (
        "Когда val на текущем размере вышел на плато, а данных хватает на модель побольше. Если val ещё "
        "падает — дешевле учить дольше.",
        "When val on the current size has reached a plateau and there is enough data for a bigger model. "
        "If val still falls, training longer is cheaper."),
}

MODES = {"scratch": ("С нуля", "From scratch"), "resume": ("С чекпоинта", "From a checkpoint")}
GPU_NAMES = {"auto": ("Авто (по машине)", "Auto (the machine's)"), "2xT4": ("2×T4 (Kaggle)", "2×T4 (Kaggle)"),
             "T4": ("T4", "T4"), "rtx3050": ("RTX 3050", "RTX 3050"), "cpu": ("CPU", "CPU")}
KIND = {"exact": ("точно", "exact"), "measured": ("замер", "measured"),
        "calibrated": ("по замерам лабы", "calibrated"), "estimate": ("оценка", "estimate"),
        "unknown": ("неизвестно", "unknown"), "fitted": ("по закону лабы", "fitted")}
KIND_COLOR = {"exact": "#2e7d32", "measured": "#1565c0", "calibrated": "#6a1b9a", "estimate": "#ef6c00",
              "unknown": "#757575"}
STATUS = {"new": ("новый", "new"), "starting": ("запускается", "starting"), "running": ("идёт", "running"),
          "stopped": ("остановлен", "stopped"), "done": ("готово", "done"), "failed": ("упал", "failed"),
          "cancelled": ("отменён", "cancelled"), "waiting": ("ждёт машину", "waiting")}


def pair(texts: tuple[str, str]) -> str:
    return tr(*texts)


def label(name: str) -> str:
    ru, en, _, _ = FIELDS[name]
    return tr(ru, en)


def help_text(name: str) -> str:
    _, _, ru, en = FIELDS[name]
    return tr(ru, en)


def kind_badge(kind: str) -> str:
    color = KIND_COLOR.get(kind, "#757575")
    return (f'<span class="lab-kind lab-kind-{esc(kind)}" style="color:{color};border:1px solid {color};'
            f'border-radius:3px;padding:0 3px;font-size:80%">{esc(tr(*KIND.get(kind, (kind, kind))))}</span>')


def status_word(status: str) -> str:
    return tr(*STATUS.get(status, (status, status)))


def hours(h: float | None) -> str:
    if h is None:
        return "—"
    if h < 1:
        return tr(f"{h * 60:.0f} мин", f"{h * 60:.0f} min")
    return tr(f"{h:.1f} ч".replace(".", ","), f"{h:.1f} h")
