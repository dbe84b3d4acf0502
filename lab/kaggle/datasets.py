"""The dataset half of one account's client (lab.kaggle.client.AccountClient takes it in).

Uploads go up as a private dataset, created or given a new version; a new version deletes the
older ones (`delete_old_versions`, the one way kagglesdk 0.1.38 offers: its dataset service has
no call that deletes a single version), so an account's storage holds each dataset once.
Kaggle is reported to accept an upload over the private-storage quota and then never show the
dataset (kaggle-cli#284): the wait for READY says so. What a version holds is read back by name
and size (`dataset_files`), the cheapest check the API allows short of downloading it again.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from lab.config import UserError
from lab.kaggle.replies import DATASET_PAGE, DatasetInfo

# Kaggle's documented dataset licence names (kaggle-cli docs/datasets_metadata.md, "Licenses"):
# only these are sent; MIT, for one, is not among them.
DATASET_LICENCES = ("CC0-1.0", "CC-BY-SA-3.0", "CC-BY-SA-4.0", "CC-BY-NC-SA-4.0", "GPL-2.0", "ODbL-1.0", "DbCL-1.0",
                    "copyright-authors", "other", "unknown", "CC-BY-4.0", "CC-BY-NC-4.0", "PDDL", "CC-BY-3.0",
                    "CC-BY-3.0-IGO", "US-Government-Works", "CC-BY-NC-SA-3.0-IGO", "CDLA-Permissive-1.0",
                    "CDLA-Sharing-1.0", "CC-BY-ND-4.0", "CC-BY-NC-ND-4.0", "ODC-BY-1.0", "LGPL-3.0", "AGPL-3.0",
                    "FDL-1.3", "EU-ODP-Legal-Notice", "apache-2.0", "GPL-3.0")
DATASET_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{4,48}[a-z0-9]")  # 6 to 50 characters
STORAGE_HINT = ("Over the account's private-storage quota (about 100 GB, not documented) Kaggle is reported to take "
                "an upload and never show it (kaggle-cli#284): `lab accounts checkpoints` shows what the account "
                "holds, and `--remove-finished` frees what finished runs left.")
FILES_PAGE = 100  # files per page of a version's listing
# Kaggle refuses a dataset version of more files ("The file count exceeds the maximum of 1000", reported
# 2020): checked before anything goes up.
MAX_DATASET_FILES = 1000


class DatasetCalls:
    """The dataset calls of AccountClient: it gives `_call`, `_ref`, `_error`, `account`, `username`."""

    def upload_dataset(self, slug: str, folder: str | Path, title: str, notes: str = "", licence: str = "other",
                       ready_wait_s: float = 3600.0) -> int:
        """Uploads the files of `folder` as a private dataset: creates it, or adds a version that
        replaces the older ones. Returns the dataset's version number. Kaggle then processes it:
        wait_dataset_ready. A new version Kaggle refuses with 403 while the dataset's version before is
        still processing (kagglehub PR #182, Kaggle staff: "you get a 403 if you try uploading a new
        version while the FIRST version is still being processed") waits for it, `ready_wait_s` at
        most, and is sent again; one still processing then is an error of cause "processing"."""
        owner, name = self._ref(slug, own=True)
        ref = f"{owner}/{name}"
        if not DATASET_SLUG.fullmatch(name):
            raise UserError(f"Bad dataset slug {name!r}: Kaggle wants 6-50 characters a-z, 0-9 and '-'.")
        if not 6 <= len(title) <= 50:
            raise UserError(f"The title of dataset {ref} must be 6-50 characters long.")
        if licence not in DATASET_LICENCES:
            raise UserError(f"Kaggle documents no dataset licence {licence!r}: use one of {', '.join(DATASET_LICENCES)}.")
        files = upload_files(Path(folder))
        if len(files) > MAX_DATASET_FILES:
            raise UserError(f"{folder} holds {len(files)} files; Kaggle refuses a dataset version of more than "
                            f"{MAX_DATASET_FILES}: put them in fewer, larger files (or a zip Kaggle unpacks).")
        stage = self._stage_dataset(name, ref, title, files, licence)
        exists = self._dataset_state(ref) is not None
        created = False
        if not exists:
            resp = self._call(f"creating dataset {ref}", lambda: self._api.dataset_create_new(
                str(stage), public=False, quiet=True, dir_mode="skip"))
            # A create whose reply was lost and was sent again finds its own dataset there.
            exists = bool(resp.error) and self._dataset_state(ref) is not None
            if resp.error and not exists:
                raise self._error(f"Kaggle refused to create dataset {ref}: {resp.error}",
                                  "Fix what Kaggle names and upload again.")
            created = not resp.error
        if exists:
            resp = self._new_version(ref, stage, notes, ready_wait_s)
            if resp.error:
                raise self._error(f"Kaggle refused a new version of dataset {ref}: {resp.error}",
                                  "Fix what Kaggle names and upload again.")
        state = self._dataset_state(ref)
        if state is None and not created:
            raise self._error(f"dataset {ref} is not there after the upload", f"Upload it again. {STORAGE_HINT}")
        # A dataset just created may not be visible yet (403 or 404 for a while): it is version 1.
        return int(state.get("current_version_number") or 0) if state else 1

    def _new_version(self, ref: str, stage: Path, notes: str, ready_wait_s: float):
        def send():
            return self._call(f"adding a version to dataset {ref}", lambda: self._api.dataset_create_version(
                str(stage), notes or "new version", quiet=True, delete_old_versions=True, dir_mode="skip"), own=True)
        try:
            return send()
        except UserError as e:
            if getattr(e, "status", None) != 403:
                raise
        try:
            self.wait_dataset_ready(ref, ready_wait_s)
        except UserError as e:
            raise self._error(f"Kaggle refuses a new version of dataset {ref} while the one before is processing, "
                              f"and it is not done after {ready_wait_s:g} s ({getattr(e, 'what', e)})",
                              "The run goes on on another account meanwhile.", cause="processing") from None
        return send()

    def _stage_dataset(self, name: str, ref: str, title: str, files: list[Path], licence: str) -> Path:
        """The upload folder: links to the files plus dataset-metadata.json, in this account's
        own staging folder. The client keys its resume state by file path, not by account, so
        one path per account keeps one account from resuming another's upload."""
        stage = self.account.folder / "staging" / name
        if stage.exists():
            shutil.rmtree(stage)  # links only: rmtree does not follow them
        stage.mkdir(parents=True, mode=0o700)
        for f in files:
            # A symlinked file keeps its own name: the lab stages flattened names that way.
            _link(f.resolve(), stage / f.name)
        meta = {"title": title, "id": ref, "licenses": [{"name": licence}], "isPrivate": True}
        (stage / "dataset-metadata.json").write_text(json.dumps(meta), encoding="utf-8")
        return stage

    def _dataset_state(self, ref: str) -> dict | None:
        """{"status": "ready", "current_version_number": N}, or None when there is no such dataset."""
        own = ref.split("/")[0].lower() == self.username.lower()
        # On the account's own datasets 403 means "not there (yet)" as 404 does (kaggle-notes: unknown).
        raw = self._call(f"reading dataset {ref}", lambda: self._api.dataset_status(ref, format="json"),
                         missing=(403, 404) if own else (404,), own=own)
        return None if raw is None else json.loads(raw)

    def dataset_version(self, slug: str) -> int | None:
        """The dataset's current version number, or None when there is no such dataset (yet)."""
        owner, name = self._ref(slug)
        state = self._dataset_state(f"{owner}/{name}")
        return None if state is None else int(state.get("current_version_number") or 0)

    def dataset_status(self, slug: str) -> str:
        """READY, FAILED, DELETED, a processing state (BLOBS_RECEIVED, REPROCESSING, ...), or
        MISSING (no such dataset, yet)."""
        owner, name = self._ref(slug)
        ref = f"{owner}/{name}"
        own = owner.lower() == self.username.lower()
        status = self._call(f"reading the status of dataset {ref}", lambda: self._api.dataset_status(ref),
                            missing=(403, 404) if own else (), own=own)
        return "MISSING" if status is None else str(status).upper()

    def wait_dataset_ready(self, slug: str, timeout_s: float, poll_s: float = 10.0) -> int:
        """Waits until the dataset's newest version is READY; returns its version number. FAILED
        and DELETED end the wait at once; every other state is waited out."""
        owner, name = self._ref(slug)
        ref = f"{owner}/{name}"
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.dataset_status(ref)
            if status == "READY":
                return int((self._dataset_state(ref) or {}).get("current_version_number") or 0)
            if status == "FAILED":
                raise self._error(f"Kaggle could not process dataset {ref} (FAILED)", "Upload it again.")
            if status == "DELETED":
                raise self._error(f"Kaggle reports dataset {ref} DELETED while it waits to be READY", "Upload it again.")
            left = deadline - time.monotonic()
            if left <= 0:
                hint = f" {STORAGE_HINT}" if status == "MISSING" else ""
                raise self._error(f"dataset {ref} is still {status} after {timeout_s:g} s",
                                  f"Kaggle may be slow: wait longer, or upload it again.{hint}", retryable=True,
                                  cause="processing")
            time.sleep(min(poll_s, left))

    def dataset_files(self, slug: str, version: int | None = None) -> dict[str, int]:
        """{file name: bytes} of the dataset's version (its newest with None), every page."""
        owner, name = self._ref(slug)
        ref = f"{owner}/{name}" + (f"/{int(version)}" if version else "")
        files: dict[str, int] = {}
        token = None
        for _ in range(1000):
            resp = self._call(f"listing the files of dataset {ref}", lambda: self._api.dataset_list_files(
                ref, page_token=token, page_size=FILES_PAGE), own=owner.lower() == self.username.lower())
            if resp.error_message:
                raise self._error(f"Kaggle could not list the files of dataset {ref}: {resp.error_message}",
                                  "Wait a few minutes; `lab watch RUN` asks again.", retryable=True)
            files.update({str(f.name): int(f.total_bytes or 0) for f in resp.dataset_files or [] if f})
            token = resp.next_page_token or None
            if not token:
                return files
        raise self._error(f"the file list of dataset {ref} does not end", "Report it; the lab stops here.")

    def own_datasets(self, search: str = "") -> list[DatasetInfo]:
        """The account's own datasets whose name holds `search`, with their size (every page)."""
        out: list[DatasetInfo] = []
        for page in range(1, 101):
            found = self._call(f"listing the datasets of {self.username}", lambda: self._api.dataset_list(
                mine=True, search=search or None, page=page)) or []
            out += [DatasetInfo(str(d.ref), str(d.title or ""), int(d.total_bytes or 0)) for d in found if d]
            if len(found) < DATASET_PAGE:
                break
        return out

    def delete_dataset(self, slug: str) -> None:
        """Deletes one of the account's own datasets; one already gone is no error."""
        owner, name = self._ref(slug, own=True)
        self._call(f"deleting dataset {owner}/{name}", lambda: self._api.dataset_delete(owner, name, no_confirm=True),
                   missing=(404,), own=True)


def upload_files(folder: Path) -> list[Path]:
    """The files of one flat folder to upload (the lab writes the metadata file itself)."""
    if not folder.is_dir():
        raise UserError(f"No such folder to upload: {folder}")
    entries = sorted(folder.iterdir())
    subfolders = [p.name for p in entries if p.is_dir()]
    if subfolders:
        raise UserError(f"{folder} has subfolders ({', '.join(subfolders)}); a dataset upload takes the "
                        "files of one flat folder.")
    files = [p.absolute() for p in entries if p.is_file()]
    if any(p.name in ("dataset-metadata.json", "datapackage.json") for p in files):
        raise UserError(f"{folder} holds a dataset-metadata.json; the lab writes its own: remove it.")
    if not files:
        raise UserError(f"{folder} has no files to upload.")
    return files


def _link(target: Path, link: Path) -> None:
    try:
        link.symlink_to(target)
    except OSError:  # e.g. Windows without the symlink privilege
        try:
            os.link(target, link)
        except OSError:
            shutil.copy2(target, link)
