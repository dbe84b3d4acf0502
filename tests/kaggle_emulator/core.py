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
`scripts/kaggle-emulator --port 8765 --state DIR --account alice`.
"""
from __future__ import annotations

import base64
import itertools
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from kaggle_emulator.datasets import DATASET_BEHAVIOURS, Datasets
from kaggle_emulator.kernels import Kernels
from kaggle_emulator.logs import Logs
from kaggle_emulator.overnight import Overnight
from kaggle_emulator.pages import Pages
from kaggle_emulator.quirks import Quirks
from kaggle_emulator.files import _kill_tree
from kaggle_emulator.model import (ACTIVE, TERMINAL, EmulatedAccount, SessionInfo, _Blob, _Dataset, _Fault,
                                   _HttpError, _Kernel, _KillPlan, _Session, _duration, _timestamp)
from kaggle_emulator.server import _Handler
from kaggle_emulator.sessions import Sessions


class KaggleEmulator(Datasets, Kernels, Sessions, Logs, Pages, Overnight, Quirks):
    """The emulated Kaggle: `start()`, `url`, `stop()`; a context manager.

    time_scale: emulated seconds per wall second (quota use, session timeouts, and the pushed
        notebook's own limits, which the emulator rewrites: the kit sends real minutes).
    min_step_s: a training step takes at least this many wall seconds (an emulated card of a
        fixed speed), so how far a session gets within its limit does not depend on the machine.
    dataset_ready_s: wall seconds a new dataset version takes to become READY.
    queue_s: wall seconds a pushed session waits in QUEUED before it starts.
    grace_s: wall seconds between SIGTERM and SIGKILL when a session is stopped.
    missing_status: what a dataset that is not there answers: 404, or 403 PERMISSION_DENIED as
        Kaggle may *(assumed)*; `dataset_visible_s`: a new dataset answers so for that many wall
        seconds after it was created.
    mount_lag_s: a READY version is mounted only this many wall seconds after READY; a session
        pushed sooner sees the version before, or nothing *(assumed)*.
    timeout_kill: "sigterm": at the session timeout SIGTERM, then SIGKILL after `grace_s`;
        "lost": SIGKILL at once and the outputs are lost *(assumed: Kaggle documents neither)*.
    timeout_status: what a session ends in at its timeout, with no reason given: "CANCEL_ACKNOWLEDGED"
        (two projects' notes on Kaggle's runtime cut-off) or "ERROR".
    enforce_timeout: False plays a session Kaggle never ends (it reads RUNNING forever).
    quota_at_push: False accepts a push with no quota left and refuses the session at its start.
    input_layout: "new" mounts inputs at input/datasets/<owner>/<slug> and
        input/notebooks/<owner>/<slug>; "old" at input/<slug>.

    The quirks a second reading of other sources found (a busy spell, empty drafts after a refusal,
    401 for a missing kernel, sessions past their quota, ...) are switched on one by one:
    kaggle_emulator.quirks; those of a third (a session Kaggle loses, error pages, a push answered
    with an error, a dataset's second version refused, a new image): kaggle_emulator.overnight.
    """

    def __init__(self, state_dir: str | Path | None = None, *, accounts: list[EmulatedAccount] = (),
                 time_scale: float = 1.0, dataset_ready_s: float = 1.0, queue_s: float = 0.2,
                 grace_s: float = 10.0, max_gpu_sessions: int = 2, input_layout: str = "new",
                 missing_status: int = 404, dataset_visible_s: float = 0.0, mount_lag_s: float = 0.0,
                 timeout_kill: str = "sigterm", timeout_status: str = "CANCEL_ACKNOWLEDGED",
                 enforce_timeout: bool = True, quota_at_push: bool = True, private_storage_bytes: float | None = None,
                 kernel_name: str = "python3", tick_s: float = 0.05, min_step_s: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0):
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
        self.missing_status = int(missing_status)
        self.dataset_visible_s = float(dataset_visible_s)
        self.mount_lag_s = float(mount_lag_s)
        if timeout_kill not in ("sigterm", "lost"):
            raise ValueError("timeout_kill must be 'sigterm' or 'lost'")
        self.timeout_kill = timeout_kill
        if timeout_status not in ("CANCEL_ACKNOWLEDGED", "ERROR"):
            raise ValueError("timeout_status must be 'CANCEL_ACKNOWLEDGED' or 'ERROR'")
        self.timeout_status = timeout_status
        # Over this many bytes of private datasets (every version counted), an upload is taken and
        # then never shows *(reported: kaggle-cli#284)*; None: no limit.
        self.private_storage_bytes = private_storage_bytes
        self.enforce_timeout = bool(enforce_timeout)
        self.quota_at_push = bool(quota_at_push)
        self.kernel_name = kernel_name
        self.tick_s = float(tick_s)
        self.min_step_s = float(min_step_s)
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
        self._kill_plans: dict[str, list[_KillPlan]] = {}
        self._holds: dict[str, list[str]] = {}
        self._spells: dict[str, tuple] = {}  # busy spells: user -> (until, Retry-After s, methods, length)
        self._pages: dict[str, list] = {}  # error pages: user -> [[until, status, methods, answers left]]
        self._wedges: dict[str, list] = {}  # sessions Kaggle will lose: user -> [(after_s, once)]
        self._late: dict[str, float] = {}  # user -> seconds a pushed kernel stays unseen
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

    def kill_next_session(self, username: str, after_s: float | None = None, lose_outputs: bool = True, *,
                          once: str | None = None, status: str = "ERROR", listing_status: int | None = None) -> None:
        """Kaggle kills the account's next session `after_s` emulated seconds after it starts (or
        `once` its working folder holds a file matching that glob, e.g. its first checkpoint),
        without SIGTERM, and it ends in `status` (ERROR, or CANCEL_ACKNOWLEDGED as Kaggle's runtime
        cut-off does) with no reason; with `lose_outputs` it keeps none of its outputs and none of
        its log *(assumed: the unfriendly case)*, and its output listing answers `listing_status`
        (403, 404) or nothing; else what the notebook had saved stays."""
        if status not in ("ERROR", "CANCEL_ACKNOWLEDGED"):
            raise ValueError("status must be 'ERROR' or 'CANCEL_ACKNOWLEDGED'")
        if (after_s is None) == (once is None):
            raise ValueError("give after_s or once")
        with self._lock:
            self._kill_plans.setdefault(username, []).append(
                _KillPlan(None if after_s is None else float(after_s), bool(lose_outputs), status, listing_status, once))

    def hold_next_session(self, username: str, status: str = "NEW_SCRIPT") -> None:
        """The account's next session never starts: it reads `status` (QUEUED or NEW_SCRIPT) for ever."""
        if status not in ("QUEUED", "NEW_SCRIPT"):
            raise ValueError("status must be 'QUEUED' or 'NEW_SCRIPT'")
        with self._lock:
            self._holds.setdefault(username, []).append(status)

    def set_dataset_behaviour(self, owner: str, slug: str, behaviour: str | None) -> None:
        """"stuck": versions never become READY; "failed": they end FAILED; "deleted": they end
        DELETED; "reprocessing": they read REPROCESSING for a while, then READY; "drop-file": a new
        version keeps all but its largest file (an upload that failed without saying so); "mount-lag":
        a READY version is mounted only `mount_lag_s` (default 2 s) after READY; None: normal."""
        if behaviour not in DATASET_BEHAVIOURS:
            raise ValueError(f"behaviour must be one of {DATASET_BEHAVIOURS}")
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
        busy = self._busy_reply(user, method)
        if busy is not None:
            self._record({**entry, "status": 429, "busy": True})
            return busy
        page = self._page_reply(user, method)
        if page is not None:
            self._record({**entry, "status": page[0], "page": True})
            return page
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
        gpu = {"timeUsed": _duration(user.gpu_used_s), "timeReserved": _duration(self._reserved_s(user)),
               "totalTimeAllowed": _duration(user.gpu_total_s)}
        if user.has_ever_run:  # a protobuf field at its default (false) is left out of the JSON
            gpu["hasEverRun"] = True
        tpu = {"timeUsed": "0s", "timeReserved": "0s", "totalTimeAllowed": _duration(20 * 3600)}
        return {"quotaRefreshTime": _timestamp(user.refresh_time), "gpuQuota": gpu, "tpuQuota": tpu}

    def _gpu_left(self, user: EmulatedAccount) -> float:
        return user.gpu_total_s - user.gpu_used_s - user.gpu_reserved_s

    # -- blobs ----------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# HTTP


_RPCS: dict[tuple[str, str], Callable[..., dict]] = {
    ("kernels.KernelsApiService", "SaveKernel"): KaggleEmulator._save_kernel,
    ("kernels.KernelsApiService", "GetKernelSessionStatus"): KaggleEmulator._get_session_status,
    ("kernels.KernelsApiService", "ListKernelSessionOutput"): KaggleEmulator._list_session_output,
    ("kernels.KernelsApiService", "GetAcceleratorQuotaStatistics"): KaggleEmulator._get_quota,
    ("kernels.KernelsApiService", "CancelKernelSession"): KaggleEmulator._cancel_session,
    ("kernels.KernelsApiService", "ListKernels"): KaggleEmulator._list_kernels,
    ("kernels.KernelsApiService", "DeleteKernel"): KaggleEmulator._delete_kernel,
    ("kernels.KernelsApiService", "GetKernel"): KaggleEmulator._get_kernel,
    ("blobs.BlobApiService", "StartBlobUpload"): KaggleEmulator._start_blob_upload,
    ("datasets.DatasetApiService", "CreateDataset"): KaggleEmulator._create_dataset,
    ("datasets.DatasetApiService", "CreateDatasetVersion"): KaggleEmulator._create_dataset_version,
    ("datasets.DatasetApiService", "GetDatasetStatus"): KaggleEmulator._get_dataset_status,
    ("datasets.DatasetApiService", "GetDataset"): KaggleEmulator._get_dataset,
    ("datasets.DatasetApiService", "ListDatasets"): KaggleEmulator._list_datasets,
    ("datasets.DatasetApiService", "DeleteDataset"): KaggleEmulator._delete_dataset,
    ("datasets.DatasetApiService", "ListDatasetFiles"): KaggleEmulator._list_dataset_files,
    ("security.OAuthService", "IntrospectToken"): KaggleEmulator._introspect_token,
}
