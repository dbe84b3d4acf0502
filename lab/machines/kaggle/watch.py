"""Watching one Kaggle link's session: its status polled until it ends, its log followed meanwhile.

Status is asked no more often than every `poll_s` (LAB_KAGGLE_POLL_S, 30 s), backing off to four
times that while nothing changes; each change is recorded on the link (`kaggle_status`,
`status_at`; the first RUNNING as `running_at`) for the session's measurements. The statuses
Kaggle's client knows (kagglesdk `KernelWorkerStatus`): QUEUED, RUNNING, COMPLETE, ERROR,
CANCEL_REQUESTED, CANCEL_ACKNOWLEDGED and NEW_SCRIPT; a kernel still QUEUED or NEW_SCRIPT
`start_wait_s` after its push, or still RUNNING `overdue_s` past its session timeout, is given
up on with the time it waited (the link stays as it is: `lab watch RUN` takes it up again).
A person's cancel is recorded on the link (`cancel_requested`): only then does an ending in
CANCEL_ACKNOWLEDGED read as cancelled, since Kaggle ends a session at its runtime limit that way too.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, TypeVar

from lab.config import UserError
from lab.kaggle.client import AccountClient, KaggleError
from lab.kernel.checkpoint import atomic_write
from lab.machines.kaggle.data import LinkContext
from lab.machines.kaggle.live import LiveWatch
from lab.machines.kaggle.record import KaggleLinkRecord, KernelPush
from lab.machines.links import get_link
from lab.runs import now

T = TypeVar("T")

MAX_POLL_FACTOR = 4  # status polls back off to 4 × the poll interval while nothing changes
LOG_EVERY_POLLS = 4  # the log tail is fetched every 4th poll: at most one extra call per 2 minutes
WATCH_PATIENCE_POLLS = 120  # Kaggle unreachable this long (1 hour at 30 s) while watching: give up for now
TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")
NOT_STARTED = ("QUEUED", "NEW_SCRIPT")


def watch(run_id: str, n: int, ctx: LinkContext, cancelled: Callable[[], bool]) -> tuple[str, str]:
    """Polls the session until it ends, following its log for the live curve meanwhile;
    returns (status, failure message)."""
    run, link = get_link(run_id, n)
    record = KaggleLinkRecord.of(link)
    if record.kaggle_status in TERMINAL:
        return record.kaggle_status, record.failure
    curve = LiveWatch(ctx.c, record.kernel, run.folder / record.folder, n, run.cfg.steps_until, ctx.say,
                      grace_s=ctx.settings.log_grace_s, retry_s=ctx.settings.poll_s)
    try:
        return _Poll(run_id, n, ctx, cancelled, curve).run()
    finally:
        curve.close()


@dataclass
class _Poll:
    run_id: str
    n: int
    ctx: LinkContext
    cancelled: Callable[[], bool]
    curve: LiveWatch

    def run(self) -> tuple[str, str]:
        run, link = get_link(self.run_id, self.n)
        record, base = KaggleLinkRecord.of(link), self.ctx.settings.poll_s
        self.kernel, self.timeout_s = record.kernel, record.session_timeout_s
        self.live = run.folder / record.folder / "live.log"
        self.pushed = datetime.fromisoformat(self.kernel.pushed_at) if self.kernel.pushed_at \
            else datetime.now(timezone.utc)
        interval, last, polls, told, ran = base, record.kaggle_status, 0, False, record.ran
        while True:
            if self.cancelled() and not told:
                self.ctx.say(cancel_hint(self.kernel, self.ctx.c.account.name))
                KaggleLinkRecord.update(self.run_id, self.n, cancel_requested=now())
                told = True
            status, failure = self._status(interval)
            polls += 1
            if status != last:
                KaggleLinkRecord.update(self.run_id, self.n, kaggle_status=status, failure=failure, status_at=now())
                self.ctx.say(f"link {self.n}: {self.kernel.slug} {status}" + (f": {failure}" if failure else ""))
                last, interval = status, base
            if status in TERMINAL:
                return status, failure
            if status == "RUNNING" and not ran:
                ran = True  # the session started: any quota check at its start passed
                KaggleLinkRecord.update(self.run_id, self.n, ran=True, running_at=now())
            self._give_up_if_lost(status)
            if polls % LOG_EVERY_POLLS == 1:
                save_log(self.ctx.c, self.kernel.slug, self.live)
            time.sleep(interval)
            interval = min(interval * 1.5, base * MAX_POLL_FACTOR)

    def _status(self, interval: float) -> tuple[str, str]:
        """The session's status, asked until Kaggle answers (WATCH_PATIENCE_POLLS at most)."""
        failing_since = None
        while True:
            try:
                asked = time.monotonic()
                status, failure = self.ctx.c.kernel_status(self.kernel.slug, self.kernel.version)
            except KaggleError as e:
                if not e.retryable:
                    raise
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > WATCH_PATIENCE_POLLS * self.ctx.settings.poll_s:
                    raise KaggleError(e.account, f"lost contact with Kaggle while watching {self.kernel.slug} "
                                                 f"({e.what})", "The session goes on without the lab: `lab watch RUN` "
                                                                "picks it up where it is.", retryable=True) from None
                time.sleep(interval)
                continue
            self.curve.poll(status, asked)
            return status, failure

    def _give_up_if_lost(self, status: str) -> None:
        """A kernel not started long after its push, or running long past its timeout, is given up."""
        waited = (datetime.now(timezone.utc) - self.pushed).total_seconds()
        page = self.kernel.url or "its page"
        slug, account = self.kernel.slug, self.ctx.c.account.name
        if status in NOT_STARTED and waited > self.ctx.settings.start_wait_s:
            raise KaggleError(account, f"{slug} still reads {status} {waited / 60:.0f} min after its push: Kaggle "
                                       "has not started it", f"If it starts later, `lab watch RUN` follows it; to give "
                              f"it up, open {page} and press Stop session (or Cancel), then `lab watch RUN` goes on "
                              "from the run's checkpoint.", retryable=True)
        if waited > self.timeout_s + self.ctx.settings.overdue_s:
            late = waited - self.timeout_s
            raise KaggleError(account, f"{slug} still reads {status} {late / 60:.0f} min past its session timeout",
                              f"Kaggle seems to have lost it: open {page} and press Stop session; then `lab watch "
                              "RUN` collects what it saved and goes on.", retryable=True)


def save_log(c: AccountClient, slug: str, path: Path) -> None:
    try:
        text = c.kernel_log(slug)
    except UserError:
        return  # the log is a courtesy: the status decides
    if text:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def patiently(ctx: LinkContext, what: str, fn: Callable[[], T]) -> T:
    """`fn()` until Kaggle answers: a busy or unreachable Kaggle is waited out, as long as it asks (its
    Retry-After) or a poll, each wait said with its time, for WATCH_PATIENCE_POLLS polls at most; then
    the last error is raised (`lab watch RUN` takes the link up again)."""
    deadline = time.monotonic() + WATCH_PATIENCE_POLLS * ctx.settings.poll_s
    for tries in itertools.count(1):
        try:
            return fn()
        except KaggleError as e:
            left = deadline - time.monotonic()
            if not e.retryable or left <= 0:
                raise
            wait = min(left, max(ctx.settings.poll_s, e.wait_s or 0.0))
            until = (datetime.now(timezone.utc) + timedelta(seconds=wait)).strftime("%H:%M:%S UTC")
            ctx.say(f"{what}: {e.what}; waiting until {until} (try {tries})")
            time.sleep(wait)
    raise AssertionError("unreachable")


def cancel_hint(kernel: KernelPush, account: str) -> str:
    return (f"No further link will start. Kaggle's public API cannot stop a running session (its cancel call "
            f"needs a session id that no reply gives): to stop {kernel.slug} now, open {kernel.page} signed in as "
            f"account '{account}' and press Stop session. The lab downloads what it saved when it ends.")
