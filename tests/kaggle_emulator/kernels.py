"""The emulated Kaggle: kernels, their sessions' status and outputs, downloads."""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from kaggle_emulator.files import _list_files
from kaggle_emulator.model import (ACTIVE, GPU_SHAPES, KAGGLE_SESSION_LIMIT_S, MAX_PAGE_SIZE, NOTEBOOK_LIMIT_BYTES,
                                   SIGNED_URL_TTL_S, TERMINAL, EmulatedAccount, _HttpError, _Kernel, _KernelVersion,
                                   _Session, _utcnow)
from kaggle_emulator.overnight import check_label
from kaggle_emulator.quirks import NOT_FOUND


class Kernels:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    def _save_kernel(self, user: EmulatedAccount, body: dict) -> dict:
        owner, _, slug = str(body.get("slug") or "").rpartition("/")
        owner = owner or user.username
        if owner != user.username:
            raise _HttpError(403, "You may only push kernels you own")
        text = str(body.get("text") or "")
        with self._lock:
            if self._is_shell(owner, slug):  # an empty draft a refusal left: until it is deleted
                return {"error": NOT_FOUND, "ref": "", "versionNumber": 0}
            forced = self._push_errors.get(user.username)
            if forced:
                return self._refused_push(owner, slug, forced.pop(0))
        error = self._push_refusal(body, slug, text)
        if error:
            return {"error": error}
        # An account not verified gets its push taken and its session run with no GPU (reported, 2026).
        gpu = (bool(body.get("enableGpu")) or body.get("machineShape") in GPU_SHAPES) and user.gpu_allowed
        with self._lock:
            if gpu and self._active_gpu_sessions(user.username) >= self.max_gpu_sessions:
                return self._refused_push(owner, slug, f"Maximum batch GPU session count of {self.max_gpu_sessions} "
                                                       "reached.")
            if gpu and self.quota_at_push and self._gpu_left(user) <= 0:
                return self._refused_push(owner, slug, self._quota_refusal(user))
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
            kernel.last_run = _utcnow()
            number = len(kernel.versions) + 1
            timeout = min(float(body.get("sessionTimeoutSeconds") or KAGGLE_SESSION_LIMIT_S), KAGGLE_SESSION_LIMIT_S)
            sid = next(self._ids)
            plans, holds = self._kill_plans.get(user.username), self._holds.get(user.username)
            plan = plans.pop(0) if plans else None
            killed_at = plan.after_s if plan and plan.after_s is not None else timeout
            session = _Session(sid, owner, slug, number, gpu, min(timeout, killed_at),
                               self.state_dir / "sessions" / str(sid), mounts, time.monotonic(),
                               kill_lost=self.timeout_kill == "lost" or plan is not None,
                               keep_outputs=plan is not None and not plan.lose_outputs,
                               timeout_status=plan.status if plan else self.timeout_status,
                               listing_status=plan.listing_status if plan else None,
                               kill_once=plan.once if plan else None)
            session.image = str(body.get("dockerImage") or self.image)
            session.wedge = self._wedge_plan(user.username)
            if holds:
                session.status, session.held = holds.pop(0), True
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

    def _push_refusal(self, body: dict, slug: str, text: str) -> str:
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
                    continue
                if kind == "datasets":
                    source = self._mountable(ref, source)
                if source is not None:  # READY but not yet mountable: the session starts without it
                    owner, slug = ref.split("/")[:2]
                    mounts.append((source, self._input_path(kind, owner, slug)))
        return mounts, bad_datasets, bad_kernels

    def _mountable(self, ref: str, newest: Path) -> Path | None:
        """What a session mounts of a dataset *(assumed)*: a version READY for `mount_lag_s`, so
        right after READY a session sees the version before, or nothing."""
        ds = self._datasets[tuple(ref.split("/")[:2])]
        lagged = self._dataset_behaviour.get((ds.owner, ds.slug)) == "mount-lag"
        lag = self.mount_lag_s or (2.0 if lagged else 0.0)
        if not lag:
            return newest
        now = time.monotonic()
        settled = [v for v in ds.versions if self._dataset_version_status(ds, v) == "READY" and now >= v.ready_at + lag]
        return settled[-1].folder if settled else None

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
        # Kaggle answers alike for a kernel that is missing and one that is private: 403, or 401 (quirks).
        if kernel is None or (kernel.private and owner != user.username) or self._hidden(owner, slug):
            raise self._missing_kernel()
        check_label(body.get("versionLabel"))
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
            if s.status in TERMINAL and s.outputs_lost and s.listing_status:
                raise _HttpError(s.listing_status, "Permission 'kernels.output' was denied" if s.listing_status == 403
                                 else "Kernel session output not found")
            # *(assumed)* Files appear once the session has ended; the log grows while it runs.
            names = _list_files(s.working) if s.status in TERMINAL and not s.outputs_lost else []
            log = json.dumps(s.log) if s.log and self.log_readable(s.status) and not s.outputs_lost else ""
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
