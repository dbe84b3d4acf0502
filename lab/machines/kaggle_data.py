"""The hand-off datasets of a Kaggle link: the run's data and its checkpoint, uploaded once.

Datasets are flat folders owned by one Kaggle user:
- data: the run's prepared data folder, flattened, as the private dataset `lab-data-<data id>`;
  uploaded once per account and version, remembered in `$LAB_HOME/kaggle/holdings.json`,
  waited on until READY;
- checkpoint (continued runs): the newest checkpoint, its sidecar and the curve so far, as a new
  version of the private dataset `lab-ckpt-<run id>` (the hand-off: A's output was downloaded
  with A's credentials, B's copy is uploaded with B's), sha256 checked before the upload.

Each upload's intent is recorded before it is sent, so an upload whose record was lost in a
crash is found on Kaggle (a newer version) and adopted, never repeated.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from lab.config import UserError
from lab.corpus.manifests import data_id_of, read_manifest
from lab.home import lab_home
from lab.kaggle.client import AccountClient, KaggleError, get_account
from lab.faults import reached
from lab.kernel.checkpoint import atomic_write, checkpoint_meta, sha256_file
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.machines.base import env_seconds
from lab.runs import Link, Run, load_run, now, updating


@dataclass
class LinkContext:
    """What every step of one Kaggle link uses: the account's client, where to say what happens,
    and the settings."""
    c: AccountClient
    say: Callable[[str], None]
    settings: "KaggleSettings"


@dataclass(frozen=True)
class KaggleSettings:
    """How patient the lab is with Kaggle; each Kaggle host builds its own (`from_env`).
    `poll_s`: seconds between status polls of one kernel (Kaggle asks for 30-60 s; the person's
    setting LAB_KAGGLE_POLL_S); `retry_base_s`: the first backoff of a retried call;
    `dataset_wait_s`: how long a dataset may take to become READY; `overdue_s`: how long past its
    session timeout a kernel may still read RUNNING before the watch gives up on it;
    `input_wait_s`: the wait before pushing again a session that found its inputs not mounted yet."""
    poll_s: float = 30.0
    retry_base_s: float = 1.0
    dataset_wait_s: float = 3600.0
    overdue_s: float = 1800.0  # a session still running this long past its timeout: Kaggle lost it
    input_wait_s: float = 60.0  # before pushing again a session that found its inputs not mounted yet
    log_grace_s: float = 300.0  # running this long with no line in its log: Kaggle keeps the log until the end

    @classmethod
    def from_env(cls) -> "KaggleSettings":
        return cls(poll_s=env_seconds(POLL_ENV, cls.poll_s))


POLL_ENV = "LAB_KAGGLE_POLL_S"


def get_link(run_id: str, n: int) -> tuple[Run, Link]:
    run = load_run(run_id)
    return run, run.links[n - 1]


def set_link(run_id: str, n: int, *, status: str | None = None, **detail) -> Link:
    """Records detail keys (and the link's status) in one locked write."""
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.detail.update(detail)
        if status is not None:
            link.status = status
    return link


# ---------------------------------------------------------------------------------------------
# Names on Kaggle


def _slug(prefix: str, text: str) -> str:
    """A Kaggle slug (a-z, 0-9, '-', at most 50 characters); long names keep a hash of the whole."""
    body = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = f"{prefix}-{body}"
    if len(slug) > 50:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        slug = f"{slug[:41].rstrip('-')}-{digest}"
    return slug


def data_slug(data_id: str) -> str:
    return _slug("lab-data", data_id)


def ckpt_slug(run_id: str) -> str:
    return _slug("lab-ckpt", run_id)


def kernel_slug(run_id: str, n: int) -> str:
    return _slug("lab", f"{run_id}-l{n}")


def title_of(slug: str) -> str:
    """A dataset's title: its slug (6-50 characters, with the hash that keeps a long name
    unique), because Kaggle wants titles unique per owner and cutting a longer title at 50
    characters would lose exactly that hash."""
    return slug.rsplit("/", 1)[-1]


_LICENCE_PATTERNS = (  # (a pattern in a constellation's `licence`, Kaggle's name), first match wins
    (r"\bcc0\b", "CC0-1.0"), (r"public domain", "PDDL"),
    (r"cc[- ]by[- ]nc[- ]nd[- ]4", "CC-BY-NC-ND-4.0"), (r"cc[- ]by[- ]nc[- ]sa[- ]4", "CC-BY-NC-SA-4.0"),
    (r"cc[- ]by[- ]nc[- ]4", "CC-BY-NC-4.0"), (r"cc[- ]by[- ]nd[- ]4", "CC-BY-ND-4.0"),
    (r"cc[- ]by[- ]sa[- ]4", "CC-BY-SA-4.0"), (r"cc[- ]by[- ]sa[- ]3", "CC-BY-SA-3.0"),
    (r"cc[- ]by[- ]4", "CC-BY-4.0"), (r"cc[- ]by[- ]3", "CC-BY-3.0"), (r"\bagpl", "AGPL-3.0"),
    (r"\blgpl", "LGPL-3.0"), (r"\bgpl[- ]?(v)?2", "GPL-2.0"), (r"\bgpl", "GPL-3.0"), (r"\bgfdl|\bfdl", "FDL-1.3"),
    (r"\bodbl", "ODbL-1.0"), (r"apache", "apache-2.0"), (r"\bmit\b", "mit"))


def kaggle_licence(licences: list[str]) -> str:
    """The one licence name Kaggle takes for a dataset of these constellations' texts: their
    `licence` where every one maps to the same Kaggle licence (the first term named wins), else
    "other" (Kaggle's name for terms it does not list)."""
    names = set()
    for text in licences:
        found = next((name for pattern, name in _LICENCE_PATTERNS if re.search(pattern, text.lower())), "other")
        names.add(found)
    return names.pop() if len(names) == 1 else "other"


def data_licence(data_dir: Path) -> str:
    """The Kaggle licence of a prepared data folder, from its manifest's constellations."""
    constellations = (read_manifest(Path(data_dir)).get("constellations") or {}).values()
    return kaggle_licence([str(c.get("licence") or "") for c in constellations])


# ---------------------------------------------------------------------------------------------
# What each account holds: datasets uploaded, keyed by Kaggle user (datasets belong to users)


def _holdings_file() -> Path:
    return lab_home() / "kaggle" / "holdings.json"


@contextmanager
def _holdings() -> Iterator[dict]:
    """Read-modify-write of the holdings under a lock; written atomically."""
    path = _holdings_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(".holdings.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            yield data
            text = json.dumps(data, indent=1)
            atomic_write(path, lambda f: f.write(text.encode("utf-8")))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def held(username: str, kind: str, key: str) -> dict | None:
    """What the lab knows of the user's dataset for `key` (a data id or a checkpoint slug)."""
    path = _holdings_file()
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return (data.get(username.lower(), {}).get(kind) or {}).get(key)


def _set_held(username: str, kind: str, key: str, value: dict | None) -> None:
    with _holdings() as data:
        table = data.setdefault(username.lower(), {}).setdefault(kind, {})
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value


def holds(account: str, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
    """What of a run's next link the account already has, READY on Kaggle: {"data", "checkpoint"}."""
    try:
        username = get_account(account).username
    except UserError:
        return set()
    out = set()
    data = held(username, "data", data_id) if data_id else None
    if data and data.get("ready"):
        out.add("data")
    ckpt = held(username, "checkpoints", f"{username}/{ckpt_slug(run_id)}")
    if ckpt_sha256 and ckpt and ckpt.get("ready") and ckpt.get("sha256") == ckpt_sha256:
        out.add("checkpoint")
    return out


# ---------------------------------------------------------------------------------------------
# What goes up: the data folder flattened, the checkpoint with its curve


def put(src: Path, dst: Path) -> None:
    """A hard link where the filesystem allows (no copy of gigabytes), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def stage_data(data_dir: Path) -> Path:
    """The data folder as a flat folder for a dataset upload: `pydoc/train_0000.bin` becomes
    `pydoc__train_0000.bin` and the manifest names the flat files, so the training notebook
    reads the mounted dataset as it reads the folder here. Made once per data id."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    data_id = data_id_of(data_dir)
    stage = lab_home() / "kaggle" / "stage" / re.sub(r"[^A-Za-z0-9._+-]", "_", data_id)
    if (stage / "manifest.json").is_file():
        return stage
    tmp = stage.with_name(f".{stage.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    flat_manifest = json.loads(json.dumps(manifest))
    for entry in flat_manifest.get("train", []) + flat_manifest.get("val", []):
        flat = entry["path"].replace("/", "__")
        put(data_dir / entry["path"], tmp / flat)
        entry["path"] = flat
    tok = flat_manifest.get("tokenizer") or {}
    if tok.get("file"):
        flat = tok["file"].replace("/", "__")
        put(data_dir / tok["file"], tmp / flat)
        tok["file"] = flat
    (tmp / "manifest.json").write_text(json.dumps(flat_manifest, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    try:
        os.rename(tmp, stage)
    except OSError:  # another process staged it first: the same content
        shutil.rmtree(tmp, ignore_errors=True)
    return stage


def _metrics_beside(ckpt: Path, run_folder: Path) -> Path | None:
    """The curve up to a checkpoint: the run's own, else that of the run folder holding it."""
    if (run_folder / "metrics.jsonl").is_file():
        return run_folder / "metrics.jsonl"
    owner = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return owner / "metrics.jsonl" if (owner / "metrics.jsonl").is_file() else None


def stage_checkpoint(source: dict, run_folder: Path, dest: Path) -> str:
    """A flat folder with the checkpoint, its sidecar and the metrics up to its step; returns the
    sha256 of the checkpoint as staged, which must equal its sidecar's."""
    ckpt = Path(source["path"])
    sidecar = checkpoint_meta(ckpt)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    put(ckpt, dest / ckpt.name)
    digest = sha256_file(dest / ckpt.name)
    if not digest == sidecar["sha256"] == source["sha256"]:
        raise UserError(f"checkpoint {ckpt} changed or is corrupt (sha256 {digest[:12]}…, its sidecar says "
                        f"{sidecar['sha256'][:12]}…): the hand-off stops here rather than spread it")
    shutil.copyfile(ckpt.with_suffix(".json"), dest / ckpt.with_suffix(".json").name)
    metrics = _metrics_beside(ckpt, run_folder)
    if metrics is not None:
        write_metrics_lines(dest / "metrics.jsonl", metrics_lines(metrics, upto=source["step"]))
    return digest


def ensure_data(run_id: str, n: int, ctx: LinkContext, data_dir: Path) -> dict:
    """The run's data as the account's READY dataset, uploaded at most once."""
    _, link = get_link(run_id, n)
    if (link.detail.get("data") or {}).get("ready"):
        return link.detail["data"]
    data_id = data_id_of(data_dir)
    slug = f"{ctx.c.username}/{data_slug(data_id)}"
    record = _dataset_once(ctx, "data", data_id, slug, {"data_id": data_id}, lambda: stage_data(data_dir),
                           title=title_of(slug), notes=f"lab data {data_id}", licence=data_licence(data_dir),
                           note=lambda h, phase: set_link(run_id, n, data=h, phase=f"data {phase}"))
    return record


def ensure_checkpoint(run_id: str, n: int, ctx: LinkContext) -> dict | None:
    """The link's starting checkpoint as the account's READY dataset, uploaded at most once."""
    run, link = get_link(run_id, n)
    source = link.detail.get("source")
    if not source:
        return None
    if (link.detail.get("ckpt") or {}).get("ready"):
        return link.detail["ckpt"]
    slug = f"{ctx.c.username}/{ckpt_slug(run_id)}"
    staged: dict = {}

    def make_folder() -> Path:
        folder = run.folder / link.detail["folder"] / ".handoff"
        staged["sha256"] = stage_checkpoint(source, run.folder, folder)
        return folder

    match = {"sha256": source["sha256"], "name": source["name"], "step": source["step"]}
    licence = data_licence(Path(run.cfg.data_dir)) if run.cfg.data_dir else "other"  # weights of that text
    record = _dataset_once(ctx, "checkpoints", slug, slug, match, make_folder, title=title_of(slug), licence=licence,
                           notes=f"run {run_id} link {n}: {source['name']} sha256 {source['sha256']}",
                           note=lambda h, phase: set_link(run_id, n, ckpt_upload=h, phase=f"checkpoint {phase}"))
    shutil.rmtree(run.folder / link.detail["folder"] / ".handoff", ignore_errors=True)
    record = {**record, "sha256_source": source["sha256"], "sha256_staged": staged.get("sha256", record.get("sha256"))}
    set_link(run_id, n, ckpt=record, ckpt_upload=None, phase="checkpoint ready")
    return record


@contextmanager
def _dataset_lock(username: str, kind: str, key: str) -> Iterator[None]:
    """Held by the one process that uploads (or waits on) a user's dataset: a second process
    (another run's driver on the same data) waits here, then finds what the first recorded."""
    folder = lab_home() / "kaggle" / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(f"{username.lower()}\0{kind}\0{key}".encode()).hexdigest()[:32]
    with open(folder / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _dataset_once(ctx: LinkContext, kind: str, key: str, slug: str, match: dict, make_folder: Callable[[], Path],
                  *, title: str, notes: str, licence: str, note: Callable[[dict, str], None]) -> dict:
    """Makes sure the account's dataset `slug` holds this content (`match`) and is READY,
    uploading it only if no earlier process did. The intent is recorded (in the holdings, and
    through `note` in the link) before the upload with the version then current, so an upload
    whose record was lost in a crash is found (a newer version) and adopted, not repeated.
    One process at a time per dataset: an "uploading" record found here is a dead process's."""
    with _dataset_lock(ctx.c.username, kind, key):
        return _dataset_once_locked(ctx, kind, key, slug, match, make_folder, title=title, notes=notes,
                                    licence=licence, note=note)


def _dataset_once_locked(ctx: LinkContext, kind: str, key: str, slug: str, match: dict,
                         make_folder: Callable[[], Path], *, title: str, notes: str, licence: str,
                         note: Callable[[dict, str], None]) -> dict:
    c, say = ctx.c, ctx.say
    h = held(c.username, kind, key)
    if h and any(h.get(k) != v for k, v in match.items()):
        h = None  # another content (an older checkpoint): a new version is due
    if h and h.get("version") and not _dataset_present(c, slug):
        say(f"{c.account.name}: dataset {slug} is gone from Kaggle; uploading it again")
        _set_held(c.username, kind, key, None)
        h = None
    if h and h.get("uploading"):
        current = c.dataset_version(slug) or 0
        if current > h["before"]:
            h = {**h, "uploading": False, "version": current, "adopted": True}
            _set_held(c.username, kind, key, h)
        else:
            h = None
    if not h:
        before = c.dataset_version(slug) or 0
        intent = {"slug": slug, **match, "uploading": True, "before": before}
        _set_held(c.username, kind, key, intent)
        note(intent, "uploading")
        say(f"{c.account.name}: uploading {slug}")
        folder = make_folder()
        version = c.upload_dataset(slug, folder, title, notes, licence)
        reached(f"after-{kind}-upload")
        h = {"slug": slug, **match, "uploading": False, "before": before, "version": version,
             "uploaded_at": now()}
        _set_held(c.username, kind, key, h)
        note(h, "uploaded")
    if not h.get("ready"):
        try:
            version = c.wait_dataset_ready(slug, timeout_s=ctx.settings.dataset_wait_s,
                                           poll_s=min(10.0, ctx.settings.poll_s))
        except KaggleError as e:
            if "FAILED" in e.what:
                _set_held(c.username, kind, key, None)  # Kaggle dropped it: the next try uploads again
                todo = "`lab watch RUN` uploads it again."
            else:
                todo = f"{e.todo} The upload is recorded: `lab watch RUN` waits for it again without uploading it twice."
            raise KaggleError(e.account, e.what, todo, status=e.status, retryable=e.retryable) from None
        h = {**h, "ready": True, "version": max(int(h.get("version") or 0), version), "ready_at": now()}
        _set_held(c.username, kind, key, h)
    record = {k: v for k, v in h.items() if k not in ("uploading", "before")}
    note(record, "ready")
    return record


def _dataset_present(c: AccountClient, slug: str) -> bool:
    try:
        return c.dataset_version(slug) is not None
    except KaggleError as e:
        if e.status in (403, 404):
            return False
        raise


def forget_dataset(username: str, slug: str) -> None:
    with _holdings() as data:
        for table in data.get(username.lower(), {}).values():
            for key in [k for k, v in table.items() if v.get("slug") == slug]:
                del table[key]



# ---------------------------------------------------------------------------------------------
# Checkpoint datasets of finished runs


def checkpoint_datasets(c: AccountClient) -> list[dict]:
    """The account's checkpoint datasets (`lab-ckpt-<run id>`) with their size, the run each
    belongs to (None: no run of this lab's registry) and whether that run has finished, so the
    dataset may go: a run still going on needs its hand-off."""
    from lab.runs import list_runs
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
    """Deletes a checkpoint dataset on Kaggle and forgets it was held there."""
    c.delete_dataset(slug)
    forget_dataset(c.username, slug if "/" in slug else f"{c.username}/{slug}")
