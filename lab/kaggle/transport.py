"""The real `kaggle` client, one object per account: its own address, credentials and a
timeout on every HTTP request (kagglesdk sends without one), and blob uploads with a timeout.

`kaggle` is imported lazily: importing it builds a global client and authenticates.
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import re
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from lab.config import UserError
from lab.kaggle.accounts import Account, secrets_of
from lab.kaggle.retries import TRANSIENT_STATUS

_API_LOCK = threading.Lock()
_API_CLASS: Any = None
_APIS: dict[tuple, Any] = {}


MIN_KAGGLE = (2, 2, 5)  # older clients lack the quota and session-status calls the kit uses


def check_kaggle_version(found: str) -> None:
    """Refuses a `kaggle` client older than 2.2.5, saying how to upgrade."""
    parts = tuple(int(x) for x in re.findall(r"\d+", found)[:3])
    if parts < MIN_KAGGLE:
        raise UserError(f"The installed kaggle client is {found}; the lab kit needs kaggle>=2.2.5 (older clients "
                        "lack the GPU-quota and session-status calls it uses). Upgrade: pip install -U 'kaggle>=2.2.5'")


def lab_api_class() -> Any:
    """KaggleApi, taught to use a given address, a timeout and only its own credentials."""
    global _API_CLASS
    with _API_LOCK:
        if _API_CLASS is None:
            try:
                check_kaggle_version(version("kaggle"))
            except PackageNotFoundError:
                raise UserError("The kaggle client is not installed: pip install 'kaggle>=2.2.5' six") from None
            _API_CLASS = _define_lab_api()
        return _API_CLASS


def _make_config_dir() -> None:
    """The folder `kaggle` makes at import time, made here first: its own `os.makedirs` has no
    exist_ok, so two drivers importing it at once fail in one of them (a FileExistsError, then
    an ImportError of the half-imported module). Found as `kaggle` 2.2.5 finds it."""
    folder = os.environ.get("KAGGLE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".kaggle")
    if not os.environ.get("KAGGLE_CONFIG_DIR") and sys.platform.startswith("linux") and not os.path.exists(folder):
        folder = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"),
                              "kaggle")
    os.makedirs(folder, exist_ok=True)


LOG_STREAM_PATH = "/kernels/logs/stream/"
LOG_READ_TIMEOUT_S = 900.0  # a running session's log may stay silent this long (compiling, mounting, a long eval)


class TimeoutAdapter(HTTPAdapter):
    """kagglesdk sends without a timeout; this gives every request on the session one. A
    session's log stream is silent while the session prints nothing (a compile, a mount) and
    whether Kaggle sends keep-alives meanwhile is not known: its reads wait LOG_READ_TIMEOUT_S,
    so a quiet stretch does not end the stream (each new connection replays the log from its
    first line)."""

    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s
        super().__init__()

    def send(self, request, stream=False, timeout=None, **kwargs):  # type: ignore[override]
        if timeout is None:
            timeout = self._timeout_s
            if stream and LOG_STREAM_PATH in (request.url or ""):
                timeout = (self._timeout_s, max(LOG_READ_TIMEOUT_S, self._timeout_s))  # (connect, read)
        return super().send(request, stream=stream, timeout=timeout, **kwargs)


def _quiet_kaggle_api() -> Any:
    """`kaggle`'s KaggleApi class. `import kaggle` authenticates a global client at import time
    and prints help text when this machine has no credentials of its own: kept off the screen."""
    _make_config_dir()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # `import kaggle` authenticates a global client: only where a call is made, and quietly
        from kaggle.api.kaggle_api_extended import KaggleApi
    return KaggleApi


def _signed_client(username: str, key: str | None, token: str | None, base_url: str, timeout_s: float,
                   response_processor: Any) -> Any:
    """A KaggleClient for one account: its own address, only its own credentials, a timeout."""
    # kagglesdk and requests: only where Kaggle is called (the calculator and the form never are)
    from kagglesdk import KaggleClient, KaggleEnv
    from kagglesdk.kaggle_http_client import KaggleHttpClient
    client = KaggleClient(env=KaggleEnv.PROD, username=username, password=key, api_token=token,
                          response_processor=response_processor)
    http = client._http_client
    if not all(hasattr(http, a) for a in ("_endpoint", "_signed_in", "_init_session")):
        raise RuntimeError("The installed kagglesdk changed its HTTP client; the lab kit knows 0.1.x.")
    # The address per object, not in kagglesdk's global endpoint table.
    http._endpoint = base_url
    # Marking the client signed in skips its own credential search, where a global
    # token would win over this account's key; the credentials are set just below.
    http._signed_in = True
    http._init_session()
    session = http._session
    session.auth = KaggleHttpClient.BearerAuth(token) if token else (username, key)
    adapter = TimeoutAdapter(timeout_s)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return client


def _define_lab_api() -> Any:
    """KaggleApi for one account: its own credentials, address and timeout, and none of the
    client's own retries or untimed uploads."""
    KaggleApi = _quiet_kaggle_api()

    class LabKaggleApi(KaggleApi):
        def __init__(self, username: str | None, key: str | None, token: str | None, base_url: str,
                     timeout_s: float, pause_s: float = 1.0):
            # KaggleApi's config_values is one dict on the class, shared by every instance:
            # each account gets its own. authenticate() is never called: it would let
            # KAGGLE_USERNAME/KAGGLE_KEY and a global token override this account's credentials.
            self.config_values = {"username": username or ""}
            self.config_values["token" if token else "key"] = token or key or ""
            self._authenticated = True
            self._lab_base_url = base_url
            self._lab_timeout_s = timeout_s
            self._lab_pause_s = pause_s  # between resumes of an interrupted blob upload

        def __repr__(self) -> str:
            return f"<LabKaggleApi {self.config_values.get('username')!r} at {self._lab_base_url}>"

        def build_kaggle_client(self) -> Any:
            values = self.config_values
            return _signed_client(values.get("username"), values.get("key"), values.get("token") or None,
                                  self._lab_base_url, self._lab_timeout_s, self.get_response_processor())

        def with_retry(self, func, *args, **kwargs):  # type: ignore[override]
            # Retries are the AccountClient's: one policy, with jitter and bounded waits, rather
            # than the client's own (no jitter, up to 10 tries) multiplied by ours.
            return func

        def upload_complete(self, path, url, quiet, resume=False):  # type: ignore[override]
            # The client's own PUT has no timeout.
            return put_blob(path, url, resume, self._lab_timeout_s, self._lab_pause_s)

    return LabKaggleApi


def api_for(account: Account, base_url: str, timeout_s: float, pause_s: float = 1.0) -> Any:
    creds = account.folder / ("access_token" if (account.folder / "access_token").is_file() else "kaggle.json")
    st = creds.stat() if creds.exists() else None
    # A replaced credentials file (another inode or mtime) makes a new object: an account removed
    # and added again never signs in with its old key.
    cache_key = (str(account.folder), base_url, timeout_s, pause_s, (st.st_ino, st.st_mtime_ns) if st else None)
    api_class = lab_api_class()
    with _API_LOCK:  # KaggleApi's constructor makes folders and imports lazily: one at a time
        api = _APIS.get(cache_key)
        if api is None:
            key, token = secrets_of(account)
            api = _APIS.setdefault(cache_key, api_class(account.username, key, token, base_url, timeout_s, pause_s))
    return api


def put_blob(path: str, url: str, resume: bool, timeout_s: float, pause_s: float = 1.0) -> int:
    """One raw-bytes upload to a createUrl, resumable as the real client does it (Content-Range),
    but with a timeout. Returns a kaggle `ResumableUploadResult` code."""
    from kaggle.models.kaggle_models_extended import ResumableUploadResult as R  # kaggle: where an upload runs

    size = os.path.getsize(path)
    start = 0
    try:
        if resume:
            r = requests.put(url, data=b"", headers={"Content-Range": f"bytes */{size}"}, timeout=timeout_s)
            if r.status_code in (200, 201):
                return R.COMPLETE
            if r.status_code == 404:
                return R.EXPIRED
            if r.status_code != 308:
                return _paused(R.INCOMPLETE, pause_s) if r.status_code in TRANSIENT_STATUS else R.FAILED
            got = re.fullmatch(r"bytes=0-(\d+)", r.headers.get("Range", ""))
            start = int(got.group(1)) + 1 if got else 0
            if start >= size > 0:
                return _paused(R.INCOMPLETE, pause_s)
        with open(path, "rb") as f:
            f.seek(start)
            headers = {"Content-Range": f"bytes {start}-{size - 1}/{size}"} if start else {}
            r = requests.put(url, data=f, headers=headers, timeout=timeout_s)
    except requests.RequestException:
        return _paused(R.INCOMPLETE, pause_s)
    if r.status_code in (200, 201):
        return R.COMPLETE
    if r.status_code == 308 or r.status_code in TRANSIENT_STATUS:
        return _paused(R.INCOMPLETE, pause_s)
    return R.FAILED


def _paused(result: int, pause_s: float) -> int:
    time.sleep(pause_s * (0.5 + random.random() / 2))
    return result

