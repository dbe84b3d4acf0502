"""The emulated Kaggle's quirks from a second reading of other sources (issue 29; `kaggle-notes.md`,
"Read again"): answers of the real service that a kit must survive. Each is off by default and
switched on by the test that plays it.

    busy_spell(user, for_s, retry_after_s)   every call of that account (or only some: `methods`) answers 429
                                             RESOURCE_EXHAUSTED with a nested body and Retry-After, for that
                                             long (kaggle-cli#931: "even after waiting for 30 minutes"); the
                                             quota call too
    shells_after_refusal = True              a refused push leaves the kernel as an empty draft: its status
                                             answers 404 and every later push to it "Notebook not found"
                                             until it is deleted (DeleteKernel) (three independent reports)
    account.gpu_allowed = False              not verified (phone, and for accounts made after December 2025
                                             identity): a GPU push is accepted and runs with no GPU, and the
                                             quota never says `hasEverRun` (notes from 2026)
    missing_kernel_status = 401              what a kernel that is not there answers: 403 (the default), 404,
                                             or 401 (kaggle-cli#951, commit 562b65c)
    an account with token="KGAT_..."         Kaggle's new access tokens: Bearer only, so the same string sent
                                             as a kaggle.json key (Basic) gets 401 (kaggle-cli#1188)
    quota_overrun = True                     a running session is not stopped when the weekly quota runs out
                                             (30.93 of 30 h; 32 of 30 h in two records)
    reserve_running = True                   running GPU sessions reserve the rest of their timeout in
                                             `timeReserved` ("Quota reserved by currently-running sessions")
    "listing-lag" (set_dataset_behaviour)    a new version's file list misses its largest file for
                                             `listing_lag_s` after it is READY
    occupy(user, count, interactive)         another lab member's sessions on the account: a kernel of theirs
                                             running (listed, as Kaggle lists it), or an interactive session
                                             that holds a GPU slot and is listed nowhere (kaggle-cli#185)
    MAX_DATASET_FILES                        a dataset version over 1,000 files is refused (reported, 2020)

How the real service words a busy answer, a shell and the quota refusal is taken verbatim from
those sources; the rest of each answer's shape is *(assumed)*.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

from kaggle_emulator.model import ACTIVE, EmulatedAccount, _HttpError, _Kernel, _KernelVersion, _Session, _timestamp

MAX_DATASET_FILES = 1000
NOT_FOUND = "Notebook not found"  # the reply to a push into an empty draft, verbatim
MEMBERS_KERNEL = "another-members-notebook"


class Quirks:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    shells_after_refusal: bool = False
    missing_kernel_status: int = 403
    quota_overrun: bool = False
    reserve_running: bool = False
    listing_lag_s: float = 1.0

    # -- test controls --------------------------------------------------------------------

    def busy_spell(self, username: str, for_s: float, retry_after_s: float = 1.0,
                   methods: tuple[str, ...] | None = None, from_first_call: bool = False) -> None:
        """For the next `for_s` wall seconds every call the account makes (or only `methods`, RPC names)
        answers 429 RESOURCE_EXHAUSTED with Retry-After `retry_after_s`; `from_first_call`: the spell
        begins at the first such call (a push that comes whenever the run gets there)."""
        with self._lock:
            self._spells[username] = (None if from_first_call else time.monotonic() + float(for_s),
                                      float(retry_after_s), tuple(methods) if methods else None, float(for_s))

    def occupy(self, username: str, count: int = 1, *, interactive: bool = False) -> list[str]:
        """`count` sessions of another member's hold the account's GPU slots until `release`: a kernel
        of theirs running (listed among the account's kernels, its status RUNNING), or with
        `interactive` a session listed nowhere. Returns their kernels' slugs."""
        slugs = []
        with self._lock:
            for _ in range(int(count)):
                sid = next(self._ids)
                slug = f"{MEMBERS_KERNEL}-{sid}"
                session = _Session(sid, username, slug, 1, True, 12 * 3600.0, self.state_dir / "sessions" / str(sid),
                                   [], time.monotonic(), status="RUNNING", held=True)
                kernel = _Kernel(sid, username, slug, slug, True, hidden=interactive, last_run=_now())
                kernel.versions.append(_KernelVersion(1, "{}", {"enableGpu": True}, session))
                self._kernels[(username, slug)] = kernel
                self._sessions[sid] = session
                slugs.append(slug)
        return slugs

    def release(self, username: str) -> None:
        """Another member's sessions on the account end (COMPLETE)."""
        with self._lock:
            for s in self._sessions.values():
                if s.owner == username and s.slug.startswith(MEMBERS_KERNEL) and s.status in ACTIVE:
                    s.status = "COMPLETE"

    # -- hooks the other parts call -------------------------------------------------------

    def _busy_reply(self, user: EmulatedAccount | None, method: str) -> tuple[int, dict, dict] | None:
        """The 429 of a busy spell, nested as kaggle-cli#931 shows it, or None."""
        with self._lock:
            spell = self._spells.get(user.username) if user else None
            if spell is None or (spell[2] is not None and method not in spell[2]):
                return None
            if spell[0] is None:  # it begins now
                spell = self._spells[user.username] = (time.monotonic() + spell[3], *spell[1:])
        if time.monotonic() >= spell[0]:
            return None
        body = {"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                          "status": "RESOURCE_EXHAUSTED"}}
        return 429, body, {"Retry-After": f"{spell[1]:g}"}

    def _refused_push(self, owner: str, slug: str, error: str) -> dict:
        """A push refused with `error`: the reply as Kaggle gives it, and with `shells_after_refusal`
        the kernel left behind as an empty draft."""
        with self._lock:
            if self.shells_after_refusal and (owner, slug) not in self._kernels:
                self._kernels[(owner, slug)] = _Kernel(next(self._ids), owner, slug, slug, True, shell=True)
        return {"error": error, "ref": "", "versionNumber": 0}

    def _is_shell(self, owner: str, slug: str) -> bool:
        kernel = self._kernels.get((owner, slug))
        return kernel is not None and kernel.shell and not kernel.versions

    def _missing_kernel(self) -> _HttpError:
        """What a kernel that is not there (or not the caller's to see) answers."""
        code = self.missing_kernel_status
        return _HttpError(code, "Notebook not found" if code == 404 else "Permission 'kernels.get' was denied")

    def _quota_refusal(self, user: EmulatedAccount) -> str:
        return f"Maximum weekly GPU quota of {user.gpu_total_s / 3600:.2f} hours reached."

    def _reserved_s(self, user: EmulatedAccount) -> float:
        """`timeReserved`: what was set, and with `reserve_running` the rest of each running GPU
        session's timeout *(assumed: how Kaggle reserves is not documented)*."""
        held = user.gpu_reserved_s
        if self.reserve_running:
            now = time.monotonic()
            for s in self._sessions.values():
                if s.owner == user.username and s.gpu and s.status == "RUNNING" and s.started_at is not None:
                    held += max(0.0, s.timeout_s - (now - s.started_at) * self.time_scale)
        return held

    def _listed_files(self, ds, version, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """A version's file list as Kaggle shows it now: with "listing-lag", its largest file missing
        for `listing_lag_s` after it is READY."""
        lagging = self._dataset_behaviour.get((ds.owner, ds.slug)) == "listing-lag"
        if lagging and files and time.monotonic() < version.ready_at + self.listing_lag_s:
            largest = max(files, key=lambda f: (f[1], f[0]))
            return [f for f in files if f != largest]
        return files

    # -- calls ----------------------------------------------------------------------------

    def _list_kernels(self, user: EmulatedAccount, body: dict) -> dict:
        """The account's own kernels ("PROFILE" group), the most recently run first, a page at a time
        (interactive sessions are not kernels: they are not listed)."""
        if "PROFILE" not in str(body.get("group") or ""):
            raise _HttpError(400, "The emulator lists only the caller's own kernels (group PROFILE)")
        size, page = int(body.get("pageSize") or 20), max(1, int(body.get("page") or 1))
        with self._lock:
            mine = [k for k in self._kernels.values() if k.owner == user.username and not k.hidden]
            mine.sort(key=lambda k: k.last_run or datetime.min.replace(tzinfo=timezone.utc), reverse=True)
            rows = [_kernel_row(k) for k in mine[(page - 1) * size:page * size]]
        return {"kernels": rows}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _kernel_row(k: _Kernel) -> dict:
    last = k.versions[-1].request if k.versions else {}
    row = {"id": k.id, "ref": f"{k.owner}/{k.slug}", "title": k.title, "author": k.owner, "slug": k.slug,
           "isPrivate": k.private, "enableGpu": bool(last.get("enableGpu")), "kernelType": "notebook",
           "language": "python", "currentVersionNumber": len(k.versions)}
    if last.get("machineShape"):
        row["machineShape"] = last["machineShape"]
    if k.last_run is not None:
        row["lastRunTime"] = _timestamp(k.last_run)
    return row
