"""A Kaggle account as a machine: one link of a run, driven so a restart loses and repeats nothing.

A link on an account goes through these phases, each recorded in the run registry
(`link.detail`) before and after its side effect, so the control side may die anywhere and
`lab watch RUN` picks up where it stopped:

1. data: the run's prepared data folder, flattened (datasets are flat folders), as a private
   dataset `lab-data-<data id>` owned by the account; uploaded once per account and version,
   remembered in `$LAB_HOME/kaggle/holdings.json`, waited on until READY;
2. checkpoint (continued runs): the newest checkpoint, its sidecar and the curve so far, as a
   new version of the private dataset `lab-ckpt-<run id>` owned by the account (the hand-off:
   A's output was downloaded with A's credentials, B's copy is uploaded with B's), sha256
   checked before the upload;
3. push: the parameterized training notebook as a private kernel `lab-<run id>-l<n>` (one kernel
   per link, so "was it pushed?" is a question Kaggle can answer), 2×T4, internet off, the two
   datasets as sources, `resume_from` = the checkpoint dataset's mount name;
4. watch: status polled no more often than every `LAB_KAGGLE_POLL_S` (30 s), backing off while
   nothing changes; the log tail saved as `live.log`;
5. download: the session's outputs into `runs/<id>/links/<n>-<account>/`, the checkpoint's sha256
   checked against its sidecar;
6. merge: the run folder's `metrics.jsonl`, `checkpoints/`, `loss.png` updated, so the curve reads
   as one line across links.

Kaggle's public API cannot cancel a batch session: `CancelKernelSession` needs a
`kernelSessionId` that no reply of the public client carries (SaveKernel, GetKernelSessionStatus,
ListKernelSessionOutput, GetKernel, ListKernels: checked in kagglesdk 0.1.38). A cancel stops the
run from going on and tells the person where to press Stop; the session's output is still
downloaded when it ends.
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
from pathlib import Path
from typing import Callable, Iterator

from lab.kernel.checkpoint import (atomic_write, checkpoint_meta, list_checkpoints, place_checkpoint, resolve_checkpoint,
                                   sha256_file, verify_checkpoint)
from lab.corpus.manifests import data_id_of, read_manifest
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.config import RunConfig, UserError
from lab.home import lab_home
from lab.kaggle.client import AccountClient, KaggleError, RetryPolicy, client_for, get_account, notebook_text
from lab.runs import Link, Run, load_run, now, updating
from lab.sizing import STARTUP_MIN  # a session's start, data mount and final save, spent from quota

# Settings. Production values; tests shorten them through the environment.
POLL_ENV = "LAB_KAGGLE_POLL_S"  # seconds between status polls of one kernel
TIME_SCALE_ENV = "LAB_KAGGLE_TIME_SCALE"  # platform seconds per wall second: 1 on Kaggle, 60 in the emulator tests
DATASET_WAIT_ENV = "LAB_KAGGLE_DATASET_WAIT_S"  # how long a dataset may take to become READY
RETRY_ENV = "LAB_KAGGLE_RETRY_S"  # first backoff of the client's retries
CRASH_ENV = "LAB_KAGGLE_CRASH_AT"  # tests: the control side dies at this point (see `_crash_point`)
DEFAULT_POLL_S = 30.0
DEFAULT_DATASET_WAIT_S = 3600.0
MAX_POLL_FACTOR = 4  # status polls back off to 4 × the poll interval while nothing changes
LOG_EVERY_POLLS = 4  # the log tail is fetched every 4th poll: at most one extra call per 2 minutes
WATCH_PATIENCE_POLLS = 120  # Kaggle unreachable this long (1 hour at 30 s) while watching: give up for now

MIN_LINK_MIN = 5.0  # a link shorter than this is not worth starting
KAGGLE_SESSION_S = 12 * 3600
MAX_GPU_SESSIONS = 2  # batch GPU sessions an account may run at once (Kaggle's docs)
TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")


def poll_s() -> float:
    return _env_float(POLL_ENV, DEFAULT_POLL_S)


def time_scale() -> float:
    return _env_float(TIME_SCALE_ENV, 1.0)


def dataset_wait_s() -> float:
    return _env_float(DATASET_WAIT_ENV, DEFAULT_DATASET_WAIT_S)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise UserError(f"{name} must be positive (got {raw})")
    return value


def client(account: str) -> AccountClient:
    """The account's client with the lab's retry policy (its first backoff a setting)."""
    base = _env_float(RETRY_ENV, 1.0)
    return client_for(account, retry=RetryPolicy(attempts=6, base_s=base, cap_s=60 * base))


def _crash_point(name: str) -> None:
    """Tests make the control side die exactly here, as a crash or a kill would, to show that
    the next `lab watch` neither loses nor repeats what was done just before."""
    if os.environ.get(CRASH_ENV) == name:
        os._exit(75)


class LinkRefused(UserError):
    """Kaggle refused the push and started nothing: `kind` is "busy" (the account runs its
    maximum of GPU sessions), "quota" (none left) or "other"."""

    def __init__(self, error: KaggleError, kind: str):
        self.error, self.kind, self.account = error, kind, error.account
        super().__init__(str(error))


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


def _title(text: str) -> str:
    """A dataset title: Kaggle wants 6-50 characters."""
    return text[:50] if len(text) >= 6 else (text + " " * 6)[:6]


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


def _put(src: Path, dst: Path) -> None:
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
        _put(data_dir / entry["path"], tmp / flat)
        entry["path"] = flat
    tok = flat_manifest.get("tokenizer") or {}
    if tok.get("file"):
        flat = tok["file"].replace("/", "__")
        _put(data_dir / tok["file"], tmp / flat)
        tok["file"] = flat
    (tmp / "manifest.json").write_text(json.dumps(flat_manifest, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    try:
        os.rename(tmp, stage)
    except OSError:  # another process staged it first: the same content
        shutil.rmtree(tmp, ignore_errors=True)
    return stage


_verified: dict[str, tuple[int, int, dict]] = {}  # path -> (mtime_ns, size, source): hashed once


def source_checkpoint(run: Run) -> dict | None:
    """The checkpoint the run's next link starts from, verified against its sidecar: the run
    folder's newest (every link's is merged there), else the one a forked run started from."""
    found = list_checkpoints(run.folder / "checkpoints")
    if found:
        target = run.folder
    elif run.parent and run.parent.get("checkpoint"):
        target = Path(run.parent["checkpoint"])
    else:
        return None
    newest = found[-1] if found else target
    if newest.is_file():  # a waiting driver asks often: a checkpoint of gigabytes is hashed once
        st = newest.stat()
        hit = _verified.get(str(newest))
        if hit and hit[:2] == (st.st_mtime_ns, st.st_size):
            return dict(hit[2])
    try:
        path = resolve_checkpoint(target)
    except ValueError as e:
        raise UserError(f"run {run.id}: {e}") from None
    meta = checkpoint_meta(path)
    source = {"path": str(path), "name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
    st = path.stat()
    _verified[str(path)] = (st.st_mtime_ns, st.st_size, source)
    return dict(source)


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
    _put(ckpt, dest / ckpt.name)
    digest = sha256_file(dest / ckpt.name)
    if not digest == sidecar["sha256"] == source["sha256"]:
        raise UserError(f"checkpoint {ckpt} changed or is corrupt (sha256 {digest[:12]}…, its sidecar says "
                        f"{sidecar['sha256'][:12]}…): the hand-off stops here rather than spread it")
    shutil.copyfile(ckpt.with_suffix(".json"), dest / ckpt.with_suffix(".json").name)
    metrics = _metrics_beside(ckpt, run_folder)
    if metrics is not None:
        write_metrics_lines(dest / "metrics.jsonl", metrics_lines(metrics, upto=source["step"]))
    return digest


# ---------------------------------------------------------------------------------------------
# The notebook that is pushed


def kernel_notebook(cfg: RunConfig, resume_name: str, limit_min: float) -> dict:
    """The training notebook with this link's parameters: data found under /kaggle/input, the
    checkpoint dataset's mount name as `resume_from`, the link's time limit."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from lab.notebooks import TRAIN_NOTEBOOK, parameterized
    scale = time_scale()  # the notebook's clock is the wall clock; the emulator's runs faster
    link_cfg = RunConfig.from_dict({**cfg.to_dict(), "data_dir": "", "resume_from": resume_name,
                                    "limit_min": limit_min / scale,
                                    "checkpoint_every_min": cfg.checkpoint_every_min / scale})
    params = parameterized(link_cfg, out_dir="", nproc=0, plot_every_s=30)
    nb = load_notebook_node(str(TRAIN_NOTEBOOK))  # as papermill reads it: every cell with its tags
    nb = parameterize_notebook(nb, params, kernel_name="python3", language="python")
    return json.loads(nbformat.writes(nb))


def link_limit_min(run_limit_min: float, quota_left_s: float) -> float:
    """A link's time limit: the run's, or what the account's quota allows after the start-up,
    so a link normally ends by its own time-limit save rather than by Kaggle's kill."""
    return round(min(run_limit_min, quota_left_s / 60 - STARTUP_MIN), 3)


# ---------------------------------------------------------------------------------------------
# The registry of one link


def _get(run_id: str, n: int) -> tuple[Run, Link]:
    run = load_run(run_id)
    return run, run.links[n - 1]


def _set(run_id: str, n: int, *, status: str | None = None, **detail) -> Link:
    """Records detail keys (and the link's status) in one locked write."""
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.detail.update(detail)
        if status is not None:
            link.status = status
    return link


def plan_link(run_id: str, account: str, quota_left_s: float, source: dict | None, why: str = "") -> Link:
    """Appends a link on `account` to the run, before anything is sent to Kaggle."""
    username = get_account(account).username
    with updating(run_id) as run:
        cfg = run.cfg
        n = len(run.links) + 1
        limit = link_limit_min(cfg.limit_min, quota_left_s)
        link = Link(n=n, machine=account, status="starting", from_step=source["step"] if source else 0)
        link.detail = {"kind": "kaggle", "account": account, "user": username, "phase": "planned",
                       "folder": f"links/{n:03d}-{account}", "limit_min": limit,
                       "session_timeout_s": int(min(KAGGLE_SESSION_S, (limit + STARTUP_MIN) * 60)),
                       "source": source, "why": why}
        run.links.append(link)
        run.status = "running"
    return link


# ---------------------------------------------------------------------------------------------
# One link, from wherever its record says it is


def run_link(run_id: str, n: int, data_dir: Callable[[], Path], *, say: Callable[[str], None] = print,
             cancelled: Callable[[], bool] = lambda: False) -> Link:
    """Drives link `n` of the run to its end and merges its outputs; returns the final link.

    Raises LinkRefused when Kaggle refused the push (nothing started), and UserError
    (KaggleError included) when something before the push failed: the link is then marked
    failed, with every upload that was done recorded, so the next try repeats none of it.
    """
    _, link = _get(run_id, n)
    c = client(link.machine)
    if link.status == "starting":
        try:
            if not _pushing(link) and cancelled():  # before any upload: nothing goes up, no session starts
                return _cancel_before_push(run_id, n)
            data = _ensure_data(run_id, n, c, data_dir(), say)
            ckpt = _ensure_checkpoint(run_id, n, c, say)
            if not _pushing(_get(run_id, n)[1]) and cancelled():
                return _cancel_before_push(run_id, n)
            _ensure_pushed(run_id, n, c, data, ckpt, say)
        except UserError as e:  # LinkRefused included
            _fail_before_push(run_id, n, str(e))
            raise
    status, failure = _watch(run_id, n, c, say, cancelled)
    _download(run_id, n, c, say)
    return _finish(run_id, n, status, failure, say)


def _pushing(link: Link) -> bool:
    """Whether a push was sent (or maybe sent): a session may run, so a cancel cannot skip it."""
    kernel = link.detail.get("kernel") or {}
    return bool(kernel.get("pushed_at") or kernel.get("pushing"))


def _cancel_before_push(run_id: str, n: int) -> Link:
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.status, link.ended, link.reason = "cancelled", now(), "cancelled before its push"
    return link


def _fail_before_push(run_id: str, n: int, reason: str) -> None:
    with updating(run_id) as run:
        link = run.links[n - 1]
        kernel = link.detail.get("kernel") or {}
        if kernel.get("pushed_at") or kernel.get("pushing"):
            return  # pushed, or maybe: the next try watches it, or asks Kaggle whether it is there
        link.status, link.ended, link.reason = "failed", now(), reason


def _ensure_data(run_id: str, n: int, c: AccountClient, data_dir: Path, say) -> dict:
    _, link = _get(run_id, n)
    if (link.detail.get("data") or {}).get("ready"):
        return link.detail["data"]
    data_id = data_id_of(data_dir)
    slug = f"{c.username}/{data_slug(data_id)}"
    record = _dataset_once(c, "data", data_id, slug, {"data_id": data_id}, lambda: stage_data(data_dir),
                           title=_title(f"lab data {data_id}"), notes=f"lab data {data_id}", say=say,
                           note=lambda h, phase: _set(run_id, n, data=h, phase=f"data {phase}"))
    return record


def _ensure_checkpoint(run_id: str, n: int, c: AccountClient, say) -> dict | None:
    run, link = _get(run_id, n)
    source = link.detail.get("source")
    if not source:
        return None
    if (link.detail.get("ckpt") or {}).get("ready"):
        return link.detail["ckpt"]
    slug = f"{c.username}/{ckpt_slug(run_id)}"
    staged: dict = {}

    def make_folder() -> Path:
        folder = run.folder / link.detail["folder"] / ".handoff"
        staged["sha256"] = stage_checkpoint(source, run.folder, folder)
        return folder

    match = {"sha256": source["sha256"], "name": source["name"], "step": source["step"]}
    record = _dataset_once(c, "checkpoints", slug, slug, match, make_folder,
                           title=_title(f"lab ckpt {run_id}"),
                           notes=f"run {run_id} link {n}: {source['name']} sha256 {source['sha256']}", say=say,
                           note=lambda h, phase: _set(run_id, n, ckpt_upload=h, phase=f"checkpoint {phase}"))
    shutil.rmtree(run.folder / link.detail["folder"] / ".handoff", ignore_errors=True)
    record = {**record, "sha256_source": source["sha256"], "sha256_staged": staged.get("sha256", record.get("sha256"))}
    _set(run_id, n, ckpt=record, ckpt_upload=None, phase="checkpoint ready")
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


def _dataset_once(c: AccountClient, kind: str, key: str, slug: str, match: dict, make_folder: Callable[[], Path],
                  *, title: str, notes: str, say, note: Callable[[dict, str], None]) -> dict:
    """Makes sure the account's dataset `slug` holds this content (`match`) and is READY,
    uploading it only if no earlier process did. The intent is recorded (in the holdings, and
    through `note` in the link) before the upload with the version then current, so an upload
    whose record was lost in a crash is found (a newer version) and adopted, not repeated.
    One process at a time per dataset: an "uploading" record found here is a dead process's."""
    with _dataset_lock(c.username, kind, key):
        return _dataset_once_locked(c, kind, key, slug, match, make_folder, title=title, notes=notes, say=say,
                                    note=note)


def _dataset_once_locked(c: AccountClient, kind: str, key: str, slug: str, match: dict,
                         make_folder: Callable[[], Path], *, title: str, notes: str, say,
                         note: Callable[[dict, str], None]) -> dict:
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
        version = c.upload_dataset(slug, folder, title, notes)
        _crash_point(f"after-{kind}-upload")
        h = {"slug": slug, **match, "uploading": False, "before": before, "version": version,
             "uploaded_at": now()}
        _set_held(c.username, kind, key, h)
        note(h, "uploaded")
    if not h.get("ready"):
        try:
            version = c.wait_dataset_ready(slug, timeout_s=dataset_wait_s(), poll_s=min(10.0, poll_s()))
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


def _kernel_exists(c: AccountClient, slug: str) -> bool:
    try:
        c.kernel_status(slug)
        return True
    except KaggleError as e:
        if e.status in (403, 404):
            return False
        raise


def _ensure_pushed(run_id: str, n: int, c: AccountClient, data: dict, ckpt: dict | None, say) -> dict:
    run, link = _get(run_id, n)
    kernel = link.detail.get("kernel") or {}
    if kernel.get("pushed_at"):
        return kernel
    slug = f"{c.username}/{kernel_slug(run_id, n)}"
    if kernel.get("pushing") and _kernel_exists(c, slug):
        # The push was sent by a process that died before it recorded the reply: it is done.
        return _record_push(run_id, n, {**kernel, "version": None, "url": "", "adopted": True}, say)
    sources = [data["slug"]] + ([ckpt["slug"]] if ckpt else [])
    resume_name = ckpt["slug"].split("/")[1] if ckpt else ""
    nb = kernel_notebook(run.cfg, resume_name, link.detail["limit_min"])
    folder = run.folder / link.detail["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pushed.ipynb").write_text(notebook_text(nb), encoding="utf-8")  # the push as sent
    kernel = {"slug": slug, "pushing": True, "sources": sources,
              "notebook_bytes": (folder / "pushed.ipynb").stat().st_size}
    with updating(run_id) as r:
        r.links[n - 1].detail.update(kernel=kernel, phase="pushing")
        r.links[n - 1].notebook = f"{link.detail['folder']}/pushed.ipynb"
    name = slug.split("/")[1]
    try:
        pushed = c.push_kernel(slug, name, nb, dataset_sources=sources,
                               timeout_s=link.detail["session_timeout_s"], gpu=True, internet=False, private=True)
    except KaggleError as e:
        if e.push is not None:  # Kaggle ran it, without some sources: the session is real
            dropped = [s for s in sources if s in e.what] or sources
            for source in dropped:  # what the lab remembered is wrong: forget it, upload again next time
                _forget_dataset(c.username, source)
            say(f"warning: {e}")
            return _record_push(run_id, n, {**kernel, "version": e.push.version, "url": e.push.url,
                                            "dropped_sources": dropped, "error": str(e)}, say)
        if e.unsure:
            if _appears(c, slug):
                return _record_push(run_id, n, {**kernel, "version": None, "url": "", "adopted": True}, say)
            # Not seen yet is not "not taken": Kaggle may list it later. No second push now; the
            # record keeps "pushing", so the next `lab watch` asks Kaggle again before it pushes.
            raise KaggleError(e.account, e.what, "`lab watch RUN` asks Kaggle again whether the kernel is there "
                                                 "before it pushes, so no second session starts.",
                              status=e.status, unsure=True) from None
        _set(run_id, n, kernel={**kernel, "pushing": False, "refused": e.what})
        raise LinkRefused(e, _refusal_kind(e)) from None
    _crash_point("after-push")
    return _record_push(run_id, n, {**kernel, "version": pushed.version, "url": pushed.url}, say)


def _appears(c: AccountClient, slug: str, tries: int = 3) -> bool:
    """Whether a push with no clear answer did create the kernel (asked a few times, a poll apart)."""
    for i in range(tries):
        time.sleep(poll_s() if i else min(poll_s(), 5.0))
        if _kernel_exists(c, slug):
            return True
    return False


def _refusal_kind(e: KaggleError) -> str:
    if "GPU session" in e.what:
        return "busy"
    if "quota" in e.what.lower():
        return "quota"
    return "other"


def _forget_dataset(username: str, slug: str) -> None:
    with _holdings() as data:
        for table in data.get(username.lower(), {}).values():
            for key in [k for k, v in table.items() if v.get("slug") == slug]:
                del table[key]


def _record_push(run_id: str, n: int, kernel: dict, say) -> dict:
    kernel = {**kernel, "pushing": False, "pushed_at": now()}
    _set(run_id, n, status="running", kernel=kernel, phase="pushed")
    say(f"link {n}: pushed {kernel['slug']}" + (f" version {kernel['version']}" if kernel.get("version") else "")
        + (f" ({kernel['url']})" if kernel.get("url") else ""))
    return kernel


def _watch(run_id: str, n: int, c: AccountClient, say, cancelled: Callable[[], bool]) -> tuple[str, str]:
    """Polls the session until it ends; returns (status, failure message)."""
    run, link = _get(run_id, n)
    d = link.detail
    if d.get("kaggle_status") in TERMINAL:
        return d["kaggle_status"], d.get("failure", "")
    kernel = d["kernel"]
    base = poll_s()
    interval, last, polls, failing_since, told = base, d.get("kaggle_status"), 0, None, False
    live = run.folder / d["folder"] / "live.log"
    while True:
        if cancelled() and not told:
            say(cancel_hint(kernel, c.account.name))
            _set(run_id, n, cancel_requested=now())
            told = True
        try:
            status, failure = c.kernel_status(kernel["slug"], kernel.get("version"))
            failing_since = None
        except KaggleError as e:
            if not e.retryable:
                raise
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > WATCH_PATIENCE_POLLS * base:
                raise KaggleError(e.account, f"lost contact with Kaggle while watching {kernel['slug']} ({e.what})",
                                  "The session goes on without the lab: `lab watch RUN` picks it up where it is.",
                                  retryable=True) from None
            time.sleep(interval)
            continue
        polls += 1
        if status != last:
            _set(run_id, n, kaggle_status=status, failure=failure, status_at=now())
            say(f"link {n}: {kernel['slug']} {status}" + (f": {failure}" if failure else ""))
            last, interval = status, base
        if status in TERMINAL:
            return status, failure
        if polls % LOG_EVERY_POLLS == 1:
            _save_log(c, kernel["slug"], live)
        time.sleep(interval)
        interval = min(interval * 1.5, base * MAX_POLL_FACTOR)


def _save_log(c: AccountClient, slug: str, path: Path) -> None:
    try:
        text = c.kernel_log(slug)
    except UserError:
        return  # the log is a courtesy: the status decides
    if text:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def cancel_hint(kernel: dict, account: str) -> str:
    url = kernel.get("url") or f"https://www.kaggle.com/code/{kernel['slug']}"
    return (f"No further link will start. Kaggle's public API cannot stop a running session (its cancel call "
            f"needs a session id that no reply gives): to stop {kernel['slug']} now, open {url} signed in as "
            f"account '{account}' and press Stop session. The lab downloads what it saved when it ends.")


def _download(run_id: str, n: int, c: AccountClient, say) -> dict:
    run, link = _get(run_id, n)
    output = link.detail.get("output") or {}
    if output.get("done"):
        return output  # a finished download is not redone
    folder = run.folder / link.detail["folder"]
    slug = link.detail["kernel"]["slug"]
    for _ in range(2):  # one more download when the first came incomplete
        files = c.kernel_output(slug, folder)
        check = _check_output(folder)
        if not check.get("problem"):
            break
        say(f"link {n}: {check['problem']}; downloading again")
    _crash_point("after-download")
    output = {"done": True, "files": sorted(str(Path(f).relative_to(folder)) for f in files),
              "downloaded_at": now(), **check}
    _set(run_id, n, output=output, phase="downloaded")
    say(f"link {n}: downloaded {len(files)} files into {folder}")
    return output


def _check_output(folder: Path) -> dict:
    """The session's result and its newest whole checkpoint (sha256 recomputed here)."""
    out: dict = {}
    result_path = folder / "result.json"
    if result_path.is_file():
        try:
            out["result"] = json.loads(result_path.read_text(encoding="utf-8"))
        except ValueError:
            out["problem"] = "result.json is unreadable"
    for path in reversed(list_checkpoints(folder / "checkpoints")):
        problem = verify_checkpoint(path)
        if problem is not None:
            out["problem"] = f"checkpoint {path.name}: {problem}"
            continue
        meta = checkpoint_meta(path)
        out["checkpoint"] = {"name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
        break
    named = (out.get("result") or {}).get("checkpoint")
    if named and (out.get("checkpoint") or {}).get("name") != Path(named).name:
        out["problem"] = f"the session's checkpoint {Path(named).name} is missing or corrupt in its output"
    return out


def _finish(run_id: str, n: int, status: str, failure: str, say) -> Link:
    """Merges the link's outputs into the run folder and records how the link ended."""
    run, link = _get(run_id, n)
    output = link.detail["output"]
    folder = run.folder / link.detail["folder"]
    ckpt, result = output.get("checkpoint"), output.get("result")
    if ckpt and ckpt["step"] >= link.from_step:
        merge_checkpoint(folder / "checkpoints" / ckpt["name"], run.folder)
    merge_metrics(run.folder, folder / "metrics.jsonl", link.from_step)
    for name in ("result.json", "config.json", "device.json"):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, run.folder / name)
    if (run.folder / "metrics.jsonl").is_file():
        from lab.kernel.plots import save_loss_plot
        save_loss_plot(run.folder, title=run.id)
    with updating(run_id) as r:
        link = r.links[n - 1]
        link.ended = now()
        link.detail["phase"] = "merged"
        if ckpt:
            link.checkpoint = {"name": ckpt["name"], "step": ckpt["step"], "sha256": ckpt["sha256"]}
            link.to_step = ckpt["step"]
        if status == "CANCEL_ACKNOWLEDGED":
            link.status, link.reason = "cancelled", (result or {}).get("reason") or "cancelled on Kaggle"
        elif result and not output.get("problem"):
            link.to_step, link.reason = int(result["step"]), result["reason"]
            link.status = "done" if result.get("done") else "stopped"
        else:
            link.status = "failed"
            link.reason = failure_reason(link, status, failure, output)
    say(f"link {n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def failure_reason(link: Link, status: str, failure: str, output: dict) -> str:
    """Why a session gave no result, and what to do: for the run's message."""
    account, slug = link.machine, link.detail["kernel"]["slug"]
    why = output.get("problem") or f"the session ended {status}" + (f": {failure}" if failure else "")
    hint = ""
    if link.detail["kernel"].get("dropped_sources"):
        hint = (f" Kaggle ran it without {', '.join(link.detail['kernel']['dropped_sources'])}; the lab forgot "
                "them and uploads them again on the next try.")
    at = f" The run keeps its checkpoint at step {link.to_step}." if link.to_step else ""
    return (f"Kaggle account '{account}': {why}. The log is in {link.detail['folder']}/{slug.split('/')[1]}.log."
            f"{hint}{at} Fix the cause, then `lab watch RUN` continues the run.")


# ---------------------------------------------------------------------------------------------
# The run folder: one curve, the newest checkpoints


def merge_checkpoint(ckpt: Path, run_folder: Path) -> Path:
    """Puts a verified checkpoint into the run's `checkpoints/`, hard-linked where it can be."""
    return place_checkpoint(ckpt, run_folder / "checkpoints", put=_put)


def merge_metrics(run_folder: Path, link_metrics: Path, from_step: int) -> None:
    """The run's rows up to the link's start, then the link's rows after it. Each link carries
    the earlier rows itself; taking the run's own keeps what an earlier link wrote exactly."""
    if not link_metrics.is_file():
        return
    mine = run_folder / "metrics.jsonl"
    early = metrics_lines(mine, upto=from_step) or metrics_lines(link_metrics, upto=from_step)
    write_metrics_lines(mine, early + metrics_lines(link_metrics, after=from_step))


__all__ = ["run_link", "plan_link", "source_checkpoint", "holds", "kernel_notebook", "link_limit_min",
           "stage_data", "stage_checkpoint", "merge_metrics", "merge_checkpoint", "cancel_hint", "LinkRefused",
           "data_slug", "ckpt_slug", "kernel_slug", "poll_s", "time_scale", "MAX_GPU_SESSIONS", "STARTUP_MIN",
           "MIN_LINK_MIN", "TERMINAL"]
