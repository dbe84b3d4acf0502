"""Numbers in the lab's two languages, and the names of the figures' kinds."""
from __future__ import annotations

KIND_RU = {"exact": "точно", "measured": "замер", "calibrated": "по замерам лабы",
           "estimate": "оценка", "unknown": "неизвестно", "fitted": "по закону лабы"}


def format_number(x: float, lang: str = "en") -> str:
    """1234567 -> "1,234,567" (en) or "1 234 567" (ru); decimals with a comma in Russian."""
    text = f"{x:,}" if isinstance(x, int) else f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"
    return text.replace(",", " ").replace(".", ",") if lang == "ru" else text


def format_count(x: float, lang: str = "en") -> str:
    """Token and weight counts in millions or billions: "27.7 M" / "27,7 млн", "0.46 M", "1.56 B" /
    "1,56 млрд"; below a hundred thousand in thousands ("12.3 K" / "12,3 тыс."), below a thousand as
    they are ("400"): a small count never reads "0.00 M"."""
    if x < 1e3:
        return f"{x:.0f}"
    value, en, ru = (x / 1e9, "B", "млрд") if x >= 1e9 else (x / 1e6, "M", "млн") if x >= 99_950 else \
        (x / 1e3, "K", "тыс.")
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{text.replace('.', ',')} {ru}" if lang == "ru" else f"{text} {en}"


def format_seconds(s: float, lang: str = "en") -> str:
    """A stretch of time: "4.5 s" / "4,5 с" under a minute, else as `format_hours` says it."""
    if s < 59.5:
        text = f"{s:.1f}" if s < 10 else f"{s:.0f}"
        return f"{text.replace('.', ',')} с" if lang == "ru" else f"{text} s"
    return format_hours(s / 3600, lang)


def format_hours(h: float, lang: str = "en") -> str:
    """Hours as the lab says them: "12 s" / "12 с" under a minute (a tiny run never reads "0 min";
    none at all does: no quota is "0 min"), "45 min" / "45 мин" under an hour, else "10.5 h" / "10,5 ч"."""
    if 0 < h * 3600 < 59.5:
        return format_seconds(h * 3600, lang)
    if h < 1:
        return f"{h * 60:.0f} мин" if lang == "ru" else f"{h * 60:.0f} min"
    return f"{h:.1f} ч".replace(".", ",") if lang == "ru" else f"{h:.1f} h"
