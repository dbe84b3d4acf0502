"""Kaggle's session limits as a run's fields meet them: a batch GPU session ends after 12 hours,
and the push asks a timeout below that with room for the start and the final save; and the checks
an account passes before Kaggle gives it a GPU at all.

    limit_problems(cfg)   what is wrong with a run's `limit_min` for a Kaggle session
    auto_note(cfg)        the same, where Auto may send the run to a Kaggle account: its links there are capped
    GPU_CHECKS_EN, _RU    what an account without a GPU does about it, in words the advice shares
"""
from __future__ import annotations

from lab.config import Problem, RunConfig

KAGGLE_SESSION_MIN = 720  # Kaggle ends a batch GPU session after 12 hours.
# The push asks a session timeout "lower than the global maximum" (kagglesdk's SaveKernel request),
# a minute below the 12 hours, and keeps at least this floor between it and the notebook's own
# limit (boot, the final save, the output copy): no run's limit_min on Kaggle may be above the rest.
KAGGLE_TIMEOUT_MAX_S = KAGGLE_SESSION_MIN * 60 - 60
KAGGLE_MARGIN_FLOOR_MIN = 10.0
KAGGLE_LIMIT_MAX_MIN = KAGGLE_TIMEOUT_MAX_S / 60 - KAGGLE_MARGIN_FLOOR_MIN
LIMIT_WARN_MIN = 690
# GPUs only for verified accounts (instructlab#355: the phone), and for accounts made after December
# 2025 an identity check too (notes from 2026: "phone verify not enough"); until then a GPU push is
# accepted and its session runs without a GPU.
GPU_CHECKS_EN = ("Kaggle offers GPUs only to verified accounts: verify the account's phone number and, for an "
                 "account made after December 2025, its identity too, at kaggle.com/settings")
GPU_CHECKS_RU = ("Kaggle даёт GPU только подтверждённым аккаунтам: подтвердите телефон аккаунта, а для аккаунта, "
                 "созданного после декабря 2025 года, ещё и личность, на kaggle.com/settings")


def limit_problems(cfg: RunConfig) -> list[Problem]:
    """The run's limit against Kaggle's 12-hour session."""
    out: list[Problem] = []
    if cfg.limit_min <= 0:
        return out
    if cfg.limit_min > KAGGLE_LIMIT_MAX_MIN:
        out.append(Problem("limit_min", f"limit_min {cfg.limit_min:g} leaves no room before Kaggle's 12-hour session "
                                        f"({KAGGLE_SESSION_MIN} min): its timeout must stay below that, with at least "
                                        f"{KAGGLE_MARGIN_FLOOR_MIN:g} min for the start and the final save; use at most "
                                        f"{KAGGLE_LIMIT_MAX_MIN:g} (the lab uses 630)",
                           f"лимит {cfg.limit_min:g} мин не оставляет запаса до 12-часовой сессии Kaggle "
                           f"({KAGGLE_SESSION_MIN} мин): её тайм-аут должен быть меньше, и ещё нужно не меньше "
                           f"{KAGGLE_MARGIN_FLOOR_MIN:g} мин на запуск и последнее сохранение; не больше "
                           f"{KAGGLE_LIMIT_MAX_MIN:g} (лаба берёт 630)"))
    elif cfg.limit_min > LIMIT_WARN_MIN:
        out.append(Problem("limit_min", f"limit_min {cfg.limit_min:g} leaves little margin before Kaggle's "
                                        f"12-hour limit; the lab uses 630",
                           f"лимит {cfg.limit_min:g} мин оставляет мало запаса до 12 часов Kaggle; лаба берёт 630",
                           severity="warning"))
    return out


def auto_note(cfg: RunConfig) -> list[Problem]:
    """A run on Auto whose limit is above a Kaggle session's: on an account its links are capped
    (lab.machines.kaggle.host.link_limit_min) and the run goes on in more of them."""
    if cfg.limit_min <= KAGGLE_LIMIT_MAX_MIN:
        return []
    return [Problem("limit_min", f"on a Kaggle account a link runs at most {KAGGLE_LIMIT_MAX_MIN:g} min (its 12-hour "
                                 "session, less the start and the final save): Auto continues the run there in links "
                                 "that long", f"на аккаунте Kaggle звено идёт не дольше {KAGGLE_LIMIT_MAX_MIN:g} мин "
                                 "(12-часовая сессия без запуска и последнего сохранения): «Авто» продолжит прогон там "
                                 "звеньями такой длины", severity="note")]
