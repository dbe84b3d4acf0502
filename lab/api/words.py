"""Numbers as a person reads them in the lab's two languages, for the notebook and the command: the
calculator's own formats (lab.sizing.words), each held together by no-break spaces, so that a
Russian "4 000" or "27,7 млн" never breaks across two lines of a table or a header.

    number(x, lang)   1234567 -> "1,234,567" / "1 234 567"
    count(x, lang)    tokens and weights: "27.7 M" / "27,7 млн"
    hours(h, lang)    "45 min" / "10,5 ч"
    KIND_RU           the Russian names of the calculator's kinds of figure (exact, measured, ...)
"""
from __future__ import annotations

from lab.sizing import words

NBSP = "\u00a0"
KIND_RU = words.KIND_RU  # the kinds' names: the faces label figures with them


def _whole(text: str) -> str:
    return text.replace(" ", NBSP)


def number(x: float, lang: str = "en") -> str:
    return _whole(words.format_number(x, lang))


def count(x: float, lang: str = "en") -> str:
    return _whole(words.format_count(x, lang))


def hours(h: float, lang: str = "en") -> str:
    return _whole(words.format_hours(h, lang))
