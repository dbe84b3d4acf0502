"""Numbers in the lab's two languages, and the names of the figures' kinds."""
from __future__ import annotations

KIND_RU = {"exact": "точно", "measured": "замер", "calibrated": "по замерам лабы",
           "estimate": "оценка", "unknown": "неизвестно", "fitted": "по закону лабы"}


def format_number(x: float, lang: str = "en") -> str:
    """1234567 -> "1,234,567" (en) or "1 234 567" (ru); decimals with a comma in Russian."""
    text = f"{x:,}" if isinstance(x, int) else f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"
    return text.replace(",", " ").replace(".", ",") if lang == "ru" else text


def format_count(x: float, lang: str = "en") -> str:
    """Token and weight counts in millions or billions: "27.7 M" / "27,7 млн", "1.56 B" / "1,56 млрд"."""
    value, en, ru = (x / 1e9, "B", "млрд") if x >= 1e9 else (x / 1e6, "M", "млн")
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{text.replace('.', ',')} {ru}" if lang == "ru" else f"{text} {en}"


def format_hours(h: float, lang: str = "en") -> str:
    """Hours as the lab says them: "45 min" / "45 мин" under an hour, else "10.5 h" / "10,5 ч"."""
    if h < 1:
        return f"{h * 60:.0f} мин" if lang == "ru" else f"{h * 60:.0f} min"
    return f"{h:.1f} ч".replace(".", ",") if lang == "ru" else f"{h:.1f} h"
