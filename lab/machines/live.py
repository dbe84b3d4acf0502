"""A run's curve while a session elsewhere still runs: the rows its machine shows of it (a Kaggle
session's log), after the run's own `metrics.jsonl`, until the session's outputs come back and
replace them. Machine-neutral: each machine says what it shows (`Host.live`)."""
from __future__ import annotations

from lab.config import UserError
from lab.kernel.metrics import read_metrics
from lab.machines.control import active_link
from lab.machines.registry import host_of
from lab.runs import Run


def live_curve(run: Run) -> dict | None:
    """{"link", "mode", "rows", "note_en", "note_ru"} of the run's running link, or None when no
    link runs or its machine shows no curve of its own."""
    link = active_link(run)
    if link is None:
        return None
    try:
        host = host_of(link)
    except UserError:  # a machine no longer in the lab shows nothing
        return None
    return host.live(run, link)


def curve_rows(run: Run, live: dict | None = None) -> list[dict]:
    """The run's curve as far as the lab knows it now: its metrics.jsonl up to the running
    link's first step, then that link's live rows (none once its outputs are merged)."""
    live = live_curve(run) if live is None else live
    rows = read_metrics(run.folder)
    if not live or not live["rows"]:
        return rows
    start = min(r["step"] for r in live["rows"])
    return [r for r in rows if r["step"] < start] + live["rows"]
