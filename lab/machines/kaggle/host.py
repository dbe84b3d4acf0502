"""A Kaggle account as a machine: its state (the quota, the sessions Kaggle lists there), and its links
through the shared lifecycle with the account's verbs (lab.machines.kaggle.session). A link's session
timeout is its limit plus the margin the account's measured sessions call for (lab.kaggle.sessions), so a
link normally ends by its own time-limit save rather than by Kaggle's kill. A cancel deletes the kernel.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from lab.config import Problem, RunConfig, UserError
from lab.kaggle.accounts import list_accounts
from lab.kaggle.client import AccountClient, KaggleError, RetryPolicy, check_no_global_token, client_for, get_account, \
    log_text
from lab.kaggle.logs import read_live
from lab.kaggle.limits import KAGGLE_MARGIN_FLOOR_MIN, KAGGLE_TIMEOUT_MAX_S, auto_note, limit_problems
from lab.kaggle.probed import cannot_run, read_probe
from lab.kaggle.sessions import push_margin_min
from lab.machines.auto import FOREIGN, Machine
from lab.machines.base import Follow, Host
from lab.machines.control import spawn_driver, tail_text
from lab.machines.kaggle.data import KaggleSettings, held
from lab.machines.kaggle.names import ckpt_slug, kernel_slug
from lab.machines.kaggle.record import KaggleLinkRecord
from lab.machines.kaggle.refusals import MAX_GPU_SESSIONS, until_of
from lab.machines.kaggle.session import KAGGLE_CARDS, KaggleSession, at_end_note
from lab.machines.lifecycle import Away, LinkCtx, follow, live, plan
from lab.machines.needs import source_checkpoint
from lab.runs import Link, Run, load_run

_QUOTA_RETRY = RetryPolicy(attempts=2, base_s=0.5, cap_s=1.0, max_retry_after_s=5.0)  # a person waits


def client(account: str, settings: KaggleSettings) -> AccountClient:
    base = settings.retry_base_s
    return client_for(account, retry=RetryPolicy(attempts=6, base_s=base, cap_s=60 * base))


def link_limit_min(run_limit_min: float, quota_left_s: float, margin_min: float = KAGGLE_MARGIN_FLOOR_MIN) -> float:
    """A link's limit: the run's, or what the quota or the longest session timeout allow after the margin."""
    return round(min(run_limit_min, quota_left_s / 60 - margin_min, KAGGLE_TIMEOUT_MAX_S / 60 - margin_min), 3)


def plan_link(run_id: str, account: str, quota_left_s: float, source: dict | None, why: str = "") -> Link:
    margin = push_margin_min(account)
    limit = link_limit_min(load_run(run_id).cfg.limit_min, quota_left_s, margin)
    timeout_s = int(min(KAGGLE_TIMEOUT_MAX_S, (limit + margin) * 60))
    record = KaggleLinkRecord(account=account, margin_min=margin, session_timeout_s=timeout_s)
    return plan(run_id, account, KaggleHost.kind, source, why, limit, **asdict(record))


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
        m = Machine(self.name, "kaggle", KAGGLE_CARDS, running=running)
        try:
            get_account(self.name)
        except UserError:
            m.error = f"the credentials of '{self.name}' are damaged: remove and add the account again"
        else:
            self._ask_kaggle(m, patient)
        if m.error is None:  # the Auto rule skips an account its probe found unable to run (`lab probe NAME`)
            m.error = cannot_run(read_probe(self.name))
        m.free = len(m.running) < MAX_GPU_SESSIONS and m.error is None and m.busy_until is None
        return m

    def _ask_kaggle(self, m: Machine, patient: bool) -> None:
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

    def _others(self, c: AccountClient, running: list[str]) -> list:
        ours = []
        for run_id in running:
            try:
                run = load_run(run_id)
            except UserError:
                continue
            ours += [KaggleLinkRecord.of(link).kernel.slug or f"{c.username}/{kernel_slug(run.id, link.n)}"
                     for link in run.links if link.machine == self.name and link.status in ("starting", "running")]
        try:
            return c.gpu_sessions(skip=ours)
        except KaggleError as e:
            if e.cause == "busy":
                raise
            return []  # the listing is a courtesy: Kaggle's own cap still answers a push

    def check(self, say: Callable[[str], None] = print) -> None:
        account = get_account(self.name)  # an unknown name: the error lists the lab's accounts
        check_no_global_token()
        client_for(account, retry=_QUOTA_RETRY, timeout_s=20.0).quota()

    def holds(self, data_id: str | None, ckpt_sha256: str | None, run_id: str) -> set[str]:
        """What the account holds READY on Kaggle, as the lab's holdings of its uploads say (no call to Kaggle)."""
        try:
            username = get_account(self.name).username
        except UserError:
            return set()
        data = (held(username, "data", data_id) if data_id else None) or {}
        ckpt = held(username, "checkpoints", f"{username}/{ckpt_slug(run_id)}") or {}
        ready = {"data": data.get("ready"),
                 "checkpoint": ckpt_sha256 and ckpt.get("ready") and ckpt.get("sha256") == ckpt_sha256}
        return {what for what, yes in ready.items() if yes}

    def limits(self, cfg: RunConfig) -> list[Problem]:
        return limit_problems(cfg)

    @classmethod
    def limits_under_auto(cls, cfg: RunConfig) -> list[Problem]:
        return auto_note(cfg) if cls.names() else []

    def cards(self) -> str | None:
        return KAGGLE_CARDS

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        return plan_link(run.id, self.name, (machine.quota_left_h or 0) * 3600, source_checkpoint(run), why)

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        ctx = LinkCtx(run.id, link.n, how.say, how.cancelled)
        return follow(KaggleSession(ctx, client(self.name, self.settings), self.settings))

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid is None:
            spawn_driver(run.id)  # someone must end the link and collect what came back
        kernel = KaggleLinkRecord.of(link).kernel
        if not kernel.sent:  # the driver asks before each upload and before the push: nothing more goes up
            return f"run {run.id}: cancelled before its push to {self.name}; no session starts"
        return (f"run {run.id}: the session {kernel.slug} on Kaggle is ended (its kernel deleted: Kaggle's API has no "
                "other stop); the work since its last checkpoint that came back is lost")

    def cancel_loses(self, run: Run, link: Link) -> tuple[str, str] | None:
        if not KaggleLinkRecord.of(link).kernel.sent:
            return None
        return (f"Kaggle's API cannot ask a session to save: a cancel deletes its kernel, and what it trained since "
                f"the run's last checkpoint (step {run.step:,}) is lost",
                f"API Kaggle не может попросить сессию сохраниться: отмена удалит её ядро, и всё обученное после "
                f"последнего чекпоинта прогона (шаг {run.step:,}) пропадёт")

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        record = KaggleLinkRecord.of(link)
        folder = run.folder / Away.of(link).folder
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
        state, _ = read_live(run.folder / Away.of(link).folder)
        mode = (state or {}).get("mode", "waiting")
        note = at_end_note(float((state or {}).get("grace_s") or 0)) if mode == "at_end" else None
        return live(run, link, note, mode) if state is not None else None
