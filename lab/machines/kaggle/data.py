"""The hand-off datasets of a Kaggle link, flat folders owned by one Kaggle user and uploaded once: the
run's prepared data (`lab-data-<data id>`, once per account, remembered in `$LAB_HOME/kaggle/holdings.json`)
and, for a continued run, its checkpoint with its sidecar and the curve so far (a new version of
`lab-ckpt-<run id>`: A's output downloaded with A's credentials, B's copy uploaded with B's). Each upload's
intent is recorded before it is sent, so an upload whose record a crash lost is found on Kaggle and adopted.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from lab.config import UserError
from lab.corpus.folders import atomic_folder
from lab.corpus.manifests import data_id_of, read_manifest
from lab.faults import reached
from lab.home import lab_home
from lab.kaggle.client import AccountClient, KaggleError
from lab.kaggle.datasets import STORAGE_HINT, upload_files
from lab.machines.base import env_seconds
from lab.machines.control import read_json, write_json
from lab.machines.handoff import put, stage_checkpoint
from lab.machines.kaggle.names import ckpt_slug, data_licences, data_slug, kaggle_licence, licence_note, title_of
from lab.machines.kaggle.record import KaggleLinkRecord
from lab.machines.lifecycle import Away, get_link
from lab.runs import list_runs, now


@dataclass
class LinkContext:
    c: AccountClient
    say: Callable[[str], None]
    settings: KaggleSettings


@dataclass(frozen=True)
class KaggleSettings:
    """How patient the lab is with Kaggle; each Kaggle host builds its own (`from_env`)."""
    poll_s: float = 30.0  # between status polls of one kernel (Kaggle asks for 30-60 s; LAB_KAGGLE_POLL_S)
    retry_base_s: float = 1.0  # the first backoff of a retried call
    dataset_wait_s: float = 3600.0  # how long a dataset may take to become READY
    unsure_wait_s: float = 300.0  # a push with no clear answer whose kernel never shows this long started nothing
    start_wait_s: float = 3 * 3600.0  # a GPU session normally starts within minutes: three hours unstarted is lost
    input_wait_s: float = 60.0  # before pushing again a session that found its inputs not mounted yet
    log_grace_s: float = 300.0  # running this long with no line in its log: Kaggle keeps the log until the end
    allow_cpu: bool = False  # no cards: train on the CPU, not stop (LAB_KAGGLE_ALLOW_CPU=1; the emulator has no GPU)

    @classmethod
    def from_env(cls) -> "KaggleSettings":
        return cls(poll_s=env_seconds("LAB_KAGGLE_POLL_S", cls.poll_s), allow_cpu=env_flag("LAB_KAGGLE_ALLOW_CPU"))


def env_flag(var: str) -> bool:
    """A yes/no setting of the person's: 1, true, yes or on is yes; unset or 0 is no."""
    raw = os.environ.get(var, "").strip().lower()
    if raw not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
        raise UserError(f"{var}={raw!r}: use 1 (yes) or 0 (no)")
    return raw in ("1", "true", "yes", "on")


def _holdings_file() -> Path:
    return lab_home() / "kaggle" / "holdings.json"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (closing the file drops it)
        yield


@contextmanager
def _holdings() -> Iterator[dict]:
    path = _holdings_file()
    with _locked(path.with_name(".holdings.lock")):
        data = read_json(path) or {}
        yield data
        write_json(path, data)


def held(username: str, kind: str, key: str) -> dict | None:
    return ((read_json(_holdings_file()) or {}).get(username.lower(), {}).get(kind) or {}).get(key)


def _set_held(username: str, kind: str, key: str, value: dict | None) -> None:
    with _holdings() as data:
        table = data.setdefault(username.lower(), {}).setdefault(kind, {})
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value


def stage_data(data_dir: Path) -> Path:
    """The data folder flattened for a dataset upload (`pydoc/train_0000.bin` as `pydoc__train_0000.bin`,
    named so in the manifest: the notebook reads the mounted dataset as the folder here). Once per data id."""
    manifest = read_manifest(data_dir)
    data_id = data_id_of(data_dir)
    stage = lab_home() / "kaggle" / "stage" / re.sub(r"[^A-Za-z0-9._+-]", "_", data_id)
    if (stage / "manifest.json").is_file():
        return stage
    with atomic_folder(stage.parent, stage.name) as tmp:  # another process's, staged first, is the same
        flat_manifest = json.loads(json.dumps(manifest))
        tok = flat_manifest.get("tokenizer") or {}
        files = [(entry, "path") for entry in flat_manifest.get("train", []) + flat_manifest.get("val", [])]
        for entry, key in files + ([(tok, "file")] if tok.get("file") else []):
            flat = entry[key].replace("/", "__")
            put(data_dir / entry[key], tmp / flat)
            entry[key] = flat
        (tmp / "manifest.json").write_text(json.dumps(flat_manifest, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")
    return stage


@dataclass(frozen=True)
class Upload:
    """One dataset the account must hold: `kind` and `key` name it in the holdings, `match` is its content."""
    kind: str
    key: str
    slug: str
    match: dict
    make_folder: Callable[[], Path]
    notes: str
    licences: list[str]  # the terms of the data's texts (lab.machines.kaggle.names.kaggle_licence)


def ensure_data(run_id: str, n: int, ctx: LinkContext, data_dir: Path) -> None:
    if (KaggleLinkRecord.of(get_link(run_id, n)[1]).data or {}).get("ready"):
        return
    data_id = data_id_of(data_dir)
    slug = f"{ctx.c.username}/{data_slug(data_id)}"
    data = _dataset_once(ctx, Upload("data", data_id, slug, {"data_id": data_id}, lambda: stage_data(data_dir),
                                     f"lab data {data_id}", data_licences(data_dir)))
    KaggleLinkRecord.update(run_id, n, data=data)


def ensure_checkpoint(run_id: str, n: int, ctx: LinkContext) -> None:
    run, link = get_link(run_id, n)
    source = Away.of(link).source
    if not source or (KaggleLinkRecord.of(link).ckpt or {}).get("ready"):
        return
    slug = f"{ctx.c.username}/{ckpt_slug(run_id)}"
    folder = run.folder / Away.of(link).folder / ".handoff"
    staged: dict = {}

    def make_folder() -> Path:
        staged["sha256"] = stage_checkpoint(source, run.folder, folder)
        return folder

    match = {"sha256": source["sha256"], "name": source["name"], "step": source["step"]}
    texts = data_licences(Path(run.cfg.data_dir)) if run.cfg.data_dir else []  # weights of that text
    held_now = _dataset_once(ctx, Upload("checkpoints", slug, slug, match, make_folder,
                                       f"run {run_id} link {n}: {source['name']} sha256 {source['sha256']}", texts))
    shutil.rmtree(folder, ignore_errors=True)
    KaggleLinkRecord.update(run_id, n, ckpt={**held_now, "sha256_source": source["sha256"],
                                             "sha256_staged": staged.get("sha256", held_now.get("sha256"))})


def _dataset_once(ctx: LinkContext, up: Upload) -> dict:
    """Makes sure the account's dataset `up.slug` holds this content (`up.match`), READY and holding the
    files sent, uploading it only if no earlier process did (its intent recorded first, with the version
    then current). One process at a time per dataset (another run's driver on the same data waits, then reads
    what the first recorded): an "uploading" record found here is a dead process's."""
    name = hashlib.sha256(f"{ctx.c.username.lower()}\0{up.kind}\0{up.key}".encode()).hexdigest()[:32]
    with _locked(lab_home() / "kaggle" / "locks" / f"{name}.lock"):
        for attempt in (1, 2):
            h = _known_upload(ctx, up) or _upload(ctx, up)
            if not h.get("ready"):
                h = _wait_ready(ctx, up, h)
            if h.get("verified"):
                break
            try:
                h = _verify(ctx, up, h)
                break
            except NotKept as e:  # forgotten: the next turn uploads it once more, by itself
                if attempt == 2:
                    raise NotKept(e.account, e.what, f"It was uploaded twice and listed again after waits; "
                                                     f"{STORAGE_HINT} The run goes on on another account.") from None
                ctx.say(f"{e}; uploading it once more")
    return {k: v for k, v in h.items() if k not in ("uploading", "before", "files")}


def _known_upload(ctx: LinkContext, up: Upload) -> dict | None:
    """What the holdings say of this content, checked against Kaggle: None when a (new) upload is due."""
    c = ctx.c
    h = held(c.username, up.kind, up.key)
    if not h or any(h.get(k) != v for k, v in up.match.items()):
        return None  # none, or another content (an older checkpoint): a new version is due
    if h.get("version") and c.dataset_version(up.slug) is None:  # on one's own, 403 and 404 read None
        ctx.say(f"{c.account.name}: dataset {up.slug} is gone from Kaggle; uploading it again")
        _set_held(c.username, up.kind, up.key, None)
        return None
    if h.get("uploading"):
        current = c.dataset_version(up.slug) or 0
        if current <= h["before"]:
            return None
        h = {**h, "uploading": False, "version": current, "adopted": True}
        _set_held(c.username, up.kind, up.key, h)
    return h


def _upload(ctx: LinkContext, up: Upload) -> dict:
    c = ctx.c
    folder = up.make_folder()
    files = {f.name: f.stat().st_size for f in upload_files(folder)}  # what a version must hold
    before = c.dataset_version(up.slug) or 0
    intent = {"slug": up.slug, **up.match, "uploading": True, "before": before, "files": files}
    _set_held(c.username, up.kind, up.key, intent)
    licence = kaggle_licence(up.licences)
    ctx.say(f"{c.account.name}: uploading {up.slug} ({licence_note(up.licences, licence)})")
    version = c.upload_dataset(up.slug, folder, title_of(up.slug), up.notes, licence,
                               ready_wait_s=ctx.settings.dataset_wait_s)
    reached(f"after-{up.kind}-upload")
    h = {**intent, "uploading": False, "version": version, "uploaded_at": now(), "licence": licence}
    _set_held(c.username, up.kind, up.key, h)
    return h


def _wait_ready(ctx: LinkContext, up: Upload, h: dict) -> dict:
    c = ctx.c
    try:
        version = c.wait_dataset_ready(up.slug, timeout_s=ctx.settings.dataset_wait_s,
                                       poll_s=min(10.0, ctx.settings.poll_s))
    except KaggleError as e:
        if "(FAILED)" in e.what or " DELETED " in e.what:
            _set_held(c.username, up.kind, up.key, None)  # Kaggle dropped it: the next try uploads again
            todo = "`lab watch RUN` uploads it again."
        else:
            todo = f"{e.todo} The upload is recorded: `lab watch RUN` waits for it again without uploading it twice."
        raise KaggleError(e.account, e.what, todo, status=e.status, retryable=e.retryable, cause=e.cause,
                          wait_s=e.wait_s) from None
    h = {**h, "ready": True, "version": max(int(h.get("version") or 0), version), "ready_at": now()}
    _set_held(c.username, up.kind, up.key, h)
    return h


class NotKept(KaggleError):
    """A READY version does not hold the files sent (by name and size), listed again after waits."""


LISTING_TRIES = 4  # a READY version's file list is read this often, a poll apart, before it counts as lacking


def _verify(ctx: LinkContext, up: Upload, h: dict) -> dict:
    """Checks that the READY version holds the files sent, by name and size (the session hashes their
    content before it trains). A list may lag behind READY: it is read LISTING_TRIES times, a poll apart;
    a version that still lacks a file is forgotten (NotKept). An adopted upload without its files is taken."""
    c, sent = ctx.c, h.get("files")
    for attempt in range(1, LISTING_TRIES + 1 if sent else 1):
        stored = c.dataset_files(up.slug, h.get("version"))
        missing = sorted(set(sent) - set(stored))
        resized = sorted(f for f in set(sent) & set(stored) if stored[f] != sent[f])
        if not (missing or resized):
            break
        what = "; ".join(filter(None, [f"missing {', '.join(missing)}" if missing else "",
                                       f"another size: {', '.join(resized)}" if resized else ""]))
        if attempt == LISTING_TRIES:
            _set_held(c.username, up.kind, up.key, None)
            raise NotKept(c.account.name, f"version {h.get('version')} of dataset {up.slug} does not hold what "
                                          f"was sent ({what})", f"`lab watch RUN` uploads it again. {STORAGE_HINT}")
        ctx.say(f"{c.account.name}: the file list of {up.slug} lacks what was sent ({what}); listing it again in "
                f"{ctx.settings.poll_s:g} s (try {attempt + 1} of {LISTING_TRIES})")
        time.sleep(ctx.settings.poll_s)
    h = {**h, "verified": True}
    _set_held(c.username, up.kind, up.key, h)
    return h


def forget_dataset(username: str, slug: str) -> None:
    with _holdings() as data:
        for table in data.get(username.lower(), {}).values():
            for key in [k for k, v in table.items() if v.get("slug") == slug]:
                del table[key]


def checkpoint_datasets(c: AccountClient) -> list[dict]:
    """The account's checkpoint datasets with their size, their run and whether it finished (so it may go)."""
    runs = {ckpt_slug(r.id): r for r in list_runs()}
    out = []
    for d in c.own_datasets(search="lab-ckpt-"):
        name = d.slug.rsplit("/", 1)[-1]
        if not name.startswith("lab-ckpt-"):
            continue
        run = runs.get(name)
        finished = run is None or run.status in ("done", "failed", "cancelled", "stopped")
        out.append({"slug": d.slug, "bytes": d.bytes, "run": run.id if run else None,
                    "status": run.status if run else "not in this lab", "finished": finished})
    return out


def remove_checkpoint_dataset(c: AccountClient, slug: str) -> None:
    c.delete_dataset(slug)
    forget_dataset(c.username, slug if "/" in slug else f"{c.username}/{slug}")


def account_storage(c: AccountClient) -> dict:
    """{"bytes", "datasets", "lab_bytes", "lab_datasets"}: what the account's datasets take, all and the lab's."""
    found = c.own_datasets()
    lab = [d for d in found if d.slug.rsplit("/", 1)[-1].startswith("lab-")]
    return {"bytes": sum(d.bytes for d in found), "datasets": len(found),
            "lab_bytes": sum(d.bytes for d in lab), "lab_datasets": len(lab)}
