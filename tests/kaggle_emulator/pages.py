"""The emulated Kaggle's kernel page, `GET /code/<owner>/<slug>`: what `lab cancel` and the control
notebook's Stop link to, since Kaggle's public API cannot stop a running session. Like the real
page it shows the kernel's sessions and a **Stop session** button (`POST .../stop`), which stops
the newest running session as Kaggle's does (SIGTERM, then the kill after the grace period).
Kaggle asks the person to be signed in as the owner; the emulator serves this machine only."""
from __future__ import annotations

import html

from kaggle_emulator.model import ACTIVE, _HttpError


class Pages:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    def kernel_page(self, owner: str, slug: str) -> tuple[int, bytes]:
        """(HTTP status, the page's HTML)."""
        with self._lock:
            kernel = self._kernels.get((owner, slug))
            if kernel is None:
                return 404, _page(f"{owner}/{slug}", "<p>No such notebook.</p>")
            rows = "".join(f"<tr><td>{v.number}</td><td class='status'>{html.escape(v.session.status)}</td>"
                           f"<td>{html.escape(v.session.failure or '')}</td></tr>" for v in kernel.versions)
            states = {v.session.status for v in kernel.versions}
        if states & {"QUEUED", "RUNNING"}:
            action = (f"<form method='post' action='/code/{html.escape(owner)}/{html.escape(slug)}/stop'>"
                      "<button id='stop-session' type='submit'>Stop session</button></form>")
        elif "CANCEL_REQUESTED" in states:
            action = "<p id='stopping'>Stopping the session…</p>"
        else:
            action = "<p id='no-session'>No session is running.</p>"
        body = f"<table><tr><th>version</th><th>status</th><th>failure</th></tr>{rows}</table>{action}"
        return 200, _page(f"{owner}/{slug}", body, refresh=bool(states & set(ACTIVE)))

    def stop_from_page(self, owner: str, slug: str) -> int:
        """The page's Stop session: the newest running session of the kernel stops; the HTTP status."""
        with self._lock:
            kernel = self._kernels.get((owner, slug))
            active = [v for v in (kernel.versions if kernel else []) if v.session.status in ACTIVE]
        if not active:
            return 404
        try:
            self.cancel(owner, slug, active[-1].number)
        except (_HttpError, KeyError):
            return 404
        return 303


def _page(title: str, body: str, refresh: bool = False) -> bytes:
    """The page; `refresh`: it reloads itself every 2 s while a session is there, as Kaggle's updates."""
    meta = "<meta http-equiv='refresh' content='2'>" if refresh else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{meta}<title>{html.escape(title)} · Kaggle emulator"
            f"</title></head><body><h1>{html.escape(title)}</h1>{body}</body></html>").encode("utf-8")
