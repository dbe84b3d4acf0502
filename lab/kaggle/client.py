"""One client per Kaggle account: thin, typed calls over the real `kaggle` client.

`client_for(name)` gives an `AccountClient`, one `KaggleApi` object per account in a process
(lab.kaggle.transport), each sending that account's own credentials. It knows nothing of runs.

What the real client does not do, this layer adds (see shared/kaggle-notes.md):
- a timeout on every HTTP call, and one retry policy (lab.kaggle.retries: backoff with jitter,
  honouring Retry-After) for timeouts, connection errors, 429 and 5xx. A push is repeated only
  when Kaggle surely did not act on it, so a lost reply never starts a second session;
- Kaggle's logical refusals (an `error` in a push reply, unknown sources, 4xx) become
  `KaggleError(account, what happened, what to do)`, with no secret inside, and their cause where
  one is known (a busy spell, the session cap, the quota, an empty draft left by a refusal);
- a push into an empty draft ("Notebook not found": a refusal left it) deletes it and pushes once more;
- a 401 for one kernel is judged by an account-level call: the kernel is not there when that works
  (kaggle-cli#951), and only otherwise are the credentials refused;
- a refusal to run where a global token would make every account act as one (lab.kaggle.accounts);
- the API's address as a setting, `LAB_KAGGLE_API_URL` (default Kaggle's), per client object.
"""
from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import requests

from lab.config import UserError
from lab.kaggle.accounts import (Account, add_account, check_no_global_token, get_account,  # noqa: F401 - re-exported
                                 global_token_problem, list_accounts, read_token_file,
                                 remove_account)
from lab.kaggle.datasets import DATASET_LICENCES, DatasetCalls  # noqa: F401 - re-exported
from lab.kaggle.replies import (DATASET_PAGE, DatasetInfo, PushResult, Quota, log_text, notebook_text,  # noqa: F401
                                quota_from)
from lab.kaggle.retries import (RetryPolicy, busy, is_transient, page_title, retry_after, status_of, surely_unprocessed,
                                unreadable, unwrap)
from lab.kaggle.transport import api_for, lab_api_class

DEFAULT_API_URL = "https://api.kaggle.com"
API_URL_ENV = "LAB_KAGGLE_API_URL"
NOTEBOOK_LIMIT_BYTES = 1_000_000  # Kaggle: "the pushed notebook must be under 1 MB"
T4X2 = "NvidiaTeslaT4"  # the machine shape that gives 2×T4; `enable_gpu` alone asks for retired P100s
IMAGE_PINNING = "latest"  # kernel-metadata.json `docker_image_pinning_type`: "original" or "latest"
_KERNEL_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{3,48}[a-z0-9]")  # at least 5 characters
SHELL_ANSWER = "Notebook not found"  # a push into the empty draft a refused push left (three reports)
ACTIVE_STATUS = ("QUEUED", "RUNNING", "CANCEL_REQUESTED")  # a session that holds one of the account's GPU slots
RECENT_RUN_S = 13 * 3600.0  # a kernel last run longer ago than a session lasts runs no session now

T = TypeVar("T")


class KaggleError(UserError):
    """Kaggle refused or failed something for one account: what happened and what to do.

    `status` is the HTTP status when there was one; `retryable` says whether trying again
    later may work; `push` is the PushResult when a push did start a session despite the error;
    `unsure` that a call which must not be repeated got no clear answer (check before redoing);
    `cause` why Kaggle refused, where that is known (CAUSES); `wait_s` how long Kaggle asked to
    wait (its Retry-After).
    """

    def __init__(self, account: str, what: str, todo: str, *, status: int | None = None,
                 retryable: bool = False, push: "PushResult | None" = None, unsure: bool = False,
                 cause: str | None = None, wait_s: float | None = None):
        self.account, self.what, self.todo = account, what.rstrip(". "), todo
        self.status, self.retryable, self.push = status, retryable, push
        self.unsure = unsure  # a call that must not be repeated got no answer: it may have been done
        self.cause, self.wait_s = cause, wait_s
        super().__init__(f"Kaggle account '{account}': {self.what}. {todo}")


# Why Kaggle refused, where its answer says: a busy spell (429 RESOURCE_EXHAUSTED, kaggle-cli#931),
# the account's GPU session cap, its weekly quota, an empty draft an earlier refusal left; or an
# answer it could not read (an HTML error page: a passing one); a dataset version refused while the one
# before still processes.
CAUSES = ("busy", "session-cap", "quota", "shell", "unreadable", "processing")


# ---------------------------------------------------------------------------------------------
# The real client, one object per account


def api_url() -> str:
    """The API's address: `LAB_KAGGLE_API_URL`, default Kaggle's. Plain http only to this computer
    (a local emulator or proxy): a leftover setting must never send a key in the clear."""
    url = os.environ.get(API_URL_ENV, "").strip() or DEFAULT_API_URL
    got = re.fullmatch(r"(https?)://(\[[0-9a-fA-F:.]+\]|[^\s/:\[\]]+)(:\d+)?(/\S*)?", url)
    if not got:
        raise UserError(f"{API_URL_ENV}={url!r} is not an http(s) URL.")
    if got.group(1) == "http" and not _loopback(got.group(2)):
        raise UserError(f"{API_URL_ENV}={url!r} would send the accounts' keys in the clear: plain http is "
                        "accepted only for this computer (127.0.0.1, ::1, localhost). Use https, or unset it.")
    return url.rstrip("/")


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# The per-account client


class AccountClient(DatasetCalls):
    """One account's calls to Kaggle (its datasets': lab.kaggle.datasets). Slugs are "slug" (this
    account's) or "owner/slug"."""

    def __init__(self, account: Account, api: Any, base_url: str, retry: RetryPolicy, timeout_s: float):
        self.account, self.base_url, self.retry, self.timeout_s = account, base_url, retry, timeout_s
        self._api = api

    def __repr__(self) -> str:
        return f"AccountClient({self.account.name!r}, user={self.account.username!r}, url={self.base_url!r})"

    @property
    def username(self) -> str:
        return self.account.username

    # -- plumbing -------------------------------------------------------------------------

    def _error(self, what: str, todo: str, **kw: Any) -> KaggleError:
        return KaggleError(self.account.name, self._scrub(what), self._scrub(todo), **kw)

    def _scrub(self, text: str) -> str:
        for name in ("key", "token"):
            secret = self._api.config_values.get(name)
            if secret:
                text = text.replace(secret, "***")
        return text

    def _call(self, what: str, fn: Callable[[], T], *, repeatable: bool = True, missing: tuple[int, ...] = (),
              own: bool = False, item: bool = False) -> T:
        """Runs one client call under the retry policy; failures become KaggleError. `missing`: HTTP
        statuses that mean "no such thing" (the call then returns None); `own`: the call is about the
        account's own kernel or dataset, so a 403 is no question of permission; `item`: it is about one
        kernel, where Kaggle may answer 401 for one that is not there (kaggle-cli#951)."""
        for attempt in range(1, max(1, self.retry.attempts) + 1):
            try:
                return fn()
            except Exception as raw:  # noqa: BLE001 - sorted below; anything unknown is re-raised
                exc = unwrap(raw)
                status = status_of(exc)
                if status == 401 and item and self._signs_in():
                    if 404 in missing:
                        return None  # type: ignore[return-value]
                    raise self._error(f"{what}: not there (Kaggle answered HTTP 401 for it, while the account's "
                                      "own calls succeed)", "Check the slug.", status=404) from None
                if status in missing:
                    return None  # type: ignore[return-value]
                if not is_transient(exc):
                    if status is not None:
                        raise self._refusal(what, exc, status, own) from None
                    if isinstance(exc, ValueError) and not unreadable(exc):
                        raise UserError(f"{what}: {self._scrub(str(exc))}") from None
                    raise
                if not repeatable and not surely_unprocessed(exc):
                    raise self._error(
                        f"{what} got no clear answer ({self._reason(exc)}); Kaggle may or may not have done it",
                        "Check (e.g. the kernel's status) before trying again, so it is not done twice.",
                        status=status, unsure=True) from None
                delay = self.retry.delay(attempt, retry_after(exc))
                if delay is None or attempt >= self.retry.attempts:
                    raise self._gave_up(what, exc, attempt) from None
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _gave_up(self, what: str, exc: BaseException, attempt: int) -> KaggleError:
        """The error once the tries are spent: a busy spell says so, with the wait Kaggle asked for."""
        status, wait = status_of(exc), retry_after(exc)
        if unreadable(exc):
            return self._error(f"{what}: Kaggle answered with {page_title(exc)} {attempt} times",
                               "Kaggle sends such pages while it is busy or down: the lab waits and asks again.",
                               retryable=True, cause="unreadable")
        if not busy(exc):
            return self._error(f"{what} failed {attempt} times ({self._reason(exc)})",
                               "Kaggle is busy or unreachable; try again in a few minutes.", status=status,
                               retryable=True)
        asked = f"; it asks to wait {wait:.0f} s" if wait is not None else ""
        return self._error(f"{what}: Kaggle is busy (HTTP {status}, RESOURCE_EXHAUSTED) after {attempt} tries{asked}",
                           "A busy spell may last half an hour (kaggle-cli#931): the lab waits and asks again.",
                           status=status, retryable=True, cause="busy", wait_s=wait)

    def _signs_in(self) -> bool:
        """Whether the account's credentials work, by an account-level call (its quota)."""
        try:
            self._call("checking the account's credentials", self._api.quota_view)
        except KaggleError as e:
            if e.status in (401, 403):
                return False
            raise
        return True

    def _reason(self, exc: BaseException) -> str:
        """A short cause: requests' own messages run to several lines of URL and pool detail."""
        if unreadable(exc):
            return page_title(exc)
        if isinstance(exc, requests.Timeout):
            return f"no answer from {self.base_url} within {self.timeout_s:g} s"
        if isinstance(exc, requests.ConnectionError):
            return f"cannot connect to {self.base_url}"
        status = status_of(exc)
        return f"HTTP {status}" if status is not None else _short(exc)

    def _refusal(self, what: str, exc: BaseException, status: int, own: bool = False) -> KaggleError:
        name = self.account.name
        said = _short(exc)
        if status == 401:
            return self._error(f"{what}: Kaggle refused the account's credentials (HTTP 401)",
                               f"The key or token of '{name}' is wrong or was revoked: make a new one at "
                               f"kaggle.com/settings, then `lab accounts remove {name}` and "
                               f"`lab accounts add {name} ...` again.", status=status)
        if status in (403, 404) and own:
            # Kaggle may answer 403 as well as 404 for the account's own dataset that is not there
            # (yet): the slug is right, so do not send the person to check it.
            return self._error(f"{what}: Kaggle answered HTTP {status} for the account's own item, which may "
                               f"not be there yet ({said})", "Wait a few minutes; `lab watch RUN` asks again.",
                               status=status, retryable=True)
        if status == 403:
            return self._error(f"{what}: Kaggle denied access (HTTP 403: {said})",
                               "Check the slug: a private kernel or dataset is visible only to its owner.",
                               status=status)
        if status == 404:
            return self._error(f"{what}: not found (HTTP 404: {said})", "Check the slug.", status=status)
        return self._error(f"{what}: Kaggle answered HTTP {status} ({said})",
                           "Fix what Kaggle names and try again.", status=status)

    def _ref(self, slug: str, *, own: bool = False) -> tuple[str, str]:
        """(owner, slug) from "slug" or "owner/slug"; `own` requires this account's."""
        owner, _, name = slug.strip().rpartition("/")
        owner = owner or self.username
        if "/" in owner or not name:
            raise UserError(f"Bad slug {slug!r}: use \"slug\" or \"owner/slug\".")
        if own and owner.lower() != self.username.lower():
            raise UserError(f"{slug} belongs to {owner}, not to account '{self.account.name}' "
                            f"(Kaggle user {self.username}).")
        return owner, name

    # -- quota ----------------------------------------------------------------------------

    def quota(self) -> Quota:
        return quota_from(self._call("reading the GPU quota", self._api.quota_view))

    # -- kernels --------------------------------------------------------------------------

    def push_kernel(self, slug: str, title: str, notebook_json: str | dict, dataset_sources: Iterable[str] = (),
                    kernel_sources: Iterable[str] = (), timeout_s: float | None = None, gpu: bool = True,
                    internet: bool = False, private: bool = True, image: str | None = None) -> PushResult:
        """Pushes a notebook as a new version of the kernel and starts its session (2×T4 with
        `gpu`; on the docker `image` given, else on the one Kaggle runs now). Raises KaggleError when
        Kaggle refuses; when it ran the kernel but dropped some sources, the error carries the
        PushResult as `.push`."""
        owner, name = self._ref(slug, own=True)
        ref = f"{owner}/{name}"
        _check_kernel_title(ref, name, title)
        text = notebook_text(notebook_json)
        size = len(text.encode("utf-8"))
        if size > NOTEBOOK_LIMIT_BYTES:
            raise UserError(f"The notebook for {ref} is {size / 1e6:.2f} MB; Kaggle takes at most 1 MB. "
                            "Keep data and checkpoints out of it: they go in a dataset.")
        meta: dict[str, Any] = {
            "id": ref, "title": title, "code_file": "notebook.ipynb", "language": "python",
            "kernel_type": "notebook", "is_private": bool(private), "enable_gpu": bool(gpu),
            "enable_tpu": False, "enable_internet": bool(internet),
            "dataset_sources": list(dataset_sources), "kernel_sources": list(kernel_sources),
            "competition_sources": [], "model_sources": [],
        }
        if gpu:
            meta["machine_shape"] = T4X2
        # Every version on the image Kaggle runs now, the probe's and the runs' alike (the client's
        # kernel metadata field; "original" would keep each kernel on its first version's image).
        meta["docker_image_pinning_type"] = IMAGE_PINNING
        if image:  # a run's later links on its first link's image (kagglesdk's SaveKernel `docker_image`)
            meta["docker_image"] = image
        timeout = str(int(timeout_s)) if timeout_s else None
        # kernels_push reads a folder with kernel-metadata.json: a private temporary one.
        with tempfile.TemporaryDirectory(prefix="lab-push-") as folder:
            Path(folder, "notebook.ipynb").write_text(text, encoding="utf-8")
            Path(folder, "kernel-metadata.json").write_text(json.dumps(meta), encoding="utf-8")
            resp = self._push(ref, folder, timeout)
            if resp.error and SHELL_ANSWER.lower() in resp.error.lower() and self._deleted(ref):
                # An earlier refusal left the kernel an empty draft, which refuses every push until it is
                # deleted; the refusal started nothing, so the push is sent once more (three reports).
                resp = self._push(ref, folder, timeout)
        result = PushResult(resp.ref or "", resp.url or "", resp.version_number)
        if resp.error:
            cause = push_cause(resp.error)
            raise self._error(f"Kaggle refused the push of {ref}: {resp.error}", _push_advice(cause), cause=cause,
                              retryable=cause is not None)
        dropped = list(resp.invalid_dataset_sources or []) + list(resp.invalid_kernel_sources or [])
        if dropped:
            raise self._error(
                f"Kaggle ran {ref} version {result.version} without these sources, unknown to this "
                f"account or not ready: {', '.join(dropped)}",
                "A private dataset or kernel must belong to this account, and a dataset must be READY "
                "(wait_dataset_ready) before the push; the session will likely fail.", push=result)
        return result

    def _push(self, ref: str, folder: str, timeout: str | None) -> Any:
        return self._call(f"pushing {ref}", lambda: self._api.kernels_push(folder, timeout=timeout), repeatable=False)

    def _deleted(self, ref: str) -> bool:
        """Deletes the empty draft; False when Kaggle would not (the refusal then says so)."""
        try:
            self.delete_kernel(ref)
        except KaggleError:
            return False
        return True

    def delete_kernel(self, slug: str) -> None:
        """Deletes one of the account's own kernels (an empty draft a refusal left); one not there is no error."""
        owner, name = self._ref(slug, own=True)
        ref = f"{owner}/{name}"
        with contextlib.redirect_stdout(io.StringIO()):  # the client prints "Kernel ... deleted successfully"
            self._call(f"deleting kernel {ref}", lambda: self._api.kernels_delete(ref, no_confirm=True),
                       missing=(403, 404), own=True, item=True)

    def gpu_sessions(self, skip: Iterable[str] = ()) -> list[tuple[str, str]]:
        """The account's GPU sessions running now as Kaggle lists them, [("owner/slug", status)]: its
        kernels run within a session's length (ListKernels, the most recently run first) that asked for
        a GPU, each asked its status; `skip`: kernels already known. Another lab member's runs and
        notebooks are among them; an interactive session is listed nowhere (only a refused push shows
        it)."""
        known = {k.lower() for k in skip}
        listed = self._call(f"listing the kernels of {self.username}", lambda: self._api.kernels_list(
            mine=True, user=self.username, sort_by="dateRun", page_size=50)) or []
        since = datetime.now(timezone.utc) - timedelta(seconds=RECENT_RUN_S)
        found = []
        for k in listed:
            ran = getattr(k, "last_run_time", None)
            ran = ran.replace(tzinfo=timezone.utc) if ran is not None and ran.tzinfo is None else ran
            if not k or (ran is not None and ran < since) or not (k.enable_gpu or k.machine_shape):
                continue
            if str(k.ref).lower() in known:
                continue
            try:
                status, _ = self.kernel_status(str(k.ref))
            except KaggleError as e:
                if e.cause == "busy":
                    raise
                continue  # an empty draft, a kernel deleted meanwhile: no session of it runs
            if status in ACTIVE_STATUS:
                found.append((str(k.ref), status))
        return found

    def kernel_status(self, slug: str, version: int | None = None) -> tuple[str, str]:
        """(status name, failure message): QUEUED, RUNNING, COMPLETE, ERROR, CANCEL_REQUESTED,
        CANCEL_ACKNOWLEDGED."""
        owner, name = self._ref(slug)
        ref = f"{owner}/{name}" + (f"/{int(version)}" if version else "")
        resp = self._call(f"reading the status of {ref}", lambda: self._api.kernels_status(ref),
                          own=owner.lower() == self.username.lower(), item=True)
        return resp.status.name, resp.failure_message or ""

    def kernel_image(self, slug: str) -> str | None:
        """The docker image Kaggle keeps on the kernel (GetKernel's metadata), None where it says none."""
        from kagglesdk.kernels.types.kernels_api_service import ApiGetKernelRequest  # where a kernel is read back
        owner, name = self._ref(slug)

        def get() -> Any:
            request = ApiGetKernelRequest()
            request.user_name, request.kernel_slug = owner, name
            with self._api.build_kaggle_client() as kaggle:
                return kaggle.kernels.kernels_api_client.get_kernel(request)
        resp = self._call(f"reading the kernel {owner}/{name}", get, own=owner.lower() == self.username.lower(),
                          item=True)
        return getattr(getattr(resp, "metadata", None), "docker_image", None) or None

    def kernel_output(self, slug: str, dest_dir: str | Path, page_size: int = 100) -> list[Path]:
        """Downloads the latest session's output files (every page) and its log (`<slug>.log`)
        into dest_dir; returns their paths."""
        owner, name = self._ref(slug)
        ref, dest = f"{owner}/{name}", Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        files, _ = self._call(f"downloading the output of {ref}", lambda: self._api.kernels_output(
            ref, str(dest), force=True, quiet=True, page_size=page_size), item=True)
        return list(dict.fromkeys(Path(f) for f in files))

    def kernel_log(self, slug: str) -> str:
        owner, name = self._ref(slug)
        ref = f"{owner}/{name}"
        return log_text(self._call(f"reading the log of {ref}", lambda: self._api.kernels_logs(ref), item=True) or "")

    def kernel_log_events(self, slug: str, version: int | None = None) -> Iterator[dict]:
        """The session's log as the real client streams it (`kernels_logs_stream`): events
        {"stream_name", "time", "data"}, live while it runs, the stored log after; replayed from
        the beginning on every call. Raises what the client raises (lab.kaggle.logs sorts it)."""
        owner, name = self._ref(slug)
        return self._api.kernels_logs_stream(f"{owner}/{name}" + (f"/{int(version)}" if version else ""))

    # -- who am I -------------------------------------------------------------------------

    def whoami(self) -> str:
        """The Kaggle username behind a token account (asks Kaggle); a key account's own username."""
        if self.account.auth != "token":
            return self.username
        return token_username(self._api.config_values["token"], account=self.account.name, base_url=self.base_url)


def _check_kernel_title(ref: str, name: str, title: str) -> None:
    # Kaggle derives a new kernel's slug from its title; a title that does not match the slug
    # may create a kernel under another slug (the client warns, on stdout, and goes on).
    from slugify import slugify
    if not _KERNEL_SLUG.fullmatch(name):
        raise UserError(f"Bad kernel slug {name!r}: Kaggle wants at least 5 characters a-z, 0-9 and '-'.")
    if len(title) < 5 or slugify(title) != name:
        raise UserError(f"The title {title!r} does not make the slug {name!r} (Kaggle would make "
                        f"{slugify(title)!r}); use a title whose slug is {name!r}, e.g. {name!r} itself.")


def push_cause(error: str) -> str | None:
    """Why Kaggle refused a push, from its answer's words where a source records them (CAUSES), else None:
    "Maximum batch GPU session count of 2 reached." (Kaggle's docs), "Maximum weekly GPU quota of 30.00
    hours reached." (one project's log), "Notebook not found" (an empty draft, three reports)."""
    text = error.lower()
    if "gpu session" in text:
        return "session-cap"
    if "quota" in text:
        return "quota"
    if SHELL_ANSWER.lower() in text:
        return "shell"
    return None


def _push_advice(cause: str | None) -> str:
    if cause == "session-cap":
        return "Wait until one of the account's running GPU sessions ends, or push from another account."
    if cause == "quota":
        return "Wait for the weekly quota refresh, or push from another account."
    if cause == "shell":
        return ("Kaggle keeps an empty draft of this kernel from an earlier refusal and would not let it be "
                "deleted: push to another slug.")
    return "Fix what Kaggle names and push again."


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def token_username(token: str, *, account: str = "new account", base_url: str | None = None) -> str:
    """The Kaggle username an API token belongs to (asks Kaggle)."""
    check_no_global_token()
    url = base_url or api_url()
    api = lab_api_class()(None, None, token, url, 30.0)
    try:
        username = api._introspect_token(token)
    except Exception as exc:  # noqa: BLE001 - any failure means the same to the person
        text = _short(unwrap(exc)).replace(token, "***")
        raise KaggleError(account, f"could not ask Kaggle whose token this is ({text})",
                          "Pass the username with --username, or check the token.", status=status_of(exc)) from None
    if not username:
        raise KaggleError(account, "Kaggle does not know this token (or it expired)",
                          "Make a new token at kaggle.com/settings.")
    return username


def client_for(account: str | Account, *, timeout_s: float = 60.0, retry: RetryPolicy | None = None) -> AccountClient:
    """The client for one account; the underlying KaggleApi object is made once per process."""
    check_no_global_token()
    acc = account if isinstance(account, Account) else get_account(account)
    url = api_url()
    retry = retry or RetryPolicy()
    # An interrupted blob upload resumes after the policy's first backoff.
    return AccountClient(acc, api_for(acc, url, timeout_s, retry.base_s), url, retry, timeout_s)


# Checking a new account: a person waits, so a few short tries.
ADD_RETRY = RetryPolicy(attempts=3, base_s=1.0, cap_s=5.0, max_retry_after_s=30.0)


def verify_new_account(account: Account, retry: RetryPolicy = ADD_RETRY, timeout_s: float = 30.0) -> Quota:
    """Asks Kaggle for a just-added account's quota. Credentials Kaggle refuses (401, 403) are
    not worth keeping: the account is removed again and the error says so. Any other trouble
    raises as it is, the account kept (`lab accounts` asks again)."""
    try:
        return client_for(account, retry=retry, timeout_s=timeout_s).quota()
    except KaggleError as e:
        if e.status in (401, 403):
            remove_account(account.name)
            raise KaggleError(e.account, e.what, f"{e.todo} The account was not added.", status=e.status) from None
        raise
