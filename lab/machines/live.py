"""A run's curve while a session elsewhere still runs: the rows its machine shows of it (`Host.live`) after
the run's own `metrics.jsonl`, until the session's outputs come back and replace them."""
from __future__ import annotations

from lab.config import UserError
from lab.kernel.metrics import read_metrics
from lab.machines.control import active_link
from lab.machines.registry import host_of
from lab.runs import Run


def live_curve(run: Run) -> dict | None:
    """{"link", "mode", "rows", "note_en", "note_ru"} of the run's running link, or None."""
    link = active_link(run)
    if link is None:
        return None
    try:
        host = host_of(link)
    except UserError:  # a machine no longer in the lab shows nothing
        return None
    return host.live(run, link)


LIVE_MEAN = 5  # a live training point is the mean of this many single-step losses around it


def curve_rows(run: Run, live: dict | None = None) -> list[dict]:
    live = live_curve(run) if live is None else live
    rows = read_metrics(run.folder)
    if not live or not live["rows"]:
        return rows
    start = min(r["step"] for r in live["rows"])
    return [r for r in rows if r["step"] < start] + even_live(live["rows"])


def even_live(rows: list[dict]) -> list[dict]:
    """The live rows with each training loss the mean of the LIVE_MEAN single-step losses around it; the
    step's own kept as `loss_sample`. A log shows one step's loss every few seconds, while the final curve
    draws every step's running mean: joined as they are, single losses zigzag and spike where it has none."""
    losses = [(i, r["loss"]) for i, r in enumerate(rows) if isinstance(r.get("loss"), (int, float))]
    out = [dict(r) for r in rows]
    half = LIVE_MEAN // 2
    for k, (i, loss) in enumerate(losses):
        near = [v for _, v in losses[max(0, k - half):k + half + 1]]
        out[i]["loss"], out[i]["loss_sample"] = sum(near) / len(near), loss
    return out
