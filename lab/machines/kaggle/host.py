"""A Kaggle account as a machine: one link of a run, driven so a restart loses and repeats nothing.

A link on an account goes through these phases, each recorded in the run registry (the link's
`KaggleLinkRecord`, lab.machines.kaggle.record) before and after its side effect, so the control side may die anywhere and
`lab watch RUN` picks up where it stopped:

0. limits: the notebook under 1 MB and the data's files within a dataset version's limit, checked
   before anything goes up;
1. data: the run's prepared data folder, flattened (datasets are flat folders), as a private
   dataset `lab-data-<data id>` owned by the account; uploaded once per account and version,
   remembered in `$LAB_HOME/kaggle/holdings.json`, waited on until READY;
2. checkpoint (continued runs): the newest checkpoint, its sidecar and the curve so far, as a
   new version of the private dataset `lab-ckpt-<run id>` owned by the account (the hand-off:
   A's output was downloaded with A's credentials, B's copy is uploaded with B's), sha256
   checked before the upload;
3. push: the parameterized training notebook as a private kernel `lab-<run id>-l<n>` (one kernel
   per link, so "was it pushed?" is a question Kaggle can answer), 2×T4, internet off, the two
   datasets as sources, `resume_from` = the checkpoint dataset's mount name; first the account's
   GPU sessions as Kaggle lists them, since other lab members use the account too; a refusal
   ends the link as lab.machines.kaggle.refusals reads it;
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

from lab.config import RunConfig, UserError
from lab.faults import reached
from lab.kaggle.accounts import list_accounts
from lab.kaggle.client import (AccountClient, KaggleError, RetryPolicy, check_no_global_token, client_for, get_account,
                               log_text, notebook_text)
from lab.kaggle.limits import KAGGLE_MARGIN_FLOOR_MIN, KAGGLE_TIMEOUT_MAX_S
from lab.kaggle.probed import cannot_run, nccl_setting, read_probe
from lab.kaggle.sessions import push_margin_min
from lab.kernel.checkpoint import sha256_file
from lab.machines.auto import FOREIGN, MIN_LINK_MIN, STARTUP_MIN, Machine
from lab.machines.base import Follow, Host
from lab.machines.control import spawn_driver, tail_text
from lab.machines.kaggle.data import (KaggleSettings, LinkContext, NotKept, ensure_checkpoint, ensure_data,
                                      forget_dataset, held, holds, stage_data)
from lab.machines.kaggle.live import live_rows
from lab.machines.kaggle.names import ckpt_slug, data_slug, kernel_slug
from lab.machines.kaggle.outputs import download, finish
from lab.machines.kaggle.record import KaggleLinkRecord, KernelPush
from lab.machines.kaggle.refusals import (MAX_GPU_SESSIONS, Refused, busy, check_limits, check_seats, kernel_exists,
                                          out_of_quota, refused, until_of)
from lab.machines.kaggle.watch import TERMINAL, cancel_hint, watch
from lab.machines.links import get_link
from lab.machines.needs import source_checkpoint
from lab.runs import End, Link, Outcome, Run, load_run, now, updating

KAGGLE_CARDS = "2xT4"  # what every push asks for (the machine shape T4X2), and what the notebook checks it got
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
    # nbformat and papermill: only where a link is pushed (the machines' states need neither)
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from lab.notebooks import TRAIN_NOTEBOOK, parameterized  # nbformat: only where a link is pushed
    # Where, on Kaggle; through from_dict so that every parameter has its field's type (120.0, not 120).
    link_cfg = RunConfig.from_dict({**cfg.to_dict(), "data_dir": "", "resume_from": resume_name, "limit_min": limit_min})
    params = parameterized(link_cfg, out_dir="", nproc=0, plot_every_s=30, expect_data_sha256=data_sha256,
                           expect_ckpt_sha256=ckpt_sha256, expect_cards=KAGGLE_CARDS, allow_cpu=bool(allow_cpu),
                           nccl_env=dict(nccl_env or {}))
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
        link.detail = KaggleLinkRecord(account=account, user=username, folder=f"links/{n:03d}-{account}",
                                       session_timeout_s=int(min(KAGGLE_TIMEOUT_MAX_S, (limit + margin) * 60)),
                                       margin_min=margin, source=source, why=why).as_detail()
        run.links.append(link)
        run.status = "running"
    return link


# ---------------------------------------------------------------------------------------------
# One link, from wherever its record says it is


def run_link(run_id: str, n: int, data_dir: Callable[[], Path], ctx: LinkContext,
             cancelled: Callable[[], bool] = lambda: False) -> Link:
    """Drives link `n` of the run to its end and merges its outputs; returns the ended link with
    its outcome. Before the push, Kaggle's refusals end it BUSY or NO_QUOTA (nothing started; a busy
    spell met at an upload too, `until` when Kaggle said), a dataset the account does not keep as
    sent ELSEWHERE, the run's own cause FAILED; every upload that was done is recorded, so the next
    try repeats none of it. Raises UserError (KaggleError included) when the link cannot be ended
    now: a push that may have been sent, Kaggle unreachable too long while watching.
    """
    _, link = get_link(run_id, n)
    if link.status == "starting":
        try:
            if not _pushing(link):
                if cancelled():  # before any upload: nothing goes up, no session starts
                    return _cancel_before_push(run_id, n)
                _check_limits(run_id, n, ctx, data_dir())
            data = ensure_data(run_id, n, ctx, data_dir())
            ckpt = ensure_checkpoint(run_id, n, ctx)
            if not _pushing(get_link(run_id, n)[1]) and cancelled():
                return _cancel_before_push(run_id, n)
            _ensure_pushed(run_id, n, ctx, data, ckpt)
        except UserError as e:
            ended = _end_before_push(run_id, n, _outcome_before_push(e))
            if ended is None:
                raise  # pushed, or maybe: the next try watches it, or asks Kaggle whether it is there
            return ended
    status, failure = watch(run_id, n, ctx, cancelled)
    download(run_id, n, ctx)
    return finish(run_id, n, status, failure, ctx.say)


def _outcome_before_push(e: UserError) -> Outcome:
    """How a link that ended before its push ended: refused (by Kaggle, or by a busy spell met at an
    upload), passed over (a dataset the account does not keep), or failed for the run's own cause."""
    refusal = e if isinstance(e, Refused) else busy(e)
    if refusal is not None:
        return Outcome(refusal.kind, str(refusal), refusal.ru, session=False, until=refusal.until)
    if isinstance(e, NotKept):
        return Outcome(End.ELSEWHERE, str(e), session=False)
    return Outcome(End.FAILED, str(e), e.ru, session=False)


def _pushing(link: Link) -> bool:
    """Whether a push was sent (or maybe sent): a session may run, so a cancel cannot skip it."""
    return KaggleLinkRecord.of(link).pushing


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


def _link_notebook(run_id: str, n: int, ctx: LinkContext, ckpt: dict | None) -> dict:
    """The notebook link `n` pushes: the run's config, its data's and checkpoint's sha256, the account's
    NCCL settings."""
    run, link = get_link(run_id, n)
    resume_name = ckpt["slug"].split("/")[1] if ckpt else ""
    manifest = stage_data(Path(run.cfg.data_dir)) / "manifest.json"  # as uploaded: made once per data id
    return kernel_notebook(run.cfg, resume_name, link.limit_min, data_sha256=sha256_file(manifest),
                           ckpt_sha256=ckpt["sha256"] if ckpt else "", allow_cpu=ctx.settings.allow_cpu,
                           nccl_env=nccl_setting(read_probe(ctx.c.account.name)))


def _check_limits(run_id: str, n: int, ctx: LinkContext, data_dir: Path) -> None:
    """Kaggle's limits met before anything goes up: the notebook as it will be pushed (a checkpoint's
    name and sha256 take the room they will), the data's file count."""
    source = KaggleLinkRecord.of(get_link(run_id, n)[1]).source
    ckpt = {"slug": f"{ctx.c.username}/{ckpt_slug(run_id)}", "sha256": "0" * 64} if source else None
    files = sum(1 for p in stage_data(Path(data_dir)).iterdir() if p.is_file())
    check_limits(_link_notebook(run_id, n, ctx, ckpt), files, Path(data_dir))


def _ensure_pushed(run_id: str, n: int, ctx: LinkContext, data: dict, ckpt: dict | None) -> KernelPush:
    c, say = ctx.c, ctx.say
    run, link = get_link(run_id, n)
    record = KaggleLinkRecord.of(link)
    if record.kernel.pushed_at:
        return record.kernel
    slug = f"{c.username}/{kernel_slug(run_id, n)}"
    if record.kernel.pushing and kernel_exists(c, slug):
        # The push was sent by a process that died before it recorded the reply: it is done.
        return _record_push(run_id, n, record, say, version=None, url="", adopted=True)
    check_seats(c, slug)  # another member's sessions fill the account: refused before anything is sent
    sources = [data["slug"]] + ([ckpt["slug"]] if ckpt else [])
    nb = _link_notebook(run_id, n, ctx, ckpt)
    folder = run.folder / record.folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pushed.ipynb").write_text(notebook_text(nb), encoding="utf-8")  # the push as sent
    record.kernel = KernelPush(slug=slug, sources=sources, allow_cpu=ctx.settings.allow_cpu,
                               nccl_env=nccl_setting(read_probe(c.account.name)),
                               notebook_bytes=(folder / "pushed.ipynb").stat().st_size)
    record.update_kernel(run_id, n, phase="pushing", pushing=True)
    with updating(run_id) as r:
        r.links[n - 1].notebook = f"{record.folder}/pushed.ipynb"
    try:
        pushed = c.push_kernel(slug, record.kernel.name, nb, dataset_sources=sources,
                               timeout_s=record.session_timeout_s, gpu=True, internet=False, private=True)
    except KaggleError as e:
        return _not_pushed(run_id, n, ctx, record, e)
    reached("after-push")
    return _record_push(run_id, n, record, say, version=pushed.version, url=pushed.url)


def _not_pushed(run_id: str, n: int, ctx: LinkContext, record: KaggleLinkRecord, e: KaggleError) -> KernelPush:
    """A push Kaggle did not plainly take: run without some sources (the session is real), with no
    clear answer (asked again before any second push), or refused (raised as Refused)."""
    c, say, slug, sources = ctx.c, ctx.say, record.kernel.slug, record.kernel.sources
    if e.push is not None:  # Kaggle ran it, without some sources: the session is real
        dropped = [s for s in sources if s in e.what] or sources
        for source in dropped:  # what the lab remembered is wrong: forget it, upload again next time
            forget_dataset(c.username, source)
        say(f"warning: {e}")
        return _record_push(run_id, n, record, say, version=e.push.version, url=e.push.url, dropped_sources=dropped,
                            error=str(e))
    if e.unsure:
        if _appears(c, slug, ctx.settings.poll_s):
            return _record_push(run_id, n, record, say, version=None, url="", adopted=True)
        # Not seen yet is not "not taken": Kaggle may list it later. No second push now; the
        # record keeps "pushing", so the next `lab watch` asks Kaggle again before it pushes.
        raise KaggleError(e.account, e.what, "`lab watch RUN` asks Kaggle again whether the kernel is there "
                                             "before it pushes, so no second session starts.",
                          status=e.status, unsure=True) from None
    record.update_kernel(run_id, n, pushing=False, refused=e.what, cause=e.cause)
    raise refused(e, c) from None


def _appears(c: AccountClient, slug: str, poll_s: float, tries: int = 3) -> bool:
    """Whether a push with no clear answer did create the kernel (asked a few times, a poll apart)."""
    for i in range(tries):
        time.sleep(poll_s if i else min(poll_s, 5.0))
        if kernel_exists(c, slug):
            return True
    return False


def _record_push(run_id: str, n: int, record: KaggleLinkRecord, say, **changes) -> KernelPush:
    kernel = record.update_kernel(run_id, n, status="running", phase="pushed", pushing=False, pushed_at=now(),
                                  **changes)
    say(f"link {n}: pushed {kernel.slug}" + (f" version {kernel.version}" if kernel.version else "")
        + (f" ({kernel.url})" if kernel.url else ""))
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
            self._ask_kaggle(m, patient)
        if m.error is None:  # the Auto rule skips an account its probe found unable to run (`lab probe NAME`)
            m.error = cannot_run(read_probe(self.name))
        m.free = m.free and m.error is None and m.busy_until is None
        return m

    def _ask_kaggle(self, m: Machine, patient: bool) -> None:
        """The account's quota, and the GPU sessions Kaggle lists running there that this computer did
        not start (another member's runs and notebooks hold the same slots). A busy Kaggle is no error:
        the account is not free until the pause it asked for ends."""
        try:
            c = client(self.name, self.settings) if patient else client_for(self.name, retry=_QUOTA_RETRY,
                                                                             timeout_s=20.0)
            q = c.quota()
            others = self._others(c, m.running)
        except KaggleError as e:  # one account's trouble does not hide the others
            if e.cause == "busy":
                m.busy_until = until_of(e.wait_s)
            else:
                m.error = f"{e.what}. {e.todo}"
        except UserError as e:
            m.error = str(e)
        except Exception as e:  # noqa: BLE001 - nor does a surprise; its text may hold anything, so not shown
            m.error = f"'{self.name}': unexpected {type(e).__name__} reading the quota"
        else:
            m.quota_left_h, m.quota_total_h, m.quota_used_h = q.left_s / 3600, q.total_s / 3600, q.used_s / 3600
            m.refresh = q.refresh_time.isoformat() if q.refresh_time else None
            m.has_ever_run = q.has_ever_run
            m.running = m.running + [FOREIGN] * len(others)
            m.free = len(m.running) < MAX_GPU_SESSIONS

    def _others(self, c: AccountClient, running: list[str]) -> list:
        """The GPU sessions Kaggle lists on the account that are not this computer's runs'; none when
        the listing fails (it is a courtesy: Kaggle's own cap still answers a push), unless Kaggle is busy."""
        try:
            return c.gpu_sessions(skip=self._our_kernels(c.username, running))
        except KaggleError as e:
            if e.cause == "busy":
                raise
            return []

    def _our_kernels(self, username: str, running: list[str]) -> list[str]:
        """The kernels of this computer's runs' links on the account that may be running."""
        out = []
        for run_id in running:
            try:
                run = load_run(run_id)
            except UserError:
                continue
            out += [f"{username}/{kernel_slug(run.id, link.n)}" for link in run.links
                    if link.machine == self.name and link.status in ("starting", "running")]
        return out

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
        record = KaggleLinkRecord.of(ended)
        if ended.status == "failed" and record.kaggle_status == "ERROR" and not record.ran \
                and out_of_quota(ctx.c):
            # Kaggle took the push, then refused the session at its start for quota: it never ran.
            why = record.failure or "no reason given"
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
        kernel = KaggleLinkRecord.of(link).kernel
        if link.status == "starting" and not kernel.pushing:
            # The driver asks before each upload and before the push: nothing more goes up.
            return f"run {run.id}: cancelled before its push to {self.name}; no session starts"
        return f"run {run.id}: " + cancel_hint(kernel if kernel.slug else KernelPush(slug=self.name), self.name)

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        record = KaggleLinkRecord.of(link)
        folder = run.folder / record.folder
        downloaded = [folder / f"{record.kernel.name}.log"] if record.kernel.name else []
        for path in downloaded + [folder / "live.log"]:
            if path.is_file():  # the downloaded log is Kaggle's JSON list of entries
                try:
                    return tail_text(log_text(path.read_text(encoding="utf-8", errors="replace")), lines)
                except OSError:
                    return ""
        return ""

    def session_page(self, link: Link) -> str | None:
        return KaggleLinkRecord.of(link).kernel.page

    def live(self, run: Run, link: Link) -> dict | None:
        return live_rows(run, link)


__all__ = ["KaggleHost", "KaggleSettings", "run_link", "plan_link", "holds", "held", "kernel_notebook",
           "link_limit_min", "cancel_hint", "data_slug", "ckpt_slug", "kernel_slug", "MAX_GPU_SESSIONS", "STARTUP_MIN",
           "MIN_LINK_MIN", "TERMINAL", "KAGGLE_CARDS"]
