"""A local emulator of the Kaggle API, so the kit is tested with the real `kaggle` client.

It speaks the calls the kit uses exactly as the real client sends them: `POST
{base}/v1/{service}/{Method}` with camelCase JSON, errors as JSON with `code >= 400`, blob
uploads (`StartBlobUpload` -> raw-bytes `PUT createUrl`, resumable with `Content-Range`) and
signed-URL downloads (`GET`). Pushed notebooks really run, with papermill on the CPU, in a
sandbox per session that imitates `/kaggle`: `$LAB_KAGGLE_ROOT/input/...` holds the data
sources and `$LAB_KAGGLE_ROOT/working` is what the session leaves as output.

What Kaggle does that the emulator imitates (see shared/kaggle-notes.md): per-account state
and authentication (Basic for username/key, Bearer for tokens), private datasets whose status
turns READY after a while, kernels with versions, a weekly GPU quota that running sessions
use up, at most 2 GPU sessions at once, the 12-hour session limit, SIGTERM before the kill.
What it only guesses at is marked *(assumed)*.

Stdlib only. Tests use `KaggleEmulator` in-process; people trying the kit headless run
`python -m tools.kaggle_emulator --port 8765 --state DIR --account alice`.
"""
from __future__ import annotations

import argparse
import base64
import email.utils
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, Callable
from urllib.parse import urlsplit

from lab.procs import descendants, signal_quietly

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
    started_at: float | None = None
    stop_reason: str | None = None  # "timeout", "quota", "cancel", "shutdown"
    term_sent_at: float | None = None
    exited_at: float | None = None
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


@dataclass
class _Fault:
    status: int  # 0: no error, only the delay
    retry_after: float | None = None
    after: bool = False  # answer the error after doing the work (the reply is "lost")
    delay_s: float = 0.0  # wait this long before answering (the client's timeout may fire first)


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


class KaggleEmulator:
    """The emulated Kaggle: `start()`, `url`, `stop()`; a context manager.

    time_scale: emulated seconds per wall second (quota use and session time limits).
    dataset_ready_s: wall seconds a new dataset version takes to become READY.
    queue_s: wall seconds a pushed session waits in QUEUED before it starts.
    grace_s: wall seconds between SIGTERM and SIGKILL when a session is stopped.
    input_layout: "new" mounts inputs at input/datasets/<owner>/<slug> and
        input/notebooks/<owner>/<slug>; "old" at input/<slug>.
    """

    def __init__(self, state_dir: str | Path | None = None, *, accounts: list[EmulatedAccount] = (),
                 time_scale: float = 1.0, dataset_ready_s: float = 1.0, queue_s: float = 0.2,
                 grace_s: float = 10.0, max_gpu_sessions: int = 2, input_layout: str = "new",
                 kernel_name: str = "python3", tick_s: float = 0.05, host: str = "127.0.0.1", port: int = 0):
        if input_layout not in ("new", "old"):
            raise ValueError("input_layout must be 'new' or 'old'")
        self._own_state = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="kaggle-emulator-")).resolve()
        self.time_scale = float(time_scale)
        self.dataset_ready_s = float(dataset_ready_s)
        self.queue_s = float(queue_s)
        self.grace_s = float(grace_s)
        self.max_gpu_sessions = int(max_gpu_sessions)
        self.input_layout = input_layout
        self.kernel_name = kernel_name
        self.tick_s = float(tick_s)
        self._host, self._port = host, port
        self._lock = threading.RLock()
        self._accounts: dict[str, EmulatedAccount] = {}
        self._blobs: dict[str, _Blob] = {}
        self._datasets: dict[tuple[str, str], _Dataset] = {}
        self._dataset_behaviour: dict[tuple[str, str], str] = {}
        self._kernels: dict[tuple[str, str], _Kernel] = {}
        self._sessions: dict[int, _Session] = {}
        self._signed: dict[str, tuple[Path, str, float]] = {}  # token -> (file, name, expires)
        self._faults: dict[str, list[_Fault]] = {}
        self._push_errors: dict[str, list[str]] = {}
        self._drop_sources: dict[str, int] = {}
        self._recorded: list[dict] = []
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        for account in accounts:
            self.add_account(account)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "KaggleEmulator":
        if self._server is not None:
            return self
        for sub in ("blobs", "datasets", "sessions"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        self._server = ThreadingHTTPServer((self._host, self._port), _Handler)
        self._server.daemon_threads = True
        self._server.emulator = self  # type: ignore[attr-defined]
        self._stopping.clear()
        self._threads = [threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                          name="kaggle-emulator-http", daemon=True),
                         threading.Thread(target=self._supervise, name="kaggle-emulator-sessions", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulator is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stops every session (SIGTERM, then SIGKILL after a short grace) and the server."""
        if self._server is None:
            return
        self._stopping.set()  # no session starts from now on
        self._threads[1].join(timeout=30)
        with self._lock:
            for s in self._sessions.values():
                s.launching = False
                if s.status in ACTIVE:
                    self._stop_session(s, "shutdown")
        deadline = time.monotonic() + min(self.grace_s, 3.0)
        while time.monotonic() < deadline and self._any_process_alive():
            time.sleep(0.05)
        with self._lock:
            for s in self._sessions.values():
                if s.proc is not None and s.proc.poll() is None:
                    _kill_tree(s.proc, signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM)
        for s in list(self._sessions.values()):
            if s.proc is not None:
                try:
                    s.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._server = None
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "KaggleEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _any_process_alive(self) -> bool:
        with self._lock:
            return any(s.proc is not None and s.proc.poll() is None for s in self._sessions.values())

    # -- test controls --------------------------------------------------------------------

    def add_account(self, account: EmulatedAccount | str, key: str | None = None,
                    token: str | None = None, **quota: Any) -> EmulatedAccount:
        """Adds an account; with neither key nor token, a random key is made."""
        if isinstance(account, str):
            account = EmulatedAccount(account, key=key, token=token, **quota)
        if account.key is None and account.token is None:
            account.key = secrets.token_hex(16)
        with self._lock:
            self._accounts[account.username] = account
        return account

    def account(self, username: str) -> EmulatedAccount:
        with self._lock:
            return self._accounts[username]

    def set_quota(self, username: str, *, total_s: float | None = None, used_s: float | None = None,
                  reserved_s: float | None = None, refresh_time: datetime | None = None) -> None:
        with self._lock:
            a = self._accounts[username]
            if total_s is not None:
                a.gpu_total_s = float(total_s)
            if used_s is not None:
                a.gpu_used_s = float(used_s)
            if reserved_s is not None:
                a.gpu_reserved_s = float(reserved_s)
            if refresh_time is not None:
                a.refresh_time = refresh_time

    def inject_faults(self, method: str, status: int, count: int = 1, *,
                      retry_after: float | None = None, after: bool = False) -> None:
        """The next `count` requests to `method` get HTTP `status` (with Retry-After if given).

        `method` is an RPC name ("SaveKernel", "GetKernelSessionStatus", ...), "upload" (blob
        PUTs) or "download" (signed-URL GETs). With `after=True` the work is done first and
        only the reply is the error, as when a reply is lost on the way back.
        """
        with self._lock:
            self._faults.setdefault(method, []).extend(
                _Fault(int(status), retry_after, after) for _ in range(int(count)))

    def inject_delay(self, method: str, delay_s: float, count: int = 1) -> None:
        """The next `count` calls to RPC `method` answer only after `delay_s` seconds (and then
        do their work and answer normally), to show the client's timeouts."""
        with self._lock:
            self._faults.setdefault(method, []).extend(_Fault(0, delay_s=float(delay_s)) for _ in range(int(count)))

    def fail_next_push(self, username: str, error: str) -> None:
        """The account's next SaveKernel answers HTTP 200 with this `error`, like Kaggle does."""
        with self._lock:
            self._push_errors.setdefault(username, []).append(error)

    def drop_sources_next_push(self, username: str, count: int = 1) -> None:
        """The account's next `count` pushes run without their dataset sources, reported as
        `invalidDatasetSources`, as Kaggle does with a source it cannot find or that is not ready."""
        with self._lock:
            self._drop_sources[username] = self._drop_sources.get(username, 0) + int(count)

    def set_dataset_behaviour(self, owner: str, slug: str, behaviour: str | None) -> None:
        """"stuck": versions never become READY; "failed": they end FAILED; None: normal."""
        if behaviour not in (None, "stuck", "failed"):
            raise ValueError("behaviour must be None, 'stuck' or 'failed'")
        with self._lock:
            if behaviour is None:
                self._dataset_behaviour.pop((owner, slug), None)
            else:
                self._dataset_behaviour[(owner, slug)] = behaviour

    def recorded(self, method: str | None = None) -> list[dict]:
        """Every request so far (method, user, JSON body; uploads as byte counts), oldest first."""
        with self._lock:
            return [dict(r) for r in self._recorded if method is None or r["method"] == method]

    def dataset_versions(self, owner: str, slug: str) -> list[int]:
        with self._lock:
            ds = self._datasets.get((owner, slug))
            return [v.number for v in ds.versions] if ds else []

    def kernel_versions(self, owner: str, slug: str) -> list[int]:
        with self._lock:
            k = self._kernels.get((owner, slug))
            return [v.number for v in k.versions] if k else []

    def session(self, owner: str, slug: str, version: int | None = None) -> SessionInfo:
        with self._lock:
            kv = self._kernel_version(owner, slug, version)
            s = kv.session
            return SessionInfo(s.id, s.owner, s.slug, s.version, s.status, s.failure, s.gpu,
                               s.root, s.working, s.stop_reason)

    def wait_session(self, owner: str, slug: str, timeout_s: float = 60.0,
                     version: int | None = None) -> SessionInfo:
        """Waits until the session has ended (or raises TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.session(owner, slug, version)
            if info.status in TERMINAL:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {owner}/{slug} still {info.status} after {timeout_s} s")
            time.sleep(0.05)

    def cancel(self, owner: str, slug: str, version: int | None = None) -> None:
        with self._lock:
            s = self._kernel_version(owner, slug, version).session
            if s.status in ACTIVE:
                s.status = "CANCEL_REQUESTED"
                self._stop_session(s, "cancel")

    # -- HTTP entry points (called by the handler) ----------------------------------------

    def _authenticate(self, header: str | None) -> EmulatedAccount | None:
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        with self._lock:
            if scheme == "Bearer":
                return next((a for a in self._accounts.values()
                             if a.token and secrets.compare_digest(a.token, value.strip())), None)
            if scheme == "Basic":
                try:
                    user, _, key = base64.b64decode(value.strip()).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    return None
                a = self._accounts.get(user)
                if a and a.key and secrets.compare_digest(a.key, key):
                    return a
        return None

    def _take_fault(self, method: str) -> _Fault | None:
        with self._lock:
            queue = self._faults.get(method)
            return queue.pop(0) if queue else None

    def _record(self, entry: dict) -> None:
        with self._lock:
            self._recorded.append(entry)

    def rpc(self, service: str, method: str, auth_header: str | None, body: dict) -> tuple[int, dict, dict]:
        """One API call: (HTTP status, JSON reply, extra headers)."""
        fault = self._take_fault(method)
        if fault is not None and fault.delay_s:
            time.sleep(fault.delay_s)  # in this request's own thread: others go on meanwhile
            fault = fault if fault.status else None
        user = None if method == "IntrospectToken" else self._authenticate(auth_header)
        entry = {"service": service, "method": method, "user": user.username if user else None, "body": body}
        if fault is not None and not fault.after:
            return self._fault_reply(entry, fault)
        try:
            if method != "IntrospectToken" and user is None:
                raise _HttpError(401, "Unauthenticated: unknown username/key or token")
            handler = _RPCS.get((service, method))
            if handler is None:
                raise _HttpError(404, f"The emulator does not implement {service}/{method}")
            reply = handler(self, user, body)
        except _HttpError as e:
            entry["status"] = e.code
            self._record(entry)
            return e.code, {"code": e.code, "message": e.message}, {}
        if fault is not None:
            return self._fault_reply(entry, fault)
        entry["status"] = 200
        self._record(entry)
        return 200, reply, {}

    def _fault_reply(self, entry: dict, fault: _Fault) -> tuple[int, dict, dict]:
        entry["status"] = fault.status
        entry["fault"] = True
        self._record(entry)
        headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
        return fault.status, {"code": fault.status, "message": f"Injected fault (HTTP {fault.status})"}, headers

    # -- quota ----------------------------------------------------------------------------

    def _get_quota(self, user: EmulatedAccount, body: dict) -> dict:
        gpu = {"timeUsed": _duration(user.gpu_used_s), "timeReserved": _duration(user.gpu_reserved_s),
               "totalTimeAllowed": _duration(user.gpu_total_s)}
        tpu = {"timeUsed": "0s", "timeReserved": "0s", "totalTimeAllowed": _duration(20 * 3600)}
        return {"quotaRefreshTime": _timestamp(user.refresh_time), "gpuQuota": gpu, "tpuQuota": tpu}

    def _gpu_left(self, user: EmulatedAccount) -> float:
        return user.gpu_total_s - user.gpu_used_s - user.gpu_reserved_s

    # -- blobs ----------------------------------------------------------------------------

    def _start_blob_upload(self, user: EmulatedAccount, body: dict) -> dict:
        name = str(body.get("name") or "")
        if not name or "/" in name or name in (".", ".."):
            raise _HttpError(400, "A blob needs a plain file name")
        size = int(body.get("contentLength") or 0)
        blob_id = secrets.token_hex(12)
        blob = _Blob(blob_id, "blob-" + secrets.token_hex(16), user.username, name, size,
                     self.state_dir / "blobs" / blob_id)
        blob.path.write_bytes(b"")
        with self._lock:
            self._blobs[blob_id] = blob
        return {"token": blob.token, "createUrl": f"{self.url}/upload/{blob_id}"}

    def upload(self, blob_id: str, content_range: str | None, body: BinaryIO,
               length: int | None, chunked: bool) -> tuple[int, dict]:
        """A raw-bytes PUT to a createUrl, Google-resumable style: 200 when all bytes are in,
        308 with `Range: bytes=0-N` while some are missing, 404 for an unknown upload."""
        entry = {"service": "blobs", "method": "upload", "user": None, "body": {"blob": blob_id,
                                                                                  "contentRange": content_range}}
        fault = self._take_fault("upload")
        with self._lock:
            blob = self._blobs.get(blob_id)
        if blob is None or (fault is not None and not fault.after):
            _drain(body, length, chunked)
            status = 404 if blob is None else fault.status
            entry.update(status=status, bytes=0, fault=blob is not None)
            self._record(entry)
            return status, {}
        query = re.fullmatch(r"bytes \*/(\d+)", content_range or "")
        if query:
            received = 0
        else:
            part = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", content_range or "")
            start = int(part.group(1)) if part else 0
            if start > blob.received:
                _drain(body, length, chunked)
                entry.update(status=400, bytes=0)
                self._record(entry)
                return 400, {}
            received = _write_at(blob.path, start, body, length, chunked)
            blob.received = start + received
        status = 200 if blob.received >= blob.size else 308
        if fault is not None:
            status, entry["fault"] = fault.status, True
        entry.update(status=status, bytes=received)
        self._record(entry)
        headers = {"Range": f"bytes=0-{blob.received - 1}"} if status == 308 and blob.received else {}
        return status, headers

    def _take_blobs(self, user: EmulatedAccount, files: list) -> list[_Blob]:
        blobs = []
        by_token = {b.token: b for b in self._blobs.values()}
        for f in files or []:
            blob = by_token.get((f or {}).get("token", ""))
            if blob is None or blob.owner != user.username:
                raise _HttpError(400, "Unknown upload token")
            if blob.received < blob.size:
                raise _HttpError(400, f"The upload of {blob.name} is incomplete")
            blobs.append(blob)
        if not blobs:
            raise _HttpError(400, "A dataset version needs at least one file")
        return blobs

    # -- datasets -------------------------------------------------------------------------

    def _create_dataset(self, user: EmulatedAccount, body: dict) -> dict:
        owner, slug = body.get("ownerSlug") or user.username, body.get("slug") or ""
        if owner != user.username:
            raise _HttpError(403, "You may only create datasets you own")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{4,48}[a-z0-9]", slug):
            return {"status": "error", "error": "The dataset slug must be 6-50 characters: a-z, 0-9, -"}
        with self._lock:
            if (owner, slug) in self._datasets:
                return {"status": "error",
                        "error": f'The requested slug "{slug}" is already in use by a dataset. Please choose another slug.'}
            blobs = self._take_blobs(user, body.get("files"))
            # An omitted isPrivate is false: a public dataset, as on Kaggle.
            ds = _Dataset(owner, slug, body.get("title") or slug, bool(body.get("isPrivate", False)))
            self._datasets[(owner, slug)] = ds
            self._add_dataset_version(ds, blobs, "")
        return {"ref": f"{owner}/{slug}", "url": f"{self.url}/datasets/{owner}/{slug}", "status": "ok"}

    def _create_dataset_version(self, user: EmulatedAccount, body: dict) -> dict:
        owner, slug = body.get("ownerSlug") or "", body.get("datasetSlug") or ""
        with self._lock:
            ds = self._visible_dataset(user, owner, slug)
            if ds.owner != user.username:
                raise _HttpError(403, "You may only version datasets you own")
            inner = body.get("body") or {}
            blobs = self._take_blobs(user, inner.get("files"))
            self._add_dataset_version(ds, blobs, inner.get("versionNotes") or "")
        return {"ref": f"{owner}/{slug}", "url": f"{self.url}/datasets/{owner}/{slug}", "status": "ok"}

    def _add_dataset_version(self, ds: _Dataset, blobs: list[_Blob], notes: str) -> None:
        number = len(ds.versions) + 1
        folder = self.state_dir / "datasets" / ds.owner / ds.slug / f"v{number}"
        folder.mkdir(parents=True, exist_ok=True)
        for blob in blobs:
            shutil.copyfile(blob.path, folder / blob.name)
        ds.versions.append(_DatasetVersion(number, folder, notes, time.monotonic() + self.dataset_ready_s))

    def _dataset_version_status(self, ds: _Dataset, v: _DatasetVersion) -> str:
        behaviour = self._dataset_behaviour.get((ds.owner, ds.slug))
        if v.status == "BLOBS_RECEIVED" and behaviour is None and time.monotonic() >= v.ready_at:
            v.status = "READY"
        elif v.status == "BLOBS_RECEIVED" and behaviour == "failed":
            v.status = "FAILED"
        return v.status

    def _visible_dataset(self, user: EmulatedAccount, owner: str, slug: str) -> _Dataset:
        ds = self._datasets.get((owner, slug))
        if ds is None:
            raise _HttpError(404, f"Dataset {owner}/{slug} not found")
        if ds.private and ds.owner != user.username:
            raise _HttpError(403, f"Permission 'datasets.get' was denied for {owner}/{slug}")
        return ds

    def _get_dataset_status(self, user: EmulatedAccount, body: dict) -> dict:
        with self._lock:
            ds = self._visible_dataset(user, body.get("ownerSlug") or "", body.get("datasetSlug") or "")
            return {"status": self._dataset_version_status(ds, ds.versions[-1])}

    def _get_dataset(self, user: EmulatedAccount, body: dict) -> dict:
        with self._lock:
            ds = self._visible_dataset(user, body.get("ownerSlug") or "", body.get("datasetSlug") or "")
            return {"ref": f"{ds.owner}/{ds.slug}", "title": ds.title, "isPrivate": ds.private,
                    "currentVersionNumber": ds.versions[-1].number, "ownerName": ds.owner,
                    "versions": [{"versionNumber": v.number, "versionNotes": v.notes,
                                  "status": self._dataset_version_status(ds, v)} for v in ds.versions]}

    # -- kernels --------------------------------------------------------------------------

    def _save_kernel(self, user: EmulatedAccount, body: dict) -> dict:
        owner, _, slug = str(body.get("slug") or "").rpartition("/")
        owner = owner or user.username
        if owner != user.username:
            raise _HttpError(403, "You may only push kernels you own")
        text = str(body.get("text") or "")
        error = self._push_refusal(user, body, slug, text)
        if error:
            return {"error": error}
        gpu = bool(body.get("enableGpu")) or body.get("machineShape") in GPU_SHAPES
        with self._lock:
            if gpu and self._active_gpu_sessions(user.username) >= self.max_gpu_sessions:
                return {"error": f"Maximum batch GPU session count of {self.max_gpu_sessions} reached."}
            if gpu and self._gpu_left(user) <= 0:
                # *(assumed)* wording: Kaggle's own message for this case is not documented.
                return {"error": "You have used up your weekly GPU quota; it refreshes at "
                                 f"{_timestamp(user.refresh_time)}."}
            mounts, bad_datasets, bad_kernels = self._plan_mounts(user, body)
            if self._drop_sources.get(user.username):
                self._drop_sources[user.username] -= 1
                mounts, _, bad_kernels = self._plan_mounts(user, {**body, "datasetDataSources": []})
                bad_datasets = list(body.get("datasetDataSources") or [])
            kernel = self._kernels.get((owner, slug))
            if kernel is None:
                kernel = _Kernel(next(self._ids), owner, slug, body.get("newTitle") or slug,
                                 bool(body.get("isPrivate", True)))
                self._kernels[(owner, slug)] = kernel
            number = len(kernel.versions) + 1
            timeout = min(float(body.get("sessionTimeoutSeconds") or KAGGLE_SESSION_LIMIT_S), KAGGLE_SESSION_LIMIT_S)
            sid = next(self._ids)
            session = _Session(sid, owner, slug, number, gpu, timeout, self.state_dir / "sessions" / str(sid),
                               mounts, time.monotonic())
            kernel.versions.append(_KernelVersion(number, text, dict(body), session))
            self._sessions[sid] = session
        reply = {"ref": f"/code/{owner}/{slug}", "url": f"{self.url}/code/{owner}/{slug}",
                 "versionNumber": number, "kernelId": kernel.id}
        # Like Kaggle, unknown sources do not stop the push: they are reported and left out.
        if bad_datasets:
            reply["invalidDatasetSources"] = bad_datasets
        if bad_kernels:
            reply["invalidKernelSources"] = bad_kernels
        return reply

    def _push_refusal(self, user: EmulatedAccount, body: dict, slug: str, text: str) -> str:
        with self._lock:
            forced = self._push_errors.get(user.username)
            if forced:
                return forced.pop(0)
        if len(slug) < 5:
            return "The kernel slug must be at least 5 characters."
        if len(text.encode("utf-8")) > NOTEBOOK_LIMIT_BYTES:
            return "The notebook is larger than 1 MB."
        if body.get("language") != "python" or body.get("kernelType") != "notebook":
            return "The emulator runs Python notebooks only."
        try:
            json.loads(text)
        except ValueError:
            return "The notebook text is not valid JSON."
        shape = body.get("machineShape")
        if shape and shape not in GPU_SHAPES and not shape.startswith("Tpu"):
            return f"Unknown machine shape {shape}."
        return ""

    def _active_gpu_sessions(self, username: str) -> int:
        return sum(1 for s in self._sessions.values() if s.owner == username and s.gpu and s.status in ACTIVE)

    def _plan_mounts(self, user: EmulatedAccount, body: dict) -> tuple[list, list, list]:
        mounts: list[tuple[Path, Path]] = []
        bad_datasets, bad_kernels = [], []
        for field_name, kind, find, bad in (("datasetDataSources", "datasets", self._dataset_source, bad_datasets),
                                            ("kernelDataSources", "notebooks", self._kernel_source, bad_kernels)):
            for ref in body.get(field_name) or []:
                source = find(user, ref)
                if source is None:
                    bad.append(ref)
                else:
                    owner, slug = ref.split("/")[:2]
                    mounts.append((source, self._input_path(kind, owner, slug)))
        return mounts, bad_datasets, bad_kernels

    def _input_path(self, kind: str, owner: str, slug: str) -> Path:
        return Path(kind, owner, slug) if self.input_layout == "new" else Path(slug)

    def _dataset_source(self, user: EmulatedAccount, ref: str) -> Path | None:
        """The folder of the newest READY version (or the given one) the user may read."""
        parts = ref.split("/")
        ds = self._datasets.get(tuple(parts[:2])) if len(parts) in (2, 3) else None
        if ds is None or (ds.private and ds.owner != user.username):
            return None
        wanted = [v for v in ds.versions if len(parts) == 2 or str(v.number) == parts[2]]
        ready = [v for v in wanted if self._dataset_version_status(ds, v) == "READY"]
        return ready[-1].folder if ready else None

    def _kernel_source(self, user: EmulatedAccount, ref: str) -> Path | None:
        """The output of the kernel's newest COMPLETE session *(assumed: Kaggle mounts the latest
        successful version's output)*."""
        kernel = self._kernels.get(tuple(ref.split("/")[:2]))
        if kernel is None or (kernel.private and kernel.owner != user.username):
            return None
        done = [v for v in kernel.versions if v.session.status == "COMPLETE"]
        return done[-1].session.working if done else None

    def _kernel_version(self, owner: str, slug: str, version: int | str | None) -> _KernelVersion:
        kernel = self._kernels.get((owner, slug))
        if kernel is None or not kernel.versions:
            raise KeyError(f"no kernel {owner}/{slug}")
        if version in (None, ""):
            return kernel.versions[-1]
        number = int(str(version).lstrip("v"))
        for kv in kernel.versions:
            if kv.number == number:
                return kv
        raise KeyError(f"no version {number} of {owner}/{slug}")

    def _visible_session(self, user: EmulatedAccount, body: dict) -> _Session:
        owner, slug = body.get("userName") or user.username, body.get("kernelSlug") or ""
        kernel = self._kernels.get((owner, slug))
        # Kaggle answers 403 for a kernel that is missing as for one that is private.
        if kernel is None or (kernel.private and owner != user.username):
            raise _HttpError(403, "Permission 'kernels.get' was denied")
        try:
            return self._kernel_version(owner, slug, body.get("versionLabel")).session
        except (KeyError, ValueError):
            raise _HttpError(404, "Kernel version not found") from None

    def _get_session_status(self, user: EmulatedAccount, body: dict) -> dict:
        with self._lock:
            s = self._visible_session(user, body)
            reply = {"status": s.status}
            if s.failure:
                reply["failureMessage"] = s.failure
            return reply

    def _list_session_output(self, user: EmulatedAccount, body: dict) -> dict:
        size = int(body.get("pageSize") or 20)
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise _HttpError(400, f"pageSize must be between 1 and {MAX_PAGE_SIZE}")
        token = body.get("pageToken") or "0"
        if not token.isdigit():
            raise _HttpError(400, "Invalid pageToken")
        with self._lock:
            s = self._visible_session(user, body)
            # *(assumed)* Files appear once the session has ended; the log grows while it runs.
            names = _list_files(s.working) if s.status in TERMINAL else []
            log = json.dumps(s.log) if s.log else ""
        start = int(token)
        page = names[start:start + size]
        now = time.monotonic()
        files = []
        with self._lock:
            self._signed = {t: v for t, v in self._signed.items() if v[2] > now}
            for name in page:
                signed = secrets.token_urlsafe(24)
                self._signed[signed] = (s.working / name, name, now + SIGNED_URL_TTL_S)
                files.append({"url": f"{self.url}/download/{signed}", "fileName": name})
        reply: dict[str, Any] = {"files": files}
        if log:
            reply["log"] = log
        if start + size < len(names):
            reply["nextPageToken"] = str(start + size)
        return reply

    def _cancel_session(self, user: EmulatedAccount, body: dict) -> dict:
        with self._lock:
            s = self._sessions.get(int(body.get("kernelSessionId") or 0))
            if s is None or s.owner != user.username:
                return {"errorMessage": "Kernel session not found"}
            if s.status in ACTIVE:
                s.status = "CANCEL_REQUESTED"
                self._stop_session(s, "cancel")
        return {}

    def _introspect_token(self, user: EmulatedAccount | None, body: dict) -> dict:
        token = str(body.get("token") or "")
        with self._lock:
            for a in self._accounts.values():
                if a.token and token and secrets.compare_digest(a.token, token):
                    return {"active": True, "username": a.username}
        return {"active": False}

    def download(self, signed: str) -> tuple[int, Path | None]:
        """A signed-URL GET: (HTTP status, the file to send when 200)."""
        fault = self._take_fault("download")
        with self._lock:
            item = self._signed.get(signed)
        entry = {"service": "storage", "method": "download", "user": None,
                 "body": {"fileName": item[1] if item else None}}
        if fault is not None:
            status, file = fault.status, None
            entry["fault"] = True
        elif item is None or item[2] < time.monotonic() or not item[0].is_file():
            status, file = 404, None
        else:
            status, file = 200, item[0]
        entry["status"] = status
        self._record(entry)
        return status, file

    # -- sessions: start, watch, stop ------------------------------------------------------

    def _supervise(self) -> None:
        """One thread runs every session: starts due ones, charges quota, enforces limits."""
        last = time.monotonic()
        while not self._stopping.wait(self.tick_s):
            now = time.monotonic()
            dt, last = now - last, now
            for s in self._due_sessions(now):
                self._launch(s)
            with self._lock:
                self._refresh_quotas()
                self._charge_and_limit(dt, now)
                self._reap(now)

    def _due_sessions(self, now: float) -> list[_Session]:
        with self._lock:
            due = [s for s in self._sessions.values() if s.status == "QUEUED" and now - s.queued_at >= self.queue_s]
            for s in due:
                account = self._accounts[s.owner]
                if s.gpu and self._gpu_left(account) <= 0:
                    self._finish(s, "ERROR", "The account's GPU quota ran out before the session started.")
            due = [s for s in due if s.status == "QUEUED"]
            for s in due:
                s.launching = True
            return due

    def _launch(self, s: _Session) -> None:
        """Builds the sandbox and starts papermill (outside the lock: copying takes time)."""
        try:
            for sub in ("input", "working", "tmp"):
                (s.root / sub).mkdir(parents=True, exist_ok=True)
            for source, where in s.mounts:
                shutil.copytree(source, s.root / "input" / where, dirs_exist_ok=True)
            with self._lock:
                text = self._kernels[(s.owner, s.slug)].versions[s.version - 1].text
            notebook = s.folder / "notebook.ipynb"
            notebook.write_text(text, encoding="utf-8")
            cmd = [sys.executable, "-m", "papermill", str(notebook), str(s.folder / "executed.ipynb"),
                   "--cwd", str(s.working), "-k", self.kernel_name, "--log-output", "--no-progress-bar"]
            proc = subprocess.Popen(cmd, cwd=s.working, env=self._session_env(s), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=hasattr(os, "setsid"))
        except (OSError, KeyError) as e:
            with self._lock:
                s.launching = False
                self._finish(s, "ERROR", f"The emulator could not start the session: {e}")
            return
        with self._lock:
            s.proc, s.started_at, s.launching = proc, time.monotonic(), False
            if s.status == "QUEUED":
                s.status = "RUNNING"
            if s.stop_reason is not None:  # cancelled while the sandbox was being built
                self._stop_session(s, s.stop_reason)
        threading.Thread(target=self._read_log, args=(s, proc), name=f"kaggle-emulator-log-{s.id}",
                         daemon=True).start()

    def _session_env(self, s: _Session) -> dict[str, str]:
        """The notebook's environment: the fake /kaggle, no GPU, and none of this machine's
        credentials or Python path (a bare Kaggle image has neither)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KAGGLE_", "LAB_")) and k not in ("PYTHONPATH",)}
        env.update(LAB_KAGGLE_ROOT=str(s.root), KAGGLE_KERNEL_RUN_TYPE="Batch", CUDA_VISIBLE_DEVICES="",
                   PYTHONUNBUFFERED="1", TMPDIR=str(s.root / "tmp"))
        return env

    def _read_log(self, s: _Session, proc: subprocess.Popen) -> None:
        """Collects papermill's output as Kaggle-style log entries *(assumed format:
        [{"stream_name", "time", "data"}])*; ends when the process closes its output."""
        started = time.monotonic()
        try:
            with open(s.folder / "log.txt", "wb") as raw:
                for line in iter(proc.stdout.readline, b""):
                    raw.write(line)
                    raw.flush()
                    with self._lock:
                        s.log.append({"stream_name": "stdout", "time": round(time.monotonic() - started, 3),
                                      "data": line.decode("utf-8", "replace")})
        except (OSError, ValueError):
            pass
        finally:
            s.log_done.set()

    def _refresh_quotas(self) -> None:
        now = _utcnow()
        for a in self._accounts.values():
            if now >= a.refresh_time:
                a.gpu_used_s = 0.0
                while a.refresh_time <= now:
                    a.refresh_time += timedelta(days=7)

    def _charge_and_limit(self, dt: float, now: float) -> None:
        for s in self._sessions.values():
            if s.status not in ("RUNNING", "CANCEL_REQUESTED") or s.started_at is None or s.exited_at:
                continue
            account = self._accounts[s.owner]
            if s.gpu:
                account.gpu_used_s += dt * self.time_scale
            if s.stop_reason is None and (now - s.started_at) * self.time_scale >= s.timeout_s:
                self._stop_session(s, "timeout")
            elif s.stop_reason is None and s.gpu and account.gpu_used_s >= account.gpu_total_s:
                self._stop_session(s, "quota")

    def _stop_session(self, s: _Session, reason: str) -> None:
        """SIGTERM to what runs the notebook (the kernel and its children), as Kaggle stops a
        session; the SIGKILL follows in `_reap` after the grace period."""
        if s.stop_reason is None or s.stop_reason == reason:
            s.stop_reason = reason
        if s.proc is None:
            if not s.launching:  # never started: it just ends; `_launch` handles the other case
                self._finish(s, *self._ending(s, None))
            return
        if s.term_sent_at is None:
            s.term_sent_at = time.monotonic()
            targets = descendants(s.proc.pid) or [s.proc.pid]
            for pid in targets:
                signal_quietly(pid, signal.SIGTERM)

    def _reap(self, now: float) -> None:
        for s in self._sessions.values():
            if s.proc is None or s.status in TERMINAL:
                continue
            rc = s.proc.poll()
            if rc is None:
                if s.term_sent_at is not None and now - s.term_sent_at > self.grace_s:
                    _kill_tree(s.proc, getattr(signal, "SIGKILL", signal.SIGTERM))
                continue
            if s.exited_at is None:
                s.exited_at = now
            # Wait briefly for the last lines of the log before the session reads as ended.
            if s.log_done.is_set() or now - s.exited_at > 3.0:
                self._finish(s, *self._ending(s, rc))

    def _ending(self, s: _Session, rc: int | None) -> tuple[str, str]:
        if s.stop_reason == "cancel":
            return "CANCEL_ACKNOWLEDGED", ""
        if s.stop_reason == "timeout":
            return "ERROR", f"The session reached its time limit of {int(s.timeout_s)} seconds and was stopped."
        if s.stop_reason == "quota":
            return "ERROR", "The account's weekly GPU quota ran out and the session was stopped."
        if s.stop_reason == "shutdown":
            return "ERROR", "The emulator shut down."
        if rc == 0:
            return "COMPLETE", ""
        return "ERROR", f"The notebook failed (papermill exit code {rc}); see the log."

    def _finish(self, s: _Session, status: str, failure: str) -> None:
        s.status, s.failure = status, failure
        if s.proc is not None and s.proc.stdout is not None and s.log_done.is_set():
            s.proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# Processes and files


def _kill_tree(proc: subprocess.Popen, sig: int) -> None:
    for pid in descendants(proc.pid):
        signal_quietly(pid, sig)
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    else:
        proc.kill()


def _list_files(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _read_chunks(body: BinaryIO, length: int | None, chunked: bool):
    """Yields a request body: Content-Length bytes, or a chunked transfer; stops at a short read."""
    if chunked:
        for _ in range(10_000_000):
            line = body.readline(1024)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                body.readline(1024)
                return
            yield from _read_exactly(body, size)
            body.readline(16)
        return
    yield from _read_exactly(body, length or 0)


def _read_exactly(body: BinaryIO, left: int):
    """Up to `left` bytes in chunks; stops early if the peer closes."""
    while left > 0:
        data = body.read(min(left, _CHUNK))
        if not data:
            return
        left -= len(data)
        yield data


def _drain(body: BinaryIO, length: int | None, chunked: bool) -> None:
    for _ in _read_chunks(body, length, chunked):
        pass


def _write_at(path: Path, start: int, body: BinaryIO, length: int | None, chunked: bool) -> int:
    """Writes the body at `start` (dropping anything after it); returns the bytes received,
    which may be fewer than sent when the connection breaks: a resume picks up from there."""
    written = 0
    with open(path, "r+b") as f:
        f.truncate(start)
        f.seek(start)
        try:
            for data in _read_chunks(body, length, chunked):
                f.write(data)
                written += len(data)
        except (OSError, ValueError):
            pass
    return written


# ---------------------------------------------------------------------------------------------
# HTTP


_RPCS: dict[tuple[str, str], Callable[..., dict]] = {
    ("kernels.KernelsApiService", "SaveKernel"): KaggleEmulator._save_kernel,
    ("kernels.KernelsApiService", "GetKernelSessionStatus"): KaggleEmulator._get_session_status,
    ("kernels.KernelsApiService", "ListKernelSessionOutput"): KaggleEmulator._list_session_output,
    ("kernels.KernelsApiService", "GetAcceleratorQuotaStatistics"): KaggleEmulator._get_quota,
    ("kernels.KernelsApiService", "CancelKernelSession"): KaggleEmulator._cancel_session,
    ("blobs.BlobApiService", "StartBlobUpload"): KaggleEmulator._start_blob_upload,
    ("datasets.DatasetApiService", "CreateDataset"): KaggleEmulator._create_dataset,
    ("datasets.DatasetApiService", "CreateDatasetVersion"): KaggleEmulator._create_dataset_version,
    ("datasets.DatasetApiService", "GetDatasetStatus"): KaggleEmulator._get_dataset_status,
    ("datasets.DatasetApiService", "GetDataset"): KaggleEmulator._get_dataset,
    ("security.OAuthService", "IntrospectToken"): KaggleEmulator._introspect_token,
}

_RPC_PATH = re.compile(r"/(?:api/)?v1/([A-Za-z0-9_.]+)/([A-Za-z0-9_]+)")


class _Handler(BaseHTTPRequestHandler):
    server_version = "KaggleEmulator/1"

    @property
    def emulator(self) -> KaggleEmulator:
        return self.server.emulator  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # Quiet: tests read `recorded()`; the request line holds nothing worth printing.

    def _path(self) -> str:
        # Through HTTP_PROXY the request line carries the whole URL (KAGGLE_API_ENVIRONMENT=LOCALHOST).
        return urlsplit(self.path).path

    def _send(self, status: int, payload: bytes, content_type: str = "application/json",
              headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        self._send(status, json.dumps(body).encode(), headers=headers)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        match = _RPC_PATH.fullmatch(self._path())
        length = int(self.headers.get("Content-Length") or 0)
        if match is None or length > MAX_RPC_BODY_BYTES:
            _drain(self.rfile, min(length, MAX_RPC_BODY_BYTES), False)
            code = 404 if match is None else 413
            self._send_json(code, {"code": code, "message": "Not found" if code == 404 else "Body too large"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            self._send_json(400, {"code": 400, "message": "The body is not a JSON object"})
            return
        status, reply, headers = self.emulator.rpc(match.group(1), match.group(2),
                                                   self.headers.get("Authorization"), body)
        self._send_json(status, reply, headers)

    def do_PUT(self) -> None:  # noqa: N802
        match = re.fullmatch(r"/upload/([0-9a-f]+)", self._path())
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        length = None if chunked else int(self.headers.get("Content-Length") or 0)
        if match is None:
            _drain(self.rfile, length, chunked)
            self._send_json(404, {"code": 404, "message": "Not found"})
            return
        status, headers = self.emulator.upload(match.group(1), self.headers.get("Content-Range"),
                                               self.rfile, length, chunked)
        self._send(status, b"", "text/plain", headers)

    def do_GET(self) -> None:  # noqa: N802
        path = self._path()
        if path in ("/", "/health"):
            self._send(200, b"kaggle emulator\n", "text/plain")
            return
        match = re.fullmatch(r"/download/([A-Za-z0-9_-]+)", path)
        status, file = self.emulator.download(match.group(1)) if match else (404, None)
        if file is None:
            self._send(status, b"Not available\n", "text/plain")
            return
        size = file.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.send_header("Last-Modified", email.utils.formatdate(file.stat().st_mtime, usegmt=True))
        self.end_headers()
        with open(file, "rb") as f:
            shutil.copyfileobj(f, self.wfile, _CHUNK)


# ---------------------------------------------------------------------------------------------
# Command line


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _parse_account(spec: str, token: bool) -> EmulatedAccount:
    name, _, secret = spec.partition(":")
    secret = secret or (secrets.token_urlsafe(24) if token else secrets.token_hex(16))
    return EmulatedAccount(name, token=secret) if token else EmulatedAccount(name, key=secret)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.kaggle_emulator",
                                description="A local Kaggle API for trying the lab kit without Kaggle.")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--state", required=True, help="folder for uploads, datasets, sessions and credentials")
    p.add_argument("--account", action="append", default=[], metavar="NAME[:KEY]",
                   help="a username/key account (a random key if none is given); repeatable")
    p.add_argument("--token-account", action="append", default=[], metavar="NAME[:TOKEN]",
                   help="an access-token account; repeatable")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulated seconds per wall second")
    p.add_argument("--quota-hours", type=float, default=30.0, help="weekly GPU quota of each account")
    p.add_argument("--dataset-ready-s", type=float, default=2.0)
    p.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL, wall seconds")
    p.add_argument("--old-input-layout", action="store_true", help="mount inputs at input/<slug>")
    args = p.parse_args(argv)
    accounts = [_parse_account(s, False) for s in args.account] + [_parse_account(s, True) for s in args.token_account]
    if not accounts:
        accounts = [_parse_account("lab-user", False)]
    for a in accounts:
        a.gpu_total_s = args.quota_hours * 3600
    state = Path(args.state).resolve()
    emu = KaggleEmulator(state, accounts=accounts, time_scale=args.time_scale, dataset_ready_s=args.dataset_ready_s,
                         grace_s=args.grace_s, input_layout="old" if args.old_input_layout else "new",
                         host=args.host, port=args.port)
    emu.start()
    print(f"Kaggle emulator at {emu.url} (state in {state})", flush=True)
    print(f"  export LAB_KAGGLE_API_URL={emu.url}")
    for a in accounts:
        folder = state / "credentials" / a.username
        if a.token:
            _write_private(folder / "access_token", a.token + "\n")
            print(f"  lab accounts add {a.username} --token-file {folder / 'access_token'}")
        else:
            _write_private(folder / "kaggle.json", json.dumps({"username": a.username, "key": a.key}))
            print(f"  lab accounts add {a.username} --kaggle-json {folder / 'kaggle.json'}")
    print("Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
