"""`lab probe ACCOUNT`: a short Kaggle session that tests an account before a run depends on it.

What it finds out (lab.trial.session runs there, lab.trial.worker under
torchrun): whether Kaggle gives the account a GPU session at all (it offers GPUs only to verified
accounts: the phone, and for accounts made after December 2025 the identity too; until then it runs
a GPU push without a GPU, and its quota says the account never started a GPU session), the GPUs, driver, CUDA, torch and NCCL versions, an all-reduce
across the cards, a short training burst at the reference size (fp16 on T4s) giving measured
tokens/s, where /kaggle/input mounts the lab's data (a small private dataset `lab-probe-input`
with a marker file, uploaded as a new version each time), free disk; and, from this side,
whether Kaggle shows a running session's log (lab.kaggle.logs).

The verdict and facts are stored in `$LAB_HOME/accounts/<name>/probe.json`, the burst as a run
folder in `probe/` beside it (lab.kaggle.probed), where the calculator finds it as a
measurement. On the emulator the same code runs on its CPU at tiny sizes, and the stored
figures say "cpu".
"""
from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import nbformat

from lab.config import UserError, card_set
from lab.kaggle.client import AccountClient, KaggleError, RetryPolicy, client_for, get_account
from lab.kaggle.limits import GPU_CHECKS_EN, GPU_CHECKS_RU
from lab.kaggle.logs import LiveLog
from lab.kaggle.probed import MEASURED_FOLDER, store_measurement, store_probe
from lab.machines.kaggle.data import KaggleSettings
from lab.trial.sources import CPU_SIZE, GPU_SIZE, session_source, worker_source

KERNEL_SLUG = "lab-probe"
DATASET_SLUG = "lab-probe-input"
MARKER = "lab-probe-marker.json"
TERMINAL = ("COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED")


@dataclass(frozen=True)
class ProbePlan:
    """How the probe runs. `steps`: the burst (the calculator counts a speed after 20 steps of
    warm-up, from 5 steps on); `hold_s`: the session lasts at least this long, so a log that
    Kaggle flushes now and then shows something while it runs; `log_grace_s`: running this long
    with no line read means the log is kept until the end; `worker_timeout_s`: a hung NCCL costs
    this much at most; `session_timeout_s`: Kaggle stops the session then, whatever happens."""
    steps: int = 30
    hold_s: float = 150.0
    log_grace_s: float = 120.0
    worker_timeout_s: float = 420.0
    session_timeout_s: int = 1200
    poll_s: float = 30.0
    dataset_wait_s: float = 900.0
    allow_cpu: bool = False  # a session without GPU is no verdict against the account (LAB_KAGGLE_ALLOW_CPU=1)
    gpu_size: dict = field(default_factory=lambda: dict(GPU_SIZE))
    cpu_size: dict = field(default_factory=lambda: dict(CPU_SIZE))

    def cost_min(self) -> tuple[float, float]:
        """(about, at most) minutes of GPU quota the probe's session runs: the hold, inside which
        the checks and the burst run, and the notebook's cells around it, as measured against the
        emulator (AROUND_HOLD_S); at most the session timeout. Kaggle's start-up of the session
        comes on top and is not measured."""
        return round((self.hold_s + AROUND_HOLD_S) / 60, 1), self.session_timeout_s / 60


# The probe's session against the emulator at time scale 1 (2026-12-01, the kit's 2-core VM at load
# ~9): its notebook ran 154.7 s from its first cell to its end, 150 s of them the hold, inside which
# the checks and the 30-step burst took 28 s; the cells before and after the hold, 4.7 s. What
# Kaggle charges for starting a GPU session before the notebook runs is not measured.
AROUND_HOLD_S = 5.0


def cost_line(plan: ProbePlan, ru: bool = False) -> str:
    about, most = plan.cost_min()
    held = plan.hold_s / 60
    if ru:
        about_ru, held_ru = f"{about:.1f}".replace(".", ","), f"{held:.1f}".replace(".", ",")
        return (f"Проба займёт около {about_ru} мин квоты GPU аккаунта в своей сессии ({held_ru} из них сессия "
                f"держится ради проверки журнала, проверки идут внутри), плюс запуск сессии на Kaggle — он пока не "
                f"измерен; не больше {most:.0f} мин (тайм-аут сессии). Один раз на аккаунт.")
    return (f"The probe uses about {about:.1f} min of the account's GPU quota in its session ({held:.1f} of them "
            f"holding it for the log check, the checks running inside), plus Kaggle's start-up of the session, "
            f"not measured yet; at most {most:.0f} min (its session timeout). Once per account.")


# ---------------------------------------------------------------------------------------------
# The notebook that is pushed


def probe_notebook(plan: ProbePlan) -> dict:
    """The probe notebook: its parameters, the worker script (the lab's GPT and the burst) as a
    file for torchrun, the session code, and the call."""
    worker = worker_source()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    params = (f"marker = {MARKER!r}\ngpu_size = {plan.gpu_size!r}\ncpu_size = {plan.cpu_size!r}\n"
              f"steps = {plan.steps!r}\nhold_s = {plan.hold_s!r}\nworker_timeout_s = {plan.worker_timeout_s!r}\n")
    cells = [md("# Probe this account's machine\n`lab probe ACCOUNT` pushes this notebook: it records what the "
                "session has (GPUs, versions, an all-reduce, a short training burst, the input mount, free disk) "
                "in `probe/probe.json`."),
             code(params, metadata={"tags": ["parameters"]}),
             code("%%writefile lab_probe_worker.py\n" + worker),
             code(session_source()),
             code("facts = probe_main(marker, gpu_size, cpu_size, steps, hold_s, worker_timeout_s)\n"
                  "Path('lab_probe_worker.py').unlink(missing_ok=True)")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"probe-{i:02d}"
    return json.loads(nbformat.writes(nb))


# ---------------------------------------------------------------------------------------------
# One probe


def settings_plan() -> ProbePlan:
    """The probe as the person's settings have it: status polled as often as LAB_KAGGLE_POLL_S
    says (default 30 s), a session without GPU taken as LAB_KAGGLE_ALLOW_CPU says."""
    settings = KaggleSettings.from_env()
    return ProbePlan(poll_s=settings.poll_s, allow_cpu=settings.allow_cpu)


def probe_account(name: str, plan: ProbePlan | None = None, say: Callable[[str], None] = print) -> dict:
    """Probes the account: pushes the probe, follows it, stores and returns the record (`plan`:
    the person's settings' when not given)."""
    plan = plan or settings_plan()
    account = get_account(name)
    c = client_for(account, retry=RetryPolicy(attempts=4, base_s=1.0, cap_s=20.0))
    say(f"{name}: {cost_line(plan)}")
    nonce = secrets.token_hex(8)
    source = _upload_marker(c, account.folder, nonce, plan, say)
    slug = f"{c.username}/{KERNEL_SLUG}"
    started = datetime.now(timezone.utc)
    try:
        pushed = c.push_kernel(slug, KERNEL_SLUG, probe_notebook(plan), dataset_sources=[source],
                               timeout_s=plan.session_timeout_s, gpu=True, internet=False, private=True)
    except KaggleError as e:
        if e.push is None:
            return _refused(name, c, e, started)
        pushed = e.push  # it runs without the marker: the mount check says so
    say(f"{name}: pushed {slug} version {pushed.version}; waiting for it to end")
    status, failure, log_mode = _follow(c, slug, pushed.version, account.folder / "probe-log", plan, say)
    seen = Seen(status, failure, log_mode, nonce, started, _has_ever_run(c))
    return _collect(name, c, slug, pushed.version, seen, account.folder, plan.allow_cpu)


def _upload_marker(c: AccountClient, folder: Path, nonce: str, plan: ProbePlan, say) -> str:
    """A new version of the probe's private dataset, holding one marker file with a fresh nonce,
    so the session tells whether it saw this very version."""
    stage = Path(tempfile.mkdtemp(prefix="lab-probe-", dir=folder))
    try:
        (stage / MARKER).write_text(json.dumps({"nonce": nonce}), encoding="utf-8")
        slug = f"{c.username}/{DATASET_SLUG}"
        c.upload_dataset(slug, stage, DATASET_SLUG, notes=f"probe {nonce}")
        say(f"{c.account.name}: uploaded the probe's input {slug}; waiting until Kaggle has it ready")
        c.wait_dataset_ready(slug, plan.dataset_wait_s, poll_s=min(10.0, plan.poll_s))
        return slug
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _follow(c: AccountClient, slug: str, version: int | None, log_folder: Path, plan: ProbePlan,
            say) -> tuple[str, str, str]:
    """Polls the session to its end while reading its log; (status, failure, log mode)."""
    live = LiveLog(c, slug, version, log_folder, grace_s=plan.log_grace_s, retry_s=min(plan.poll_s, 10.0)).start()
    deadline = time.monotonic() + plan.session_timeout_s + 1800
    last = None
    try:
        while True:
            try:
                asked = time.monotonic()
                status, failure = c.kernel_status(slug, version)
            except KaggleError as e:
                if not e.retryable or time.monotonic() > deadline:
                    raise
                time.sleep(plan.poll_s)
                continue
            mode = live.seen_status(status, asked)
            if status != last:
                say(f"{c.account.name}: {slug} {status}" + (f": {failure}" if failure else ""))
                last = status
            if status in TERMINAL:
                return status, failure, mode
            if time.monotonic() > deadline:
                raise UserError(f"the probe {slug} still reads {status} long past its timeout: open it on Kaggle "
                                "and press Stop session, then probe again")
            time.sleep(plan.poll_s)
    finally:
        live.stop()
        shutil.rmtree(log_folder, ignore_errors=True)


@dataclass(frozen=True)
class Seen:
    """What this side saw of the probe's session: how it ended, its log's mode, the marker's nonce, when
    it was pushed, and whether Kaggle's quota says the account has ever started a GPU session after it
    (None: not asked)."""
    status: str
    failure: str
    log_mode: str
    nonce: str
    started: datetime
    has_ever_run: bool | None = None


def _has_ever_run(c: AccountClient) -> bool | None:
    try:
        return c.quota().has_ever_run
    except UserError:
        return None


def _collect(name: str, c: AccountClient, slug: str, version: int | None, seen: Seen, folder: Path,
             allow_cpu: bool = False) -> dict:
    """Downloads the probe's outputs and stores the verdict."""
    out = Path(tempfile.mkdtemp(prefix="lab-probe-out-", dir=folder))
    try:
        facts = None
        try:
            c.kernel_output(slug, out)
            facts = json.loads((out / "probe" / "probe.json").read_text(encoding="utf-8"))
        except (UserError, OSError, ValueError):
            pass
        record = _verdict(name, slug, version, seen, facts, allow_cpu)
        if facts is not None and (facts.get("worker") or {}).get("burst"):
            store_measurement(folder / MEASURED_FOLDER, out / "probe" / "metrics.jsonl", facts, record["gpu"])
        store_probe(name, record)
        return record
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _verdict(name: str, slug: str, version: int | None, seen: Seen, facts: dict | None,
             allow_cpu: bool = False) -> dict:
    status, failure = seen.status, seen.failure
    record = {"format": 1, "account": name, "at": seen.started.isoformat(timespec="seconds"), "kernel": slug,
              "version": version, "status": status, "can_run": True, "why": None, "why_ru": None,
              "log_while_running": {"live": True, "at_end": False}.get(seen.log_mode), "facts": facts}
    if facts is None:  # the probe failed, which says nothing sure of the account: Auto still tries it
        record.update(can_run=None, why=f"the probe session ended {status} without its results"
                      + (f" ({failure})" if failure else ""),
                      why_ru=f"сессия пробы кончилась ({status}) без результатов"
                      + (f" ({failure})" if failure else ""))
        return record
    gpus = facts.get("gpus") or []
    worker = facts.get("worker") or {}
    record["gpu"] = card_set(gpus[0]["name"], len(gpus)) if gpus else "cpu"
    record["all_reduce"] = worker.get("all_reduce")
    record["tok_s"] = (worker.get("burst") or {}).get("tok_s")
    record["image"], record["nccl_env"] = facts.get("image"), facts.get("nccl_env") or {}
    marker = facts.get("input_marker") or ""
    record["input"] = {"mount": facts.get("input_mount"), "this_version": seen.nonce in marker}
    # A GPU push Kaggle ran without a GPU, while its quota says the account never started a GPU session:
    # not verified, whatever LAB_KAGGLE_ALLOW_CPU says (the session ran on its CPU alone).
    unverified = not gpus and seen.has_ever_run is False
    record.update(_cards_verdict(name, gpus, worker, allow_cpu and not unverified))
    if not gpus and allow_cpu and not unverified:
        record.update(warning="the session had no GPU: a run there trains on the CPU (LAB_KAGGLE_ALLOW_CPU=1)",
                      warning_ru="в сессии не было GPU: прогон там учился бы на CPU (LAB_KAGGLE_ALLOW_CPU=1)")
    elif gpus and not record["input"]["mount"]:
        record.update(warning="the session did not find the probe's input under /kaggle/input",
                      warning_ru="сессия не нашла вход пробы в /kaggle/input")
    return record


def _cards_verdict(name: str, gpus: list, worker: dict, allow_cpu: bool) -> dict:
    """{"can_run", "why", "why_ru"} from what the session found of its cards."""
    if not gpus and not allow_cpu:
        return {"can_run": False, "why": f"the session had no GPU. {GPU_CHECKS_EN}; then `lab probe {name}` again",
                "why_ru": f"в сессии не было GPU. {GPU_CHECKS_RU}; затем снова `lab probe {name}`"}
    if worker.get("error"):
        return {"can_run": False, "why": f"the cards' check failed: {worker['error']}",
                "why_ru": f"проверка карт не прошла: {worker['error']}"}
    if not (worker.get("all_reduce") or {}).get("ok"):
        return {"can_run": False, "why": "the all-reduce across the cards gave a wrong result",
                "why_ru": "all-reduce между картами дал неверный результат"}
    return {}


def _refused(name: str, c: AccountClient, e: KaggleError, started: datetime) -> dict:
    """Kaggle refused the GPU session. Busy, at its session cap, out of quota, or an empty draft that
    would not go: none of it says anything of the account, so no verdict is stored and the account
    stays usable; any other refusal is the verdict."""
    if e.cause == "busy":
        raise UserError(f"{e} The probe stored nothing: try it again when Kaggle is less busy.") from None
    if e.cause == "session-cap":
        raise UserError(f"{e} The probe needs a free GPU session: try again when one ends.") from None
    if e.cause == "shell":
        raise UserError(f"{e} The probe stored nothing.") from None
    try:
        out_of_quota = e.cause == "quota" or c.quota().left_s < 60
    except UserError:  # the quota could not be asked: no verdict from an answer not had
        raise UserError(f"{e} The quota could not be asked either: the probe stored nothing; try it again "
                        "later.") from None
    if out_of_quota:
        raise UserError(f"{e} The probe needs a few minutes of GPU quota: try again after the weekly "
                        "refresh.") from None
    record = {"format": 1, "account": name, "at": started.isoformat(timespec="seconds"), "kernel": None,
              "version": None, "status": "refused", "can_run": False,
              "why": f"Kaggle refused a GPU session: {e.what}. {e.todo}",
              "why_ru": f"Kaggle отказал в сессии GPU: {e.what}. {GPU_CHECKS_RU}.",
              "log_while_running": None, "facts": None}
    store_probe(name, record)
    return record
