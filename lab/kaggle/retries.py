"""One retry policy for every call to Kaggle: which failures are transient, which are surely
unprocessed (safe to repeat even a push), and how long to wait (backoff with jitter, or the
server's Retry-After).

An answer the client cannot read is a passing one: Kaggle answers 429 and 503 with an HTML error
page, and kagglesdk decodes a body labelled JSON before it looks at the status, so the error has no
status and reads `Expecting value: line 1 column 1 (char 0)` (unsloth's Kaggle CI, launch.py). It is
retried like a 503, and named as the page it is (`page_title`). Only a request that surely never
reached Kaggle, or that Kaggle plainly refused for its rate (a readable 429 RESOURCE_EXHAUSTED), is
repeated when it must not be done twice: a 5xx may come after the work was done (a committed push
answered with a 5xx, in the same notes)."""
from __future__ import annotations

import email.utils
import json
import random
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import requests
import urllib3.exceptions

TRANSIENT_STATUS = {429, 500, 502, 503, 504}


def unwrap(exc: BaseException) -> BaseException:
    """KaggleApi turns some HTTP errors into a ValueError ("Cannot access kernel..."): the
    HTTP error is its context."""
    ctx = exc.__context__
    if isinstance(exc, ValueError) and isinstance(ctx, requests.HTTPError):
        return ctx
    return exc


def status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def unreadable(exc: BaseException) -> bool:
    """An answer the client could not decode (an HTML error page where JSON was due)."""
    return isinstance(exc, (json.JSONDecodeError, requests.exceptions.InvalidJSONError))


def page_title(exc: BaseException) -> str:
    """What an unreadable answer was, as a person would see it: the page's title where it has one."""
    doc = str(getattr(exc, "doc", "") or "")
    found = re.search(r"<title[^>]*>(.*?)</title>", doc, re.IGNORECASE | re.DOTALL)
    said = " ".join(found.group(1).split()) if found else " ".join(re.sub(r"<[^>]+>", " ", doc).split())[:80]
    return f"an error page, not JSON ({said!r})" if said else "an answer that is not JSON"


def is_transient(exc: BaseException) -> bool:
    if unreadable(exc):
        return True
    if isinstance(exc, ValueError) and str(exc).startswith("Upload unsuccessful"):
        return True  # a blob upload ran out of resumes; the next try resumes where it stopped
    if isinstance(exc, requests.HTTPError):
        return status_of(exc) in TRANSIENT_STATUS
    return isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                            urllib3.exceptions.ProtocolError))


def surely_unprocessed(exc: BaseException) -> bool:
    """Kaggle certainly did not act on the request: it never arrived, or Kaggle refused it for its
    rate in words it could read (a JSON 429 RESOURCE_EXHAUSTED). A 5xx, an unreadable page or no answer
    may come after the work was done."""
    if unreadable(exc):
        return False
    if isinstance(exc, requests.HTTPError):
        return status_of(exc) == 429 and busy(exc)
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(exc, requests.ConnectionError) and isinstance(reason, urllib3.exceptions.NewConnectionError)


def busy(exc: BaseException) -> bool:
    """Kaggle asks for a pause: HTTP 429, or a body saying RESOURCE_EXHAUSTED, flat or nested as
    kaggle-cli#931 shows it (`{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", ...}}`)."""
    if status_of(exc) == 429:
        return True
    try:
        body = exc.response.json()  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False
    inner = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else body
    return isinstance(inner, dict) and str(inner.get("status", "")).upper() == "RESOURCE_EXHAUSTED"


def retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    value = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)  # the HTTP-date form
        except (TypeError, ValueError):
            return None
        when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    """attempts in all; waits base_s·2^(n-1) (at most cap_s) with jitter, or Retry-After."""
    attempts: int = 6
    base_s: float = 1.0
    cap_s: float = 60.0
    max_retry_after_s: float = 300.0

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next try; None when Kaggle asks for too long a wait."""
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                return None
            return retry_after * (1 + random.random() / 10)
        base = min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)

