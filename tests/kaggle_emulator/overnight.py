"""The emulated Kaggle's quirks from a third reading (issue 39; `kaggle-notes.md`, "Third reading"):
what the real service did to a CI that runs on its T4s every day (unslothai/unsloth,
`.github/scripts/kaggle_t4_ci/`), and what other projects saw. Each is off by default and switched
on by the test that plays it.

    wedge_next_session(user, ...)      the session's notebook dies, and Kaggle never notices: it reads
                                       RUNNING for ever, its log silent, its quota burning, until its
                                       kernel is deleted ("sat in RUNNING for over two hours, past that
                                       ceiling ... and stopped only on a manual delete")
    deleting a running kernel          ends its session and gives its charged time back ("the account's
                                       used-hours figure went DOWN when a wedged kernel was deleted");
                                       how much comes back is *(assumed)*: all of that session's
    error_pages(user, for_s, ...)      calls answer HTTP 429/503 with an HTML error page labelled as
                                       JSON, which the client cannot read ("Expecting value: line 1
                                       column 1 (char 0)")
    show_kernels_late(user, by_s)      a pushed kernel answers 404 for `by_s` after its push *(assumed:
                                       how long a committed push may stay unseen is not on record)*
    version_403_while_processing       a dataset's new version is refused with 403 while its first is
                                       still processing (kagglehub PR #182, Kaggle staff, 2024-11)
    new_image(tag)                     Kaggle's image changes (docker-python: 2026-02-02, 03-17, 04-27,
                                       06-22); a push with `docker_image` runs on that image
    version labels                     a kernel version is `v<N>`; a bare number answers 404
                                       (kaggle-cli#1200/#1201): always, as the service does
"""
from __future__ import annotations

import signal
import time

from kaggle_emulator.files import _kill_tree
from kaggle_emulator.model import ACTIVE, EmulatedAccount, _HttpError

FIRST_IMAGE = "gcr.io/kaggle-gpu-images/python:v160"
ERROR_PAGE = ("<!DOCTYPE html><html><head><title>{status} {words}</title></head><body><h1>{words}</h1><p>The "
              "server is temporarily unable to service your request. Please try again later.</p></body></html>")
WORDS = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


class Overnight:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    version_403_while_processing: bool = False
    image: str = FIRST_IMAGE

    # -- test controls --------------------------------------------------------------------

    def wedge_next_session(self, username: str, after_s: float | None = None, once: str | None = None) -> None:
        """The account's next session dies `after_s` emulated seconds after it starts (or once its
        working folder holds a file matching `once`), silently: it reads RUNNING until deleted."""
        with self._lock:
            self._wedges.setdefault(username, []).append((after_s, once))

    def error_pages(self, username: str, for_s: float, status: int = 503, methods: tuple[str, ...] | None = None,
                    count: int | None = None) -> None:
        """For `for_s` wall seconds (at most `count` answers), the account's calls (or only `methods`)
        answer `status` with an HTML page labelled application/json."""
        with self._lock:
            self._pages.setdefault(username, []).append([time.monotonic() + for_s, int(status),
                                                         tuple(methods) if methods else None, count])

    def show_kernels_late(self, username: str, by_s: float) -> None:
        """The account's pushed kernels answer 404 for `by_s` wall seconds after each push."""
        with self._lock:
            self._late[username] = float(by_s)

    def new_image(self, tag: str) -> None:
        """Kaggle's image changes: pushes that pin none run on `tag` from now on."""
        with self._lock:
            self.image = tag

    def charged_s(self, owner: str, slug: str) -> float:
        """Emulated seconds of GPU quota the kernel's sessions were charged (after any refund)."""
        with self._lock:
            return sum(s.charged_s for s in self._sessions.values() if (s.owner, s.slug) == (owner, slug))

    # -- hooks the other parts call -------------------------------------------------------

    def _page_reply(self, user: EmulatedAccount | None, method: str) -> tuple[int, dict, dict] | None:
        with self._lock:
            spell = next((s for s in self._pages.get(user.username, []) if user and time.monotonic() < s[0]
                          and (s[2] is None or method in s[2]) and (s[3] is None or s[3] > 0)), None) if user else None
            if spell is None:
                return None
            if spell[3] is not None:
                spell[3] -= 1
        return spell[1], {"__html__": ERROR_PAGE.format(status=spell[1], words=WORDS.get(spell[1], "Error"))}, {}

    def _wedge_plan(self, username: str) -> tuple[float | None, str | None] | None:
        plans = self._wedges.get(username)
        return plans.pop(0) if plans else None

    def _wedge_due(self, s, now: float) -> None:
        """Kills a session due to wedge, silently: no end is ever reported."""
        due = s.wedge is not None and not s.wedged and s.started_at is not None and (
            (s.wedge[0] is not None and (now - s.started_at) * self.time_scale >= s.wedge[0])
            or (s.wedge[1] is not None and any(s.working.glob(s.wedge[1]))))
        if due and s.proc is not None:
            s.wedged = True
            _kill_tree(s.proc, getattr(signal, "SIGKILL", signal.SIGTERM))

    def _hidden(self, owner: str, slug: str) -> bool:
        """A pushed kernel still unseen (`show_kernels_late`)."""
        kernel = self._kernels.get((owner, slug))
        late = self._late.get(owner)
        return bool(kernel and late and kernel.versions
                    and time.monotonic() - kernel.versions[-1].session.queued_at < late)

    def _version_refused(self, ds) -> bool:
        return self.version_403_while_processing and any(
            self._dataset_version_status(ds, v) != "READY" for v in ds.versions)

    # -- calls ----------------------------------------------------------------------------

    def _delete_kernel(self, user: EmulatedAccount, body: dict) -> dict:
        """Deletes the kernel; a session of it that runs ends there, and its charged time is given back."""
        owner, slug = body.get("userName") or user.username, body.get("kernelSlug") or ""
        with self._lock:
            kernel = self._kernels.get((owner, slug))
            if kernel is None or owner != user.username:
                raise self._missing_kernel()
            for v in kernel.versions:
                s = v.session
                if s.status in ACTIVE:
                    if s.proc is not None and s.proc.poll() is None:
                        _kill_tree(s.proc, getattr(signal, "SIGKILL", signal.SIGTERM))
                    user.gpu_used_s = max(0.0, user.gpu_used_s - s.charged_s)
                    s.charged_s, s.stop_reason, s.deleted = 0.0, "deleted", True
                    self._finish(s, "CANCEL_ACKNOWLEDGED", "")
            del self._kernels[(owner, slug)]
        return {}

    def _get_kernel(self, user: EmulatedAccount, body: dict) -> dict:
        """GetKernel: the kernel's metadata, with the image its newest version ran."""
        owner, slug = body.get("userName") or user.username, body.get("kernelSlug") or ""
        with self._lock:
            kernel = self._kernels.get((owner, slug))
            if kernel is None or (kernel.private and owner != user.username) or self._hidden(owner, slug):
                raise self._missing_kernel()
            newest = kernel.versions[-1] if kernel.versions else None
            meta = {"ref": f"{owner}/{slug}", "id": kernel.id, "title": kernel.title, "isPrivate": kernel.private,
                    "language": "python", "kernelType": "notebook", "enableGpu": True}
            if newest is not None:
                meta["dockerImage"] = newest.session.image
        return {"metadata": meta, "blob": {"source": newest.text if newest else ""}}


def check_label(label: str | None) -> None:
    """A kernel version is asked as `v<N>`; a bare number answers 404 (kaggle-cli#1200/#1201)."""
    if label not in (None, "") and not str(label).startswith("v"):
        raise _HttpError(404, f"Kernel version '{label}' not found (write it v{label})")
