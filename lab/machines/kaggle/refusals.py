"""Kaggle's answers that refuse a link before its session starts, read as the link's outcome.

An answer that can pass never halts a run (issue 29): a busy spell (429 RESOURCE_EXHAUSTED, which
kaggle-cli#931 saw last half an hour), the account's GPU session cap (the lab's sessions, another
member's, an interactive one), its weekly quota, an empty draft an earlier refusal left: each ends
the link BUSY or NO_QUOTA, so the driver goes on elsewhere or waits, `until` when Kaggle said. A
link ends FAILED only for the run's own cause (its data, its notebook), or when Kaggle refused the
push in words no source explains while the quota call says the quota is not spent.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from lab.config import UserError
from lab.kaggle.client import NOTEBOOK_LIMIT_BYTES, AccountClient, KaggleError, notebook_text
from lab.kaggle.datasets import MAX_DATASET_FILES
from lab.machines.auto import MIN_LINK_MIN, STARTUP_MIN
from lab.runs import End

MAX_GPU_SESSIONS = 2  # batch GPU sessions an account may run at once (Kaggle's docs)
BUSY_PAUSE_S = 300.0  # a busy Kaggle that named no wait is asked again after this long


class Refused(UserError):
    """Kaggle refused the link's session, or would have, and nothing started; `until`: when to ask again."""
    def __init__(self, message: str, kind: End, until: str | None = None, ru: str | None = None):
        self.kind, self.until = kind, until
        super().__init__(message, ru=ru)


def until_of(wait_s: float | None) -> str:
    wait = BUSY_PAUSE_S if wait_s is None else max(1.0, wait_s)
    return (datetime.now(timezone.utc) + timedelta(seconds=wait)).isoformat(timespec="milliseconds")


def busy(e: UserError) -> Refused | None:
    """A passing answer met before the push (a busy spell, an error page, Kaggle unreachable) as a refusal:
    the run goes elsewhere meanwhile, or waits, and the uploads done so far are kept. Never a halt."""
    if isinstance(e, KaggleError) and e.cause in ("busy", "unreadable"):
        return Refused(f"{e} The lab asks again then.", End.BUSY, until_of(e.wait_s))
    return None


def refused(e: KaggleError, c: AccountClient) -> Refused:
    """Why Kaggle refused a push, from the cause its answer names; for words no source explains, the quota."""
    if e.cause == "busy":
        return Refused(str(e), End.BUSY, until_of(e.wait_s))
    if e.cause in ("session-cap", "shell", "quota"):
        return Refused(str(e), End.NO_QUOTA if e.cause == "quota" else End.BUSY)
    spent = out_of_quota(c)
    if spent is None:
        return Refused(f"{e} The quota could not be asked (Kaggle busy): the lab asks again later.", End.BUSY,
                       until_of(None))
    return Refused(str(e), End.NO_QUOTA if spent else End.FAILED)


def out_of_quota(c: AccountClient) -> bool | None:
    try:
        return c.quota().left_s < (STARTUP_MIN + MIN_LINK_MIN) * 60
    except UserError:
        return None


def check_seats(c: AccountClient, slug: str) -> None:
    """Raises Refused (BUSY) when Kaggle lists the account's GPU sessions at the cap already (another
    member's count too): a push into a full account would be refused anyway, and may leave an empty draft."""
    try:
        running = c.gpu_sessions(skip=[slug])
    except KaggleError as e:
        if e.cause == "busy":
            raise busy(e) from None
        return  # the listing is a courtesy: Kaggle's own cap still answers the push
    if len(running) >= MAX_GPU_SESSIONS:
        names = ", ".join(f"{ref} ({status})" for ref, status in running)
        raise Refused(f"Kaggle account '{c.account.name}': Kaggle lists {len(running)} GPU sessions running on it "
                      f"({names}): it runs its maximum, some of them not started from this computer (another lab "
                      "member's, or a notebook of the account's own)", End.BUSY)


def check_limits(notebook: dict, data_files: int, data: Path) -> None:
    """Kaggle's limits on the notebook and a dataset version, met before anything goes up (the run's own cause)."""
    size = len(notebook_text(notebook).encode("utf-8"))
    if size > NOTEBOOK_LIMIT_BYTES:
        raise UserError(f"the training notebook for this run is {size / 1e6:.2f} MB; Kaggle takes at most 1 MB: "
                        "keep data and checkpoints out of it (they go in datasets)",
                        ru=f"обучающий блокнот этого прогона весит {size / 1e6:.2f} МБ, а Kaggle берёт не больше "
                           "1 МБ: данные и чекпоинты в него не кладите (они идут датасетами)")
    if data_files > MAX_DATASET_FILES:
        raise UserError(f"the run's data ({data}) is {data_files} files; Kaggle refuses a dataset version of more "
                        f"than {MAX_DATASET_FILES}: prepare it in fewer, larger shards",
                        ru=f"данные прогона ({data}) — {data_files} файлов, а Kaggle не берёт версию датасета больше "
                           f"чем из {MAX_DATASET_FILES}: подготовьте их меньшим числом шардов покрупнее")


def kernel_exists(c: AccountClient, slug: str) -> bool:
    try:
        c.kernel_status(slug)
        return True
    except KaggleError as e:
        if e.status in (403, 404):  # a 401 for a kernel that is not there reads 404 (lab.kaggle.client)
            return False
        raise
