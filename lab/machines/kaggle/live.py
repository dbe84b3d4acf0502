"""The live curve of a Kaggle link while its session runs, as the watch sees it at each look.

The watch hands each polled status to `LiveWatch.poll`: the session's log is followed
(lab.kaggle.logs.LiveLog) into the link's folder (`live-metrics.jsonl`, as every kind keeps it), and
the log's mode comes back: "live" (its lines show while it runs), "at_end" (Kaggle keeps the log until
the session ends, or the account's probe found so), "waiting". The rows are only a preview: the
session's own `metrics.jsonl` replaces them when its outputs come back.
"""
from __future__ import annotations

from pathlib import Path

from lab.kaggle.client import AccountClient
from lab.kaggle.logs import LiveLog
from lab.kaggle.probed import read_probe
from lab.machines.kaggle.record import KernelPush

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


class LiveWatch:
    """One link's live curve during the watch; `close()` when the watch ends."""

    def __init__(self, c: AccountClient, kernel: KernelPush, folder: Path, grace_s: float, retry_s: float):
        if (read_probe(c.account.name) or {}).get("log_while_running") is False:
            grace_s = 0.0  # the account's probe found the log kept until the end: said at the first RUNNING
        self.log = LiveLog(c, kernel.slug, kernel.version, folder, grace_s=grace_s, retry_s=retry_s)
        self.grace_s = grace_s
        self.log.start()

    def poll(self, status: str, asked_at: float | None = None) -> str:
        """The log's mode now; `asked_at`: time.monotonic() before the status was asked."""
        return self.log.seen_status(status, asked_at)

    def rows(self) -> list[dict]:
        return self.log.rows()

    def events(self) -> int:
        """The log's events read so far: one more is a sign the session lives."""
        return self.log.events

    def close(self) -> None:
        self.log.stop()
