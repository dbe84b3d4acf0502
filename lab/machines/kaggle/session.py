"""One link's verbs on a Kaggle account, for the lifecycle every kind shares (lab.machines.lifecycle).

    stage    Kaggle's limits met before anything goes up, then the run's data and the link's checkpoint as
             the account's private datasets (lab.machines.kaggle.data)
    submit   the link's notebook pushed as a private kernel, 2×T4, internet off, once: a push whose
             answer is an error, a page the client cannot read, or no reply is *unsure* (Kaggle may
             have started its session: unsloth's CI names "a committed push answered with a 5xx", and a
             second push to the same kernel runs beside the first), so before any new push the lab reads
             the kernel back; one that never shows after a wait is pushed again under a new slug
    poll     its status, its log followed (lab.kaggle.logs) for the live curve, where Kaggle does not keep
             it until the session ends; a kernel not started `start_wait_s` after its push is given up
    delete   the kernel deleted: the public API has no other way to end a session (its cancel needs a
             session id no reply carries), and deleting stops the billing (unsloth measured the account's
             used hours go down)
"""
from __future__ import annotations

import itertools
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, TypeVar

from lab.config import UserError
from lab.faults import reached
from lab.kaggle.client import AccountClient, KaggleError
from lab.kaggle.limits import GPU_CHECKS_EN, GPU_CHECKS_RU
from lab.kaggle.logs import LiveLog
from lab.kaggle.probed import mark_cannot_run, nccl_setting, read_probe
from lab.kaggle.sessions import record_session
from lab.kernel.checkpoint import atomic_write, sha256_file
from lab.machines.control import read_control
from lab.machines.ending import Said
from lab.machines.handoff import SessionOutputs, read_marker
from lab.machines.kaggle.data import KaggleSettings, LinkContext, NotKept, ensure_checkpoint, ensure_data, \
    forget_dataset, stage_data
from lab.machines.kaggle.names import ckpt_slug, kernel_slug
from lab.machines.kaggle.record import KaggleLinkRecord, KernelPush
from lab.machines.kaggle.refusals import Refused, busy, check_limits, check_seats, kernel_exists, out_of_quota, \
    refused
from lab.machines.lifecycle import Away, LinkCtx, Seen, Session, Unreachable, age_s
from lab.runs import End, Link, Outcome, now, updating
from lab.spec import LinkSpec

T = TypeVar("T")

KAGGLE_CARDS = "2xT4"  # what every push asks for (the machine shape T4X2), and what the notebook checks it got
TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")
NOT_STARTED = ("QUEUED", "NEW_SCRIPT")
LOG_EVERY_POLLS = 4  # the log tail is fetched every 4th poll: at most one extra call per 2 minutes
PATIENCE_POLLS = 120  # Kaggle busy or unreachable this long (1 hour at 30 s) at one step: given up for now
LISTING_TRIES = 3  # an output listing that answers 403/404 after the session ended is asked this often
GONE_AFTER = 3  # looks in a row that find a kernel that ran gone (403/404): it is, and so is its session
MAX_PUSHES = 3  # pushes of one link whose answers were not known and whose kernels never showed: then it stops


class KaggleSession(Session):
    def __init__(self, ctx: LinkCtx, c: AccountClient, settings: KaggleSettings):
        super().__init__(ctx, f"Kaggle account '{c.account.name}'")
        self.c, self.settings = c, settings
        self.poll_s = settings.poll_s
        self.end_margin_s = self.rec().margin_min * 60
        self.data = LinkContext(c, ctx.say, settings)
        self.curve: LiveLog | None = None
        self.polls = self.missing = 0

    def rec(self) -> KaggleLinkRecord:
        return KaggleLinkRecord.of(self.ctx.link()[1])

    def stage(self) -> None:
        run, link = self.ctx.link()
        ckpt = {"slug": f"{self.c.username}/{ckpt_slug(run.id)}", "sha256": "0" * 64} if Away.of(link).source else None
        files = sum(1 for p in stage_data(Path(run.cfg.data_dir)).iterdir() if p.is_file())
        check_limits(self.notebook(self.spec(ckpt)), files, Path(run.cfg.data_dir))  # as it will be pushed
        ensure_data(run.id, link.n, self.data, Path(run.cfg.data_dir))
        ensure_checkpoint(run.id, link.n, self.data)

    def spec(self, ckpt: dict | None) -> LinkSpec:
        """The link's spec on Kaggle: the checkpoint dataset's mount name as `resume_from`, the sha256 of what
        the session must find, the cards (else it stops before training), the NCCL settings the probe found."""
        run, link = self.ctx.link()
        manifest = stage_data(Path(run.cfg.data_dir)) / "manifest.json"  # as uploaded: made once per data id
        mount, ckpt_sha256 = (ckpt["slug"].split("/")[1], ckpt["sha256"]) if ckpt else ("", "")
        return LinkSpec.of(run.cfg, limit_min=link.limit_min or 0.0, resume_from=mount, expect_ckpt_sha256=ckpt_sha256,
                           expect_data_sha256=sha256_file(manifest), expect_cards=KAGGLE_CARDS,
                           allow_cpu=self.settings.allow_cpu, nccl_env=nccl_setting(read_probe(self.c.account.name)))

    def notebook(self, spec: LinkSpec) -> dict:
        from lab.notebooks import link_notebook  # nbformat and papermill: only where a link is pushed
        return link_notebook(spec)

    def refusal(self, e: UserError) -> Outcome | None:
        found = e if isinstance(e, Refused) else busy(e)
        if found is not None:
            return Outcome(found.kind, str(found), found.ru, session=False, until=found.until)
        if isinstance(e, NotKept) or isinstance(e, KaggleError) and e.cause == "processing":
            return Outcome(End.ELSEWHERE, str(e), session=False)  # another account takes the run meanwhile
        return None

    def submitted(self) -> bool:
        return self.rec().kernel.sent

    def submit(self) -> None:
        for attempt in range(MAX_PUSHES + 1):
            kernel = self.rec().kernel
            if kernel.pushed_at:
                return
            if kernel.pushing:  # an answer not known: what Kaggle holds decides, never a second push blind
                if self._read_back(kernel):
                    return
                if attempt == MAX_PUSHES:
                    break
                self.rec().update_kernel(self.ctx.run_id, self.ctx.n, pushing=False, tried=kernel.tried + [kernel.slug],
                                         attempt=kernel.attempt + 1)
            self._push()
        raise KaggleError(self.c.account.name, f"{MAX_PUSHES} pushes of link {self.ctx.n} got no clear answer and "
                                               "none of their kernels showed on Kaggle",
                          "`lab watch RUN` reads them back once more before it pushes again.")

    def _push(self) -> None:
        run, link = self.ctx.link()
        record = self.rec()
        slug = f"{self.c.username}/{kernel_slug(run.id, link.n, record.kernel.attempt)}"
        check_seats(self.c, slug)  # another member's sessions fill the account: refused before anything is sent
        sources = [record.data["slug"]] + ([record.ckpt["slug"]] if record.ckpt else [])
        spec = self.spec(record.ckpt)
        nb = self.notebook(spec)
        folder = self.ctx.folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "pushed.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")  # the push as sent
        # A later link is pinned to the run's first link's image, unless `lab watch RUN --newest-image`.
        image = None if read_control(run.id).get("kaggle_image") == "newest" else self._first_image()
        kernel = record.update_kernel(run.id, link.n, slug=slug, sources=sources, nccl_env=spec.session.nccl_env,
                                      pushing=True)
        Away.update(run.id, link.n, spec=spec.to_dict())
        with updating(run.id) as r:
            r.links[link.n - 1].notebook = f"{Away.of(link).folder}/pushed.ipynb"
        try:
            pushed = self.c.push_kernel(slug, kernel.name, nb, dataset_sources=sources, image=image,
                                        timeout_s=record.session_timeout_s, gpu=True, internet=False, private=True)
        except KaggleError as e:
            self._not_pushed(kernel, e)
            return
        reached("after-push")
        self._pushed(version=pushed.version, url=pushed.url)

    def _first_image(self) -> str | None:
        run, link = self.ctx.link()
        images = (KaggleLinkRecord.of(x).image for x in run.links[:link.n - 1] if x.kind == "kaggle")
        return next(filter(None, images), None)

    def _not_pushed(self, kernel: KernelPush, e: KaggleError) -> None:
        """A push Kaggle did not plainly take: run without some sources (the session is real), unsure
        (read back before any new push: `submit`), or refused (raised as Refused, nothing started)."""
        if e.push is not None:  # Kaggle ran it, without some sources
            dropped = [s for s in kernel.sources if s in e.what] or kernel.sources
            for source in dropped:  # what the lab remembered is wrong: forget it, upload again next time
                forget_dataset(self.c.username, source)
            self.ctx.say(f"warning: {e}")
            self._pushed(version=e.push.version, url=e.push.url, dropped_sources=dropped)
            return
        if e.unsure:
            self.ctx.say(f"link {self.ctx.n}: {e.what}; the lab reads the kernel back before any new push")
            return  # still `pushing`: `submit` reads it back
        self.rec().update_kernel(self.ctx.run_id, self.ctx.n, pushing=False, refused=e.what)
        raise refused(e, self.c) from None

    def _read_back(self, kernel: KernelPush) -> bool:
        deadline = time.monotonic() + self.settings.unsure_wait_s
        while True:
            if patiently(self, f"link {self.ctx.n}: reading {kernel.slug} back", lambda: kernel_exists(self.c,
                                                                                                        kernel.slug)):
                self._pushed(version=None, url="", adopted=True)
                return True
            if time.monotonic() >= deadline:
                self.ctx.say(f"link {self.ctx.n}: {kernel.slug} is not on Kaggle {self.settings.unsure_wait_s:g} s "
                             "after a push whose answer was not known: that push started nothing; the lab pushes "
                             "again under a new name (and deletes that kernel should it show later)")
                return False
            time.sleep(min(self.settings.poll_s, max(0.0, deadline - time.monotonic())))

    def _pushed(self, **changes) -> None:
        kernel = self.rec().update_kernel(self.ctx.run_id, self.ctx.n, pushing=False, pushed_at=now(), **changes)
        version = f" version {kernel.version}" if kernel.version else ""
        self.ctx.say(f"link {self.ctx.n}: pushed {kernel.slug}{version}" + (f" ({kernel.url})" if kernel.url else ""))

    def poll(self) -> Seen:
        record = self.rec()
        kernel = record.kernel
        if self.curve is None:
            grace_s = self.settings.log_grace_s
            if (read_probe(self.c.account.name) or {}).get("log_while_running") is False:
                grace_s = 0.0  # the account's probe found the log kept until the end: said at the first RUNNING
            self.curve = LiveLog(self.c, kernel.slug, kernel.version, self.ctx.folder, grace_s=grace_s,
                                 retry_s=self.settings.poll_s).start()
        self._strays(kernel)
        asked = time.monotonic()
        try:
            status, failure = self.c.kernel_status(kernel.slug, kernel.version)
        except KaggleError as e:
            if e.status in (403, 404) and record.ran:  # asked again: a kernel may answer so for a moment
                self.missing += 1
                if self.missing >= GONE_AFTER:
                    return Seen("ended", said=Said.GONE, words=f"{kernel.slug} is gone from Kaggle (it answers HTTP "
                                                               f"{e.status}: deleted, or never kept)")
            if not e.retryable and e.status not in (403, 404):
                raise
            raise Unreachable(e.what) from None
        self.missing = 0
        self.polls += 1
        mode = self.curve.seen_status(status, asked)
        self._note(record, status, failure)
        if self.polls % LOG_EVERY_POLLS == 1:
            self._save_log(kernel.slug)
        if status in TERMINAL:
            return self._ended(status, failure)
        self._not_started(status, kernel)
        rows = self.curve.rows()
        return Seen("queued" if status in NOT_STARTED else "running", words=status, row=rows[-1] if rows else None,
                    activity=self.curve.events, alive=mode == "live",
                    note=at_end_note(self.curve.grace_s) if mode == "at_end" else None)

    def _note(self, record: KaggleLinkRecord, status: str, failure: str) -> None:
        if status != record.kaggle_status:
            KaggleLinkRecord.update(self.ctx.run_id, self.ctx.n, kaggle_status=status, failure=failure, status_at=now())
            self.ctx.say(f"link {self.ctx.n}: {record.kernel.slug} {status}" + (f": {failure}" if failure else ""))
        if status == "RUNNING" and not record.ran:  # the session started: any quota check at its start passed
            KaggleLinkRecord.update(self.ctx.run_id, self.ctx.n, ran=True, running_at=now())
            self._image_of()  # read now: a kernel deleted later keeps no word of it

    def _ended(self, status: str, failure: str) -> Seen:
        self.close()
        if status == "CANCEL_ACKNOWLEDGED" and self.ctx.record.stop_sent:
            return Seen("ended", words="cancelled on Kaggle", said=Said.CANCELLED)
        if status == "CANCEL_ACKNOWLEDGED":  # Kaggle's own stop at its runtime limit reads the same
            return Seen("ended", said=Said.CUT, words="the session ended CANCEL_ACKNOWLEDGED without being asked: "
                                                      "Kaggle's own stop, at its runtime limit most likely")
        return Seen("ended", said=Said.EXITED,
                    words=f"the session ended {status}" + (f": {failure}" if failure else ""))

    def _not_started(self, status: str, kernel: KernelPush) -> None:
        waited = age_s(kernel.pushed_at)
        if status in NOT_STARTED and waited > self.settings.start_wait_s:
            raise KaggleError(self.c.account.name, f"{kernel.slug} still reads {status} {waited / 60:.0f} min after "
                                                   "its push: Kaggle has not started it",
                              f"If it starts later, `lab watch RUN` follows it; to give it up, `lab cancel "
                              f"{self.ctx.run_id}` (it deletes the kernel {kernel.slug}), then `lab watch RUN` goes on "
                              "from the run's checkpoint.", retryable=False)

    def _strays(self, kernel: KernelPush) -> None:
        for slug in kernel.tried:
            try:
                if kernel_exists(self.c, slug):
                    self.c.delete_kernel(slug)
                    self.ctx.say(f"link {self.ctx.n}: {slug}, an earlier push that showed late, was deleted: the "
                                 f"link's session is {kernel.slug}")
            except KaggleError:
                pass  # asked again at the next look

    def close(self) -> None:
        if self.curve is not None:
            self.curve.stop()

    def _save_log(self, slug: str) -> None:
        try:
            text = self.c.kernel_log(slug)
        except UserError:
            return  # the log is a courtesy: the status decides
        if text:
            self.ctx.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(self.ctx.folder / "live.log", lambda f: f.write(text.encode("utf-8")))

    def fetch(self, folder: Path) -> str | None:
        kernel = self.rec().kernel
        for attempt in range(LISTING_TRIES):
            try:
                files = patiently(self, f"link {self.ctx.n}: downloading the outputs of {kernel.slug}",
                                  lambda: self.c.kernel_output(kernel.slug, folder))
                break
            except KaggleError as e:  # a session Kaggle cut off, or a kernel deleted, may leave none
                if e.status not in (403, 404):
                    raise
                if attempt == LISTING_TRIES - 1:
                    return f"Kaggle answered HTTP {e.status} when asked for the session's outputs: none came back"
                time.sleep(self.settings.poll_s)
        reached("after-download")
        self.ctx.say(f"link {self.ctx.n}: downloaded {len(files)} files into {folder}")
        return None

    def delete(self) -> str:
        kernel = self.rec().kernel
        try:
            self.c.delete_kernel(kernel.slug)
        except KaggleError as e:
            return f"Kaggle would not delete {kernel.slug} ({e.what}): stop it on {kernel.page}"
        return f"its kernel {kernel.slug} was deleted (that ends a Kaggle session and its billing); its unsaved work " \
               "is lost"

    def facts(self, seen: dict, out: SessionOutputs) -> dict:
        record, link = self.rec(), self.ctx.link()[1]
        extra: dict = {"signalled_by": "Kaggle (its runtime limit, or the account's weekly quota)",
                       "hint": f"The log is in {Away.of(link).folder}/{record.kernel.name}.log."}
        if record.kernel.dropped_sources:
            extra["hint"] += (f" Kaggle ran it without {', '.join(record.kernel.dropped_sources)}; the lab forgot "
                              "them and uploads them again on the next try.")
        if out.no_gpu:
            extra["unfit"] = self._no_cards(link, out.no_gpu)
        if record.kaggle_status == "ERROR" and not record.ran and not out.result and out_of_quota(self.c):
            extra.update(said=Said.NEVER, refused=End.NO_QUOTA,  # took the push, then refused the session at its start
                         words=f"the session never ran and the account's quota is spent ({record.failure or 'no reason'})")
        return extra

    def _no_cards(self, link: Link, found: dict) -> tuple[str, str]:
        account = link.machine
        got = ", ".join(f"{c.get('name')} (compute capability {c.get('capability')})" for c in found.get("found") or [])
        return (f"Kaggle account '{account}' ran link {link.n}'s session without the cards it was pushed for "
                f"({found.get('expected')}; it found {got or 'no CUDA device'}), so it stopped before training. "
                f"{GPU_CHECKS_EN}. The lab marks '{account}' as unable to run GPU sessions (`lab accounts` shows it); "
                f"once verified, `lab probe {account}`",
                f"аккаунт Kaggle '{account}' запустил сессию звена {link.n} без карт, для которых её отправили "
                f"({found.get('expected')}; нашлось: {got or 'ни одного устройства CUDA'}), и она остановилась до "
                f"обучения. {GPU_CHECKS_RU}. Лаба отмечает '{account}' как не способный запускать сессии GPU; после "
                f"подтверждения — `lab probe {account}`")

    def after(self, link: Link, out: SessionOutputs) -> None:
        folder = self.ctx.folder
        started = read_marker(folder / "preflight.json") or {}
        device = read_marker(folder / "device.json") or {}
        if started:  # what the session's start found: the image it ran and the cards
            device.update(image=started.get("image"), cards_found=started.get("found"))
            (folder / "device.json").write_text(json.dumps(device, indent=1), encoding="utf-8")
        if not self.rec().image:
            self._image_of()
        measured = measure(link, folder, out)
        KaggleLinkRecord.update(self.ctx.run_id, self.ctx.n, measured=measured)
        record_session(link.machine, self.ctx.run_id, link.n, link.ended, measured)
        if link.outcome.kind is End.UNFIT:
            mark_cannot_run(link.machine, link.reason, link.outcome.reason_ru or link.reason,
                            f"run {self.ctx.run_id} link {link.n}")
        if link.outcome.kind is End.PUSH_AGAIN:
            time.sleep(self.settings.input_wait_s)  # Kaggle mounts what it made READY a little later

    def _image_of(self) -> None:
        kernel = self.rec().kernel
        try:
            image = self.c.kernel_image(kernel.slug)
        except KaggleError:
            return  # a kernel deleted meanwhile: its image is not known
        KaggleLinkRecord.update(self.ctx.run_id, self.ctx.n, image=image)
        first = self._first_image()
        if image and first and image != first:
            self.ctx.say(f"link {self.ctx.n} runs on Kaggle's image {image}, not the run's first ({first})")


def at_end_note(grace_s: float) -> tuple[str, str]:
    """(English, Russian) of the monitor's note on a log Kaggle keeps until the end; `grace_s` 0: the probe found so."""
    en = f"nothing in {grace_s / 60:.0f} min of running" if grace_s else "the account's probe found so"
    ru = f"ничего за {grace_s / 60:.0f} мин работы" if grace_s else "так нашла проба аккаунта"
    return (f"Kaggle does not show this session's log until it ends ({en}): the curve comes with its outputs.",
            f"Kaggle не показывает журнал этой сессии, пока она не кончится ({ru}): кривая придёт вместе с её "
            "результатами.")


def _epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def _span(start: float | None, end: float | None) -> float | None:
    return round(end - start, 3) if start is not None and end is not None else None


def measure(link: Link, folder: Path, out: SessionOutputs) -> dict:
    """What the link's session measured from its timeline, its result and what the watch saw, kept per account
    by lab.kaggle.sessions (which gives the margin the next push asks)."""
    d, marks, result = KaggleLinkRecord.of(link), out.timeline or {}, out.result or {}
    first, ended = marks.get("first_cell"), marks.get("ended")
    pushed, ended_seen = _epoch(d.kernel.pushed_at), _epoch(d.status_at)
    started = first if first is not None else _epoch(d.running_at)
    stopped_by_limit = result.get("reason") == "time limit" and not result.get("failed")
    ended_by_itself = bool(result or out.input_not_ready or out.no_gpu)
    came_back = any((folder / name).is_file() for name in ("metrics.jsonl", "result.json"))
    ran = started is not None or d.ran
    return {
        "boot_s": _span(pushed, first),
        "data_checks_s": _span(first, marks.get("inputs_checked")),
        "compile_s": result.get("compile_s"),
        "first_step_s": result.get("first_step_s"),
        "final_save_s": result.get("save_s"),
        "overrun_s": _span(first + link.limit_min * 60, ended) if stopped_by_limit and first and link.limit_min
        else None,
        "output_copy_s": _span(ended, ended_seen),
        "ended": {"status": d.kaggle_status, "failure": d.failure or "",
                  "outputs": came_back, "cut_off": ran and not ended_by_itself
                  and d.kaggle_status != "COMPLETE" and not Away.of(link).stop_sent,
                  "ran_s": _span(started, ended_seen), "timeout_s": d.session_timeout_s},
    }


def patiently(session: KaggleSession, what: str, fn: Callable[[], T]) -> T:
    """`fn()` until Kaggle answers: a busy or unreachable Kaggle is waited out (its Retry-After, else a poll),
    for PATIENCE_POLLS polls at most; then the last error is raised."""
    deadline = time.monotonic() + PATIENCE_POLLS * session.settings.poll_s
    for tries in itertools.count(1):
        try:
            return fn()
        except KaggleError as e:
            left = deadline - time.monotonic()
            if not e.retryable or left <= 0:
                raise
            wait = min(left, max(session.settings.poll_s, e.wait_s or 0.0))
            until = (datetime.now(timezone.utc) + timedelta(seconds=wait)).strftime("%H:%M:%S UTC")
            session.ctx.say(f"{what}: {e.what}; waiting until {until} (try {tries})")
            time.sleep(wait)
