"""What the Kaggle client returns, as the kit reads it: quota in seconds (days kept), pushes,
datasets, the notebook text exactly as sent, and a session log as plain text."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class Quota:
    """GPU quota in seconds; refresh_time in UTC (None when Kaggle does not say).

    Two figures of what is left, both never below zero: `left_s`, what a new session has (total −
    used − what running sessions hold reserved: kagglesdk documents `time_reserved` as "Quota reserved
    by currently-running sessions"), which the lab plans with; and `said_left_s`, total − used, what
    `kaggle quota` shows. Sessions may run past the total (30.93 of 30 h in one record): `over_s`.
    `has_ever_run`: the quota says the account has started a GPU session (kagglesdk 0.1.38's
    `has_ever_run`; a protobuf false is left out of the reply, so False may also mean "not said")."""
    total_s: float
    used_s: float
    reserved_s: float
    left_s: float
    refresh_time: datetime | None
    has_ever_run: bool = False

    @property
    def said_left_s(self) -> float:
        return max(0.0, self.total_s - self.used_s)

    @property
    def over_s(self) -> float:
        return max(0.0, self.used_s - self.total_s)


@dataclass(frozen=True)
class DatasetInfo:
    slug: str  # "owner/slug"
    title: str
    bytes: int


DATASET_PAGE = 20  # datasets per page of a listing (Kaggle's page size)


@dataclass(frozen=True)
class PushResult:
    ref: str
    url: str
    version: int | None


def _seconds(duration: Any) -> float:
    # Durations arrive as timedelta; total_seconds() keeps the days that the SDK's own JSON
    # rendering of a duration drops (108000 s would print as "21600s").
    return duration.total_seconds() if duration is not None else 0.0


def quota_from(resp: Any) -> Quota:
    gpu = resp.gpu_quota
    total = _seconds(gpu.total_time_allowed) if gpu is not None else 0.0
    used = _seconds(gpu.time_used) if gpu is not None else 0.0
    reserved = _seconds(gpu.time_reserved) if gpu is not None else 0.0
    refresh = resp.quota_refresh_time
    if refresh is not None and refresh.tzinfo is None:
        refresh = refresh.replace(tzinfo=timezone.utc)  # the SDK parses Kaggle's UTC times as naive
    ran = bool(getattr(gpu, "has_ever_run", False)) if gpu is not None else False
    return Quota(total, used, reserved, max(0.0, total - used - reserved), refresh, ran)


def notebook_text(notebook: str | dict) -> str:
    """The notebook exactly as the real client sends it: code outputs cleared, each cell's
    source one string (its push does the same to the file; doing it here makes the size
    check exact)."""
    nb = json.loads(notebook) if isinstance(notebook, str) else json.loads(json.dumps(notebook))
    for cell in nb.get("cells", []):
        if "outputs" in cell and cell.get("cell_type") == "code":
            cell["outputs"] = []
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
    return json.dumps(nb)


def log_text(raw: str) -> str:
    """A session log as plain text: Kaggle sends a JSON list of {"stream_name", "time", "data"}."""
    if raw.lstrip().startswith("["):
        try:
            entries = json.loads(raw)
            return "".join(str(e.get("data", "")) for e in entries if isinstance(e, dict))
        except ValueError:
            pass
    return raw
