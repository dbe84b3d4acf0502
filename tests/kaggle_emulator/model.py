"""The emulated Kaggle's state: accounts, blobs, datasets, kernels, sessions, faults."""
from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path


NOTEBOOK_LIMIT_BYTES = 1_000_000
MAX_PAGE_SIZE = 200
MAX_RPC_BODY_BYTES = 16 * 1024 * 1024
KAGGLE_SESSION_LIMIT_S = 12 * 3600
GPU_SHAPES = {"NvidiaTeslaT4", "NvidiaTeslaP100", "NvidiaTeslaT4Highmem", "NvidiaL4", "NvidiaL4X1"}
ACTIVE = ("QUEUED", "RUNNING", "CANCEL_REQUESTED")
TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")
SIGNED_URL_TTL_S = 3600.0
_CHUNK = 1024 * 1024


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _duration(seconds: float) -> str:
    """A protobuf Duration as JSON: whole seconds, never dropping days (unlike the SDK's renderer)."""
    whole = int(seconds)
    frac = seconds - whole
    return f"{whole}s" if frac < 1e-3 else f"{whole}.{int(frac * 1000):03d}s"


def _timestamp(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


# ---------------------------------------------------------------------------------------------
# State


@dataclass
class EmulatedAccount:
    """One Kaggle account: its credentials and its weekly GPU quota (in emulated seconds)."""
    username: str
    key: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    gpu_total_s: float = 30 * 3600.0
    gpu_used_s: float = 0.0
    gpu_reserved_s: float = 0.0
    refresh_time: datetime = field(default_factory=lambda: _utcnow() + timedelta(days=7))
    # False: not verified (its phone; for accounts made after December 2025 its identity too): a GPU push
    # is accepted and its session runs with no GPU (notes from 2026; lab.kaggle's advice names both checks).
    gpu_allowed: bool = True
    has_ever_run: bool = False  # the quota's `hasEverRun`: set once a GPU session of the account started
    nccl_p2p_broken: bool = False  # its sessions' all-reduce fails unless NCCL_P2P_DISABLE=1 *(assumed)*


@dataclass
class _Blob:
    id: str
    token: str
    owner: str
    name: str
    size: int
    path: Path
    received: int = 0


@dataclass
class _DatasetVersion:
    number: int
    folder: Path
    notes: str
    ready_at: float  # monotonic; when processing ends
    status: str = "BLOBS_RECEIVED"


@dataclass
class _Dataset:
    owner: str
    slug: str
    title: str
    private: bool
    versions: list[_DatasetVersion] = field(default_factory=list)
    created_at: float = field(default_factory=time.monotonic)


@dataclass
class _Session:
    id: int
    owner: str
    slug: str
    version: int
    gpu: bool
    timeout_s: float  # emulated seconds
    folder: Path  # holds kaggle/ (the sandbox), the notebook and the log
    mounts: list[tuple[Path, Path]]  # (source folder, where it appears under kaggle/input)
    queued_at: float
    status: str = "QUEUED"
    failure: str = ""
    launching: bool = False  # the sandbox is being built; the process is not there yet
    proc: subprocess.Popen | None = None
    launched_at: float | None = None  # papermill started
    started_at: float | None = None  # the notebook's first line: its clock (quota, timeout) runs from here
    stop_reason: str | None = None  # "timeout", "quota", "cancel", "shutdown"
    term_sent_at: float | None = None
    outputs_lost: bool = False  # killed at its timeout with /kaggle/working not kept
    kill_lost: bool = False  # at its timeout: SIGKILL at once, outputs lost (else SIGTERM first)
    keep_outputs: bool = False  # with kill_lost: the outputs saved so far are kept all the same
    timeout_status: str = "CANCEL_ACKNOWLEDGED"  # how it ends at its timeout (its runtime limit)
    listing_status: int | None = None  # with its outputs lost: what the output listing answers (403, 404)
    held: bool = False  # it never starts: it reads `status` (QUEUED, NEW_SCRIPT) for ever
    kill_once: str | None = None  # killed (as at its timeout) once a file matching this glob is in its working dir
    exited_at: float | None = None
    charged_s: float = 0.0  # emulated seconds of GPU quota it was charged
    wedge: tuple | None = None  # (after_s, once): when its notebook dies unnoticed (kaggle_emulator.overnight)
    wedged: bool = False
    deleted: bool = False  # its kernel was deleted while it ran
    image: str = ""  # the docker image it runs on
    log: list[dict] = field(default_factory=list)
    log_done: threading.Event = field(default_factory=threading.Event)

    @property
    def root(self) -> Path:
        return self.folder / "kaggle"

    @property
    def working(self) -> Path:
        return self.root / "working"


@dataclass
class _KernelVersion:
    number: int
    text: str
    request: dict
    session: _Session


@dataclass
class _Kernel:
    id: int
    owner: str
    slug: str
    title: str
    private: bool
    versions: list[_KernelVersion] = field(default_factory=list)
    shell: bool = False  # an empty draft a refused push left (quirks: `shells_after_refusal`)
    hidden: bool = False  # an interactive session's: it holds a GPU slot but is listed nowhere
    last_run: datetime | None = None  # when its newest version was pushed (ListKernels' lastRunTime)


@dataclass
class _Fault:
    status: int  # 0: no error, only the delay
    retry_after: float | None = None
    after: bool = False  # answer the error after doing the work (the reply is "lost")
    delay_s: float = 0.0  # wait this long before answering (the client's timeout may fire first)


@dataclass
class _KillPlan:
    """How Kaggle ends an account's next session: `after_s` emulated seconds after it starts (or
    `once` its working folder holds a file matching that glob), without SIGTERM, ending in `status` with no reason given; with `lose_outputs` none of its
    outputs (and none of its log) are kept, and the output listing answers `listing_status`
    (403 or 404; None: an empty listing)."""
    after_s: float | None
    lose_outputs: bool = True
    status: str = "ERROR"
    listing_status: int | None = None
    once: str | None = None  # instead of `after_s`: once a file matching this glob is in its working dir


@dataclass
class SessionInfo:
    """What a test may want to know about one session (a copy; it does not change)."""
    id: int
    owner: str
    slug: str
    version: int
    status: str
    failure: str
    gpu: bool
    root: Path
    working: Path
    stop_reason: str | None


class _HttpError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------------------------
# The emulator


