"""The live curve of a Kaggle link while its session runs, as the watch sees it at each poll.

The watch hands each polled status to `LiveWatch.poll`: the session's log is followed
(lab.kaggle.logs.LiveLog) into the link's folder, new metrics rows are said as progress lines
(`lab watch RUN` prints them; the monitor draws them, `live_rows`), and when Kaggle turns out to
keep the log until the session ends (or the account's probe found so), that is said once instead
of a curve that does not move. The rows are only a preview: the session's own `metrics.jsonl`
replaces them when its outputs come back.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from lab.kaggle.client import AccountClient
from lab.kaggle.logs import LiveLog, read_live
from lab.kaggle.probed import read_probe
from lab.machines.kaggle.record import KaggleLinkRecord, KernelPush
from lab.runs import Link, Run

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


def live_rows(run: Run, link: Link) -> dict | None:
    """{"link", "mode", "rows", "last_step", "note_en", "note_ru"} of a running link, from what
    its watch keeps in the link's folder; None before the watch began. `rows`: those past the
    link's first step."""
    folder = KaggleLinkRecord.of(link).folder
    state, rows = read_live(run.folder / folder) if folder else (None, [])
    if state is None:
        return None
    rows = [r for r in rows if r["step"] > link.from_step]
    mode = state.get("mode", "waiting")
    grace = float(state.get("grace_s") or 0)
    return {"link": link.n, "mode": mode, "rows": rows, "last_step": rows[-1]["step"] if rows else None,
            "note_en": at_end_note(grace) if mode == "at_end" else None,
            "note_ru": at_end_note(grace, ru=True) if mode == "at_end" else None}


def progress_line(n: int, row: dict, steps_until: int) -> str:
    """One progress line of link `n` from a live metrics row."""
    loss = f" loss {row['loss']:.4f}" if isinstance(row.get("loss"), (int, float)) else ""
    val = f" val {row['val_loss']:.4f}" if isinstance(row.get("val_loss"), (int, float)) else ""
    speed = f" {row['tok_s']:,.0f} tok/s" if isinstance(row.get("tok_s"), (int, float)) else ""
    return f"link {n}: step {row['step']:,}/{steps_until:,}{loss}{val}{speed} (live, from the session's log)"


class LiveWatch:
    """One link's live curve during the watch; `close()` when the watch ends."""

    def __init__(self, c: AccountClient, kernel: KernelPush, folder: Path, n: int, steps_until: int,
                 say: Callable[[str], None], grace_s: float, retry_s: float):
        self.n, self.steps_until, self.say = n, steps_until, say
        if (read_probe(c.account.name) or {}).get("log_while_running") is False:
            grace_s = 0.0  # the account's probe found the log kept until the end: said at the first RUNNING
        self.log = LiveLog(c, kernel.slug, kernel.version, folder, grace_s=grace_s, retry_s=retry_s)
        self.told_at_end = False
        self.said = len(self.log.rows())  # rows a driver before this one already said
        self.log.start()

    def poll(self, status: str, asked_at: float | None = None) -> None:
        """`asked_at`: time.monotonic() before the status was asked."""
        mode = self.log.seen_status(status, asked_at)
        rows = self.log.rows()
        if len(rows) > self.said:
            last = max(rows[self.said:], key=lambda r: r["step"])
            self.say(progress_line(self.n, last, self.steps_until))
            self.said = len(rows)
        if mode == "at_end" and not self.told_at_end:
            self.say(f"link {self.n}: " + at_end_note(self.log.grace_s))
            self.told_at_end = True

    def close(self) -> None:
        self.log.stop()
