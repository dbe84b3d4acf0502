"""A run's curve while a session elsewhere still runs: the rows its log showed, after the
run's own `metrics.jsonl`, until the session's outputs come back and replace them.

Machine-neutral: a link whose machine follows its session's log keeps `live.json` and
`live-metrics.jsonl` in its folder (lab.kaggle.logs); other links have none.
"""
from __future__ import annotations

from lab.kaggle.logs import read_live
from lab.kernel.metrics import read_metrics
from lab.machines.control import active_link
from lab.runs import Run

AT_END_EN = "Kaggle does not show this session's log until it ends ({why}): the curve comes with its outputs."
AT_END_RU = ("Kaggle не показывает журнал этой сессии, пока она не кончится ({why}): кривая придёт вместе с её "
             "результатами.")


def at_end_note(grace_s: float, ru: bool = False) -> str:
    """The monitor's note for a log Kaggle keeps until the end; `grace_s` 0: the probe found so."""
    if ru:
        why = f"ничего за {grace_s / 60:.0f} мин работы" if grace_s else "так нашла проба аккаунта"
        return AT_END_RU.format(why=why)
    why = f"nothing in {grace_s / 60:.0f} min of running" if grace_s else "the account's probe found so"
    return AT_END_EN.format(why=why)


def live_curve(run: Run) -> dict | None:
    """{"link", "mode", "rows", "note_en", "note_ru"} of the run's running link, or None when no
    link runs or its machine keeps no live log. `rows`: those past the link's first step."""
    link = active_link(run)
    folder = (link.detail or {}).get("folder") if link is not None else None
    if not folder:
        return None
    state, rows = read_live(run.folder / folder)
    if state is None:
        return None
    rows = [r for r in rows if r["step"] > link.from_step]
    mode = state.get("mode", "waiting")
    grace = float(state.get("grace_s") or 0)
    return {"link": link.n, "mode": mode, "rows": rows, "last_step": rows[-1]["step"] if rows else None,
            "note_en": at_end_note(grace) if mode == "at_end" else None,
            "note_ru": at_end_note(grace, ru=True) if mode == "at_end" else None}


def curve_rows(run: Run, live: dict | None = None) -> list[dict]:
    """The run's curve as far as the lab knows it now: its metrics.jsonl up to the running
    link's first step, then that link's live rows (none once its outputs are merged)."""
    live = live_curve(run) if live is None else live
    rows = read_metrics(run.folder)
    if not live or not live["rows"]:
        return rows
    start = min(r["step"] for r in live["rows"])
    return [r for r in rows if r["step"] < start] + live["rows"]
