"""The emulated Kaggle: blob uploads and datasets."""
from __future__ import annotations

import re
import secrets
import shutil
import time
from typing import BinaryIO

from kaggle_emulator.files import _drain, _write_at
from kaggle_emulator.model import EmulatedAccount, _Blob, _Dataset, _DatasetVersion, _HttpError
from kaggle_emulator.quirks import MAX_DATASET_FILES


# Kaggle's documented dataset licence names (kaggle-cli docs/datasets_metadata.md, "Licenses"); the
# service's own list is not public *(assumed: it takes exactly these)*. MIT is not among them.
KNOWN_LICENCES = {"CC0-1.0", "CC-BY-SA-3.0", "CC-BY-SA-4.0", "CC-BY-NC-SA-4.0", "GPL-2.0", "ODbL-1.0", "DbCL-1.0",
                  "copyright-authors", "other", "unknown", "CC-BY-4.0", "CC-BY-NC-4.0", "PDDL", "CC-BY-3.0",
                  "CC-BY-3.0-IGO", "US-Government-Works", "CC-BY-NC-SA-3.0-IGO", "CDLA-Permissive-1.0",
                  "CDLA-Sharing-1.0", "CC-BY-ND-4.0", "CC-BY-NC-ND-4.0", "ODC-BY-1.0", "LGPL-3.0", "AGPL-3.0",
                  "FDL-1.3", "EU-ODP-Legal-Notice", "apache-2.0", "GPL-3.0"}
DATASET_BEHAVIOURS = (None, "stuck", "failed", "deleted", "reprocessing", "drop-file", "mount-lag", "listing-lag")


class Datasets:
    """Part of KaggleEmulator (a mixin): its state lives there."""

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
        licence = body.get("licenseName") or ""
        if licence not in KNOWN_LICENCES:
            return {"status": "error", "error": f"Unknown license name {licence!r}."}
        title = str(body.get("title") or slug)
        with self._lock:
            if (owner, slug) in self._datasets:
                return {"status": "error",
                        "error": f'The requested slug "{slug}" is already in use by a dataset. Please choose another slug.'}
            if any(d.owner == owner and d.title == title for d in self._datasets.values()):
                return {"status": "error",
                        "error": f'The requested title "{title}" is already in use by a dataset. Please choose another title.'}
            if len(body.get("files") or []) > MAX_DATASET_FILES:
                return _too_many_files()
            blobs = self._take_blobs(user, body.get("files"))
            if self._over_storage(owner, blobs):  # *(reported)* "being created", then never there
                return {"ref": f"{owner}/{slug}", "url": f"{self.url}/datasets/{owner}/{slug}", "status": "ok"}
            # An omitted isPrivate is false: a public dataset, as on Kaggle.
            ds = _Dataset(owner, slug, title, bool(body.get("isPrivate", False)))
            self._datasets[(owner, slug)] = ds
            self._add_dataset_version(ds, blobs, "")
        return {"ref": f"{owner}/{slug}", "url": f"{self.url}/datasets/{owner}/{slug}", "status": "ok"}

    def _create_dataset_version(self, user: EmulatedAccount, body: dict) -> dict:
        owner, slug = body.get("ownerSlug") or "", body.get("datasetSlug") or ""
        with self._lock:
            ds = self._visible_dataset(user, owner, slug)
            if ds.owner != user.username:
                raise _HttpError(403, "You may only version datasets you own")
            if self._version_refused(ds):  # kagglehub PR #182: while the first version is processing
                raise _HttpError(403, "Permission 'datasets.update' was denied")
            inner = body.get("body") or {}
            if len(inner.get("files") or []) > MAX_DATASET_FILES:
                return _too_many_files()
            blobs = self._take_blobs(user, inner.get("files"))
            if not self._over_storage(owner, blobs):
                self._add_dataset_version(ds, blobs, inner.get("versionNotes") or "")
                if inner.get("deleteOldVersions"):
                    for old in ds.versions[:-1]:
                        shutil.rmtree(old.folder, ignore_errors=True)
                    ds.versions = ds.versions[-1:]
        return {"ref": f"{owner}/{slug}", "url": f"{self.url}/datasets/{owner}/{slug}", "status": "ok"}

    def _over_storage(self, owner: str, blobs: list[_Blob]) -> bool:
        """Whether these files would take the owner's private datasets (every version kept) over
        `private_storage_bytes`."""
        if self.private_storage_bytes is None:
            return False
        held = sum(f.stat().st_size for ds in self._datasets.values() if ds.owner == owner and ds.private
                   for v in ds.versions for f in v.folder.iterdir() if f.is_file())
        return held + sum(b.size for b in blobs) > self.private_storage_bytes

    def _add_dataset_version(self, ds: _Dataset, blobs: list[_Blob], notes: str) -> None:
        number = (ds.versions[-1].number if ds.versions else 0) + 1
        folder = self.state_dir / "datasets" / ds.owner / ds.slug / f"v{number}"
        folder.mkdir(parents=True, exist_ok=True)
        if self._dataset_behaviour.get((ds.owner, ds.slug)) == "drop-file" and len(blobs) > 1:
            blobs = sorted(blobs, key=lambda b: (b.size, b.name))[:-1]  # the largest never arrived
        for blob in blobs:
            shutil.copyfile(blob.path, folder / blob.name)
        ds.versions.append(_DatasetVersion(number, folder, notes, time.monotonic() + self.dataset_ready_s))

    def _dataset_version_status(self, ds: _Dataset, v: _DatasetVersion) -> str:
        behaviour = self._dataset_behaviour.get((ds.owner, ds.slug))
        due = time.monotonic() >= v.ready_at
        if v.status == "BLOBS_RECEIVED" and behaviour == "reprocessing":
            v.status = "REPROCESSING"  # then READY after another `dataset_ready_s`
            v.ready_at = time.monotonic() + self.dataset_ready_s
        elif v.status in ("BLOBS_RECEIVED", "REPROCESSING") and behaviour in (None, "mount-lag", "drop-file",
                                                                              "reprocessing", "listing-lag") and due:
            v.status = "READY"
        elif v.status == "BLOBS_RECEIVED" and behaviour in ("failed", "deleted"):
            v.status = behaviour.upper()
        return v.status

    def _visible_dataset(self, user: EmulatedAccount, owner: str, slug: str) -> _Dataset:
        ds = self._datasets.get((owner, slug))
        # *(assumed)* A dataset missing, or created seconds ago, may answer 403 rather than 404.
        if ds is None or time.monotonic() < ds.created_at + self.dataset_visible_s:
            if self.missing_status == 403:
                raise _HttpError(403, f"Permission 'datasets.get' was denied for {owner}/{slug}")
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

    def _list_datasets(self, user: EmulatedAccount, body: dict) -> dict:
        """The user's own datasets ("my" group) or public ones, filtered by `search`, 20 a page."""
        mine = "MY" in str(body.get("group") or "")
        search = str(body.get("search") or "").lower()
        page = max(1, int(body.get("page") or 1))
        with self._lock:
            found = [ds for (owner, slug), ds in sorted(self._datasets.items())
                     if (ds.owner == user.username if mine else not ds.private) and search in slug.lower()
                     and time.monotonic() >= ds.created_at + self.dataset_visible_s]
            rows = [{"ref": f"{ds.owner}/{ds.slug}", "title": ds.title, "isPrivate": ds.private,
                     "totalBytes": sum(f.stat().st_size for f in ds.versions[-1].folder.iterdir() if f.is_file())}
                    for ds in found[(page - 1) * 20:page * 20]]
        return {"datasets": rows}

    def _list_dataset_files(self, user: EmulatedAccount, body: dict) -> dict:
        """A version's files with their sizes (the newest without `datasetVersionNumber`), a page at a time."""
        size, token = int(body.get("pageSize") or 20), body.get("pageToken") or "0"
        if not 1 <= size <= 200 or not str(token).isdigit():
            raise _HttpError(400, "pageSize must be 1-200 and pageToken a page token")
        with self._lock:
            ds = self._visible_dataset(user, body.get("ownerSlug") or "", body.get("datasetSlug") or "")
            number = body.get("datasetVersionNumber")
            found = [v for v in ds.versions if number in (None, "", 0) or v.number == int(number)]
            if not found:
                return {"errorMessage": f"Dataset version {number} not found"}
            files = self._listed_files(ds, found[-1], sorted((f.name, f.stat().st_size)
                                                               for f in found[-1].folder.iterdir() if f.is_file()))
        start = int(token)
        reply: dict = {"datasetFiles": [{"name": n, "totalBytes": b, "ref": n} for n, b in files[start:start + size]]}
        if start + size < len(files):
            reply["nextPageToken"] = str(start + size)
        return reply

    def _delete_dataset(self, user: EmulatedAccount, body: dict) -> dict:
        owner, slug = body.get("ownerSlug") or user.username, body.get("datasetSlug") or ""
        with self._lock:
            ds = self._visible_dataset(user, owner, slug)
            if ds.owner != user.username:
                raise _HttpError(403, "You may only delete datasets you own")
            del self._datasets[(owner, slug)]
        return {}


def _too_many_files() -> dict:
    """A version over the file limit, refused as reported (2020); the reply's shape is *(assumed)*."""
    return {"status": "error", "error": f"The file count exceeds the maximum of {MAX_DATASET_FILES}"}
