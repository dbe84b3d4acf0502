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

import json
import time
from pathlib import Path
from typing import Callable

from lab.config import KAGGLE_MARGIN_FLOOR_MIN, KAGGLE_TIMEOUT_MAX_S, RunConfig, UserError, field_names
from lab.faults import reached
from lab.kaggle.accounts import list_accounts
from lab.kaggle.client import (AccountClient, KaggleError, RetryPolicy, check_no_global_token, client_for, get_account,
                               notebook_text)
from lab.kernel.checkpoint import sha256_file
from lab.machines.auto import MIN_LINK_MIN, STARTUP_MIN, Machine
from lab.machines.base import Follow, Host
from lab.machines.control import spawn_driver
from lab.machines.kaggle_data import (KaggleSettings, LinkContext, ensure_checkpoint, ensure_data, forget_dataset,
                                      get_link, held, holds, set_link, stage_data)
from lab.machines.kaggle_live import live_rows
from lab.machines.kaggle_names import ckpt_slug, data_slug, kernel_slug
from lab.machines.kaggle_outputs import download, finish
from lab.machines.kaggle_sessions import push_margin_min
from lab.machines.kaggle_watch import TERMINAL, cancel_hint, watch
from lab.machines.needs import source_checkpoint
from lab.machines.outcome import End, Outcome
from lab.probe.record import cannot_run, nccl_setting, read_probe
from lab.runs import Link, Run, now, updating

KAGGLE_CARDS = "2xT4"  # what every push asks for (the machine shape T4X2), and what the notebook checks it got
MAX_GPU_SESSIONS = 2  # batch GPU sessions an account may run at once (Kaggle's docs)
_QUOTA_RETRY = RetryPolicy(attempts=2, base_s=0.5, cap_s=1.0, max_retry_after_s=5.0)  # a person waits


def client(account: str, settings: KaggleSettings) -> AccountClient:
    """The account's client with the lab's retry policy."""
    base = settings.retry_base_s
    return client_for(account, retry=RetryPolicy(attempts=6, base_s=base, cap_s=60 * base))


# ---------------------------------------------------------------------------------------------
# The notebook that is pushed


def kernel_notebook(cfg: RunConfig, resume_name: str, limit_min: float, data_sha256: str = "",
                    ckpt_sha256: str = "", *, allow_cpu: bool = False, nccl_env: dict | None = None) -> dict:
    """The training notebook with this link's parameters: data found under /kaggle/input, the
    checkpoint dataset's mount name as `resume_from`, the link's time limit, the sha256 of the
    data's manifest and of the checkpoint the session must find there, the cards it must find
    (else it stops before training, unless `allow_cpu`), and the NCCL settings the account's
    probe found working. The session learns all of it here, never from this side's environment."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from lab.notebooks import TRAIN_NOTEBOOK, parameterized
    link_cfg = RunConfig.from_dict({**cfg.to_dict(), "data_dir": "", "resume_from": resume_name,
                                    "limit_min": limit_min})
    params = parameterized(link_cfg, out_dir="", nproc=0, plot_every_s=30, given_fields=field_names(),
                           expect_data_sha256=data_sha256, expect_ckpt_sha256=ckpt_sha256,
                           expect_cards=KAGGLE_CARDS, allow_cpu=bool(allow_cpu), nccl_env=dict(nccl_env or {}))
    nb = load_notebook_node(str(TRAIN_NOTEBOOK))  # as papermill reads it: every cell with its tags
    nb = parameterize_notebook(nb, params, kernel_name="python3", language="python")
    return json.loads(nbformat.writes(nb))


def link_limit_min(run_limit_min: float, quota_left_s: float, margin_min: float = KAGGLE_MARGIN_FLOOR_MIN) -> float:
    """A link's time limit: the run's, or what the account's quota allows after the margin, or
    what the longest session timeout allows after it, so a link normally ends by its own
    time-limit save rather than by Kaggle's kill."""
    return round(min(run_limit_min, quota_left_s / 60 - margin_min, KAGGLE_TIMEOUT_MAX_S / 60 - margin_min), 3)


# ---------------------------------------------------------------------------------------------
# The registry of one link


def plan_link(run_id: str, account: str, quota_left_s: float, source: dict | None, why: str = "") -> Link:
    """Appends a link on `account` to the run, before anything is sent to Kaggle. Its session
    timeout is its limit plus the margin the account's measured sessions call for (never below
    the floor), and stays below Kaggle's maximum."""
    username = get_account(account).username
    margin = push_margin_min(account)
    with updating(run_id) as run:
        cfg = run.cfg
        n = len(run.links) + 1
        limit = link_limit_min(cfg.limit_min, quota_left_s, margin)
        link = Link(n=n, machine=account, kind=KaggleHost.kind, status="starting", limit_min=limit,
                    from_step=source["step"] if source else 0)
        link.detail = {"account": account, "user": username, "phase": "planned", "folder": f"links/{n:03d}-{account}",
                       "session_timeout_s": int(min(KAGGLE_TIMEOUT_MAX_S, (limit + margin) * 60)),
                       "margin_min": margin, "source": source, "why": why}
        run.links.append(link)
        run.status = "running"
    return link


# ---------------------------------------------------------------------------------------------
# One link, from wherever its record says it is


class _Refused(UserError):
    """Kaggle refused the push and started nothing; `kind`: End.BUSY, End.NO_QUOTA or End.FAILED."""

    def __init__(self, message: str, kind: End):
        self.kind = kind
        super().__init__(message)


def run_link(run_id: str, n: int, data_dir: Callable[[], Path], ctx: LinkContext,
             cancelled: Callable[[], bool] = lambda: False) -> Link:
    """Drives link `n` of the run to its end and merges its outputs; returns the ended link with
    its outcome. A push Kaggle refused ends it BUSY or NO_QUOTA (nothing started), a failure
    before the push FAILED, with every upload that was done recorded, so the next try repeats
    none of it. Raises UserError (KaggleError included) when the link cannot be ended now: a
    push that may have been sent, Kaggle unreachable while watching.
    """
    _, link = get_link(run_id, n)
    if link.status == "starting":
        try:
            if not _pushing(link) and cancelled():  # before any upload: nothing goes up, no session starts
                return _cancel_before_push(run_id, n)
            data = ensure_data(run_id, n, ctx, data_dir())
            ckpt = ensure_checkpoint(run_id, n, ctx)
            if not _pushing(get_link(run_id, n)[1]) and cancelled():
                return _cancel_before_push(run_id, n)
            _ensure_pushed(run_id, n, ctx, data, ckpt)
        except UserError as e:
            kind = e.kind if isinstance(e, _Refused) else End.FAILED
            ended = _end_before_push(run_id, n, Outcome(kind, str(e), session=False))
            if ended is None:
                raise  # pushed, or maybe: the next try watches it, or asks Kaggle whether it is there
            return ended
    status, failure = watch(run_id, n, ctx, cancelled)
    download(run_id, n, ctx)
    return finish(run_id, n, status, failure, ctx.say)


def _pushing(link: Link) -> bool:
    """Whether a push was sent (or maybe sent): a session may run, so a cancel cannot skip it."""
    kernel = link.detail.get("kernel") or {}
    return bool(kernel.get("pushed_at") or kernel.get("pushing"))


def _cancel_before_push(run_id: str, n: int) -> Link:
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.status, link.ended, link.reason = "cancelled", now(), "cancelled before its push"
        link.outcome = Outcome(End.CANCELLED, link.reason, "отменён до отправки", session=False)
    return link


def _end_before_push(run_id: str, n: int, outcome: Outcome) -> Link | None:
    """Ends the link that failed before its push, with `outcome`; None when a push was sent (or
    maybe sent): then a session may run, and the link is not over."""
    with updating(run_id) as run:
        link = run.links[n - 1]
        if _pushing(link):
            return None
        link.status, link.ended, link.reason, link.outcome = "failed", now(), outcome.reason, outcome
    return link


def _record_outcome(run_id: str, n: int, outcome: Outcome) -> Link:
    with updating(run_id) as run:
        link = run.links[n - 1]
        link.outcome = outcome
    return link


def _kernel_exists(c: AccountClient, slug: str) -> bool:
    try:
        c.kernel_status(slug)
        return True
    except KaggleError as e:
        if e.status in (403, 404):
            return False
        raise


def _ensure_pushed(run_id: str, n: int, ctx: LinkContext, data: dict, ckpt: dict | None) -> dict:
    c, say = ctx.c, ctx.say
    run, link = get_link(run_id, n)
    kernel = link.detail.get("kernel") or {}
    if kernel.get("pushed_at"):
        return kernel
    slug = f"{c.username}/{kernel_slug(run_id, n)}"
    if kernel.get("pushing") and _kernel_exists(c, slug):
        # The push was sent by a process that died before it recorded the reply: it is done.
        return _record_push(run_id, n, {**kernel, "version": None, "url": "", "adopted": True}, say)
    sources = [data["slug"]] + ([ckpt["slug"]] if ckpt else [])
    resume_name = ckpt["slug"].split("/")[1] if ckpt else ""
    manifest = stage_data(Path(run.cfg.data_dir)) / "manifest.json"  # as uploaded: made once per data id
    nccl = nccl_setting(read_probe(c.account.name))
    nb = kernel_notebook(run.cfg, resume_name, link.limit_min, data_sha256=sha256_file(manifest),
                         ckpt_sha256=ckpt["sha256"] if ckpt else "", allow_cpu=ctx.settings.allow_cpu, nccl_env=nccl)
    folder = run.folder / link.detail["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pushed.ipynb").write_text(notebook_text(nb), encoding="utf-8")  # the push as sent
    kernel = {"slug": slug, "pushing": True, "sources": sources, "allow_cpu": ctx.settings.allow_cpu,
              "nccl_env": nccl, "notebook_bytes": (folder / "pushed.ipynb").stat().st_size}
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
                forget_dataset(c.username, source)
            say(f"warning: {e}")
            return _record_push(run_id, n, {**kernel, "version": e.push.version, "url": e.push.url,
                                            "dropped_sources": dropped, "error": str(e)}, say)
        if e.unsure:
            if _appears(c, slug, ctx.settings.poll_s):
                return _record_push(run_id, n, {**kernel, "version": None, "url": "", "adopted": True}, say)
            # Not seen yet is not "not taken": Kaggle may list it later. No second push now; the
            # record keeps "pushing", so the next `lab watch` asks Kaggle again before it pushes.
            raise KaggleError(e.account, e.what, "`lab watch RUN` asks Kaggle again whether the kernel is there "
                                                 "before it pushes, so no second session starts.",
                              status=e.status, unsure=True) from None
        set_link(run_id, n, kernel={**kernel, "pushing": False, "refused": e.what})
        raise _Refused(str(e), _refusal_kind(e, c)) from None
    reached("after-push")
    return _record_push(run_id, n, {**kernel, "version": pushed.version, "url": pushed.url}, say)


def _appears(c: AccountClient, slug: str, poll_s: float, tries: int = 3) -> bool:
    """Whether a push with no clear answer did create the kernel (asked a few times, a poll apart)."""
    for i in range(tries):
        time.sleep(poll_s if i else min(poll_s, 5.0))
        if _kernel_exists(c, slug):
            return True
    return False


def _refusal_kind(e: KaggleError, c: AccountClient) -> End:
    """Why Kaggle refused a push, from structured signals: the account's quota as the quota call
    reads it, not a guess at the refusal's wording (undocumented). The session-limit refusal's
    text is the one Kaggle documents ("Maximum batch GPU session count of 2 reached.")."""
    if "GPU session count" in e.what:
        return End.BUSY
    return End.NO_QUOTA if _out_of_quota(c) else End.FAILED


def _out_of_quota(c: AccountClient) -> bool:
    """Whether the account's quota is too small for a useful link (the quota call's answer)."""
    try:
        return c.quota().left_s < (STARTUP_MIN + MIN_LINK_MIN) * 60
    except UserError:
        return False


def _record_push(run_id: str, n: int, kernel: dict, say) -> dict:
    kernel = {**kernel, "pushing": False, "pushed_at": now()}
    set_link(run_id, n, status="running", kernel=kernel, phase="pushed")
    say(f"link {n}: pushed {kernel['slug']}" + (f" version {kernel['version']}" if kernel.get("version") else "")
        + (f" ({kernel['url']})" if kernel.get("url") else ""))
    return kernel


# ---------------------------------------------------------------------------------------------
# The account as a machine


class KaggleHost(Host):
    """A lab member's Kaggle account as a machine, with the person's settings (KaggleSettings)."""

    kind = "kaggle"

    def __init__(self, name: str):
        super().__init__(name)
        self.settings = KaggleSettings.from_env()

    @classmethod
    def names(cls) -> list[str]:
        return [a.name for a in list_accounts()]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        m = Machine(self.name, "kaggle", "2xT4", running=running, free=len(running) < MAX_GPU_SESSIONS)
        try:
            get_account(self.name)
        except UserError:
            m.error = f"the credentials of '{self.name}' are damaged: remove and add the account again"
        else:
            try:
                c = client(self.name, self.settings) if patient else \
                    client_for(self.name, retry=_QUOTA_RETRY, timeout_s=20.0)
                q = c.quota()
            except UserError as e:  # one account's trouble does not hide the others
                m.error = f"{e.what}. {e.todo}" if isinstance(e, KaggleError) else str(e)
            except Exception as e:  # noqa: BLE001 - nor does a surprise; its text may hold anything, so not shown
                m.error = f"'{self.name}': unexpected {type(e).__name__} reading the quota"
            else:
                m.quota_left_h, m.quota_total_h = q.left_s / 3600, q.total_s / 3600
                m.refresh = q.refresh_time.isoformat() if q.refresh_time else None
        if m.error is None:  # the Auto rule skips an account its probe found unable to run (`lab probe NAME`)
            m.error = cannot_run(read_probe(self.name))
        m.free = m.free and m.error is None
        return m

    def check(self, say: Callable[[str], None] = print) -> None:
        account = get_account(self.name)  # an unknown name: the error lists the lab's accounts
        check_no_global_token()
        client_for(account, retry=_QUOTA_RETRY, timeout_s=20.0).quota()

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        return holds(self.name, data_id, ckpt_sha256, run_id)

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        return plan_link(run.id, self.name, (machine.quota_left_h or 0) * 3600, source_checkpoint(run), why)

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        ctx = LinkContext(client(self.name, self.settings), how.say, self.settings)
        ended = run_link(run.id, link.n, lambda: Path(run.cfg.data_dir), ctx, how.cancelled)
        if ended.status == "failed" and ended.detail.get("kaggle_status") == "ERROR" and not ended.detail.get("ran") \
                and _out_of_quota(ctx.c):
            # Kaggle took the push, then refused the session at its start for quota: it never ran.
            why = ended.detail.get("failure") or "no reason given"
            ended = _record_outcome(run.id, link.n, Outcome(
                End.NO_QUOTA, f"Kaggle account '{self.name}': the session never ran and the account's quota is "
                              f"spent ({why}).",
                f"аккаунт Kaggle '{self.name}': сессия так и не началась, квота аккаунта кончилась ({why})."))
        if ended.outcome.kind is End.PUSH_AGAIN:
            how.say(f"link {ended.n}: {ended.reason}")
            time.sleep(self.settings.input_wait_s)  # Kaggle mounts what it made READY a little later
        return ended

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid is None:
            spawn_driver(run.id)  # someone must collect what the session saves
        if link.status == "starting" and not (link.detail.get("kernel") or {}).get("pushing"):
            # The driver asks before each upload and before the push: nothing more goes up.
            return f"run {run.id}: cancelled before its push to {self.name}; no session starts"
        return f"run {run.id}: " + cancel_hint(link.detail.get("kernel") or {"slug": self.name}, self.name)

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        from lab.kaggle.client import log_text
        from lab.machines.control import tail_text
        folder = run.folder / link.detail.get("folder", "")
        slug = (link.detail.get("kernel") or {}).get("slug", "/")
        for path in (folder / f"{slug.split('/')[1]}.log", folder / "live.log"):
            if path.is_file():  # the downloaded log is Kaggle's JSON list of entries
                try:
                    return tail_text(log_text(path.read_text(encoding="utf-8", errors="replace")), lines)
                except OSError:
                    return ""
        return ""

    def live(self, run: Run, link: Link) -> dict | None:
        return live_rows(run, link)


__all__ = ["KaggleHost", "KaggleSettings", "run_link", "plan_link", "holds", "held", "kernel_notebook",
           "link_limit_min", "cancel_hint", "data_slug", "ckpt_slug", "kernel_slug", "MAX_GPU_SESSIONS", "STARTUP_MIN",
           "MIN_LINK_MIN", "TERMINAL", "KAGGLE_CARDS"]
