"""What the control notebook asks of the lab, in one place: `lab.machines` (the machines,
the Auto rule, starting, stopping, continuing and watching runs), the accounts (add, remove,
probe, their checkpoint datasets), the data (constellations declared, edited, prepared) and
what the form lists. Nothing here returns a secret; a credential given (an uploaded
kaggle.json, a pasted token) is only passed on to be stored as `lab accounts add` stores it.

The machines' overview asks Kaggle for every account's quota, so it is kept until the
machines panel's Refresh: the form asks the Auto rule on every change, over this copy.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from lab import sizing
from lab.config import RunConfig, UserError, fields_off_defaults
from lab.corpus.manifests import train_tokens_by_constellation
from lab.machines import driver as machines
from lab.machines.control import spawn_driver
from lab.settle import register_run
from lab.ui.text import tr

Machine, Choice = machines.Machine, machines.Choice

_overview: list | None = None
_gpu: tuple[str, str] | None = None


def local_gpu() -> tuple[str, str]:
    """(this computer's card as the calculator names it (`lab.sizing.card_for`), or "" when the calculator has no
    figures for it; the card's own name and memory, for people)."""
    global _gpu
    if _gpu is None:
        card = machines.local_gpu()
        card = card if sizing.card_for(card) is not None else ""
        _gpu = (card, _describe_gpu())
    return _gpu


def _describe_gpu() -> str:
    cards = machines.local_cards()
    if cards:
        return (f"{len(cards)}× " if len(cards) > 1 else "") + cards[0]
    return f"CPU ({os.cpu_count() or 1})"


def overview(refresh: bool = False) -> list:
    """This computer and every Kaggle account (`lab.machines.overview`), asked once and kept."""
    global _overview
    if refresh or _overview is None:
        _overview = machines.overview()
        _holds.clear()
    return _overview


_holds: dict[tuple, dict[str, set[str]]] = {}  # (data folder, constellations) -> what each account holds


def choose(cfg: RunConfig, need_hours: float | None) -> Choice:
    """The Auto rule over the kept overview, with what each account already holds asked the
    way the run's driver asks it (`lab.machines.holdings`): no call to Kaggle per keystroke."""
    found = overview()
    key = (cfg.data_dir, tuple(cfg.constellations))
    if key not in _holds:
        _holds[key] = machines.holdings(found, cfg)
    return machines.choose(cfg, need_hours, machines=found, holds=_holds[key])


def start(cfg: RunConfig, machine: str = "auto", resume: str | None = None) -> str:
    """Registers the run the form describes and returns its id; a background process drives it.
    Given are the fields off their defaults: a new run from a checkpoint keeps the checkpoint's
    run in every other field."""
    global _overview
    run = register_run({name: getattr(cfg, name) for name in fields_off_defaults(cfg)}, resume, machine)
    spawn_driver(run.id)
    _overview = None  # the kept overview no longer says who is busy
    _holds.clear()
    return run.id


def status(run_id: str) -> dict:
    """{"status", "links", "log_tail", "message", "message_ru", ...} of a run."""
    return machines.status(run_id)


def cancel(run_id: str) -> str:
    """What `lab cancel RUN` does: no further link; this computer's session saves a checkpoint
    and stops; a Kaggle session goes on until it is stopped on its page. Returns what happened."""
    return machines.cancel(run_id)


def continue_run(run_id: str, given: dict | None = None, machine: str | None = None) -> str:
    """Registers the run to go on from its newest checkpoint (`given` on top of its own fields:
    a higher `steps_until` continues a finished run) and drives it in the background."""
    global _overview
    run = register_run(dict(given or {}), run_id, machine)
    spawn_driver(run.id)
    _overview = None
    return run.id


def branch(run_id: str, at: int, decay_frac: float) -> str:
    """A cooldown branch of the run from its checkpoint at `at`, driven in the background."""
    from lab.recipes.branch import start_branch
    return start_branch(run_id, at, decay_frac)


def in_background(fn, *args, on_done=None, on_error=None) -> threading.Thread:
    """Runs `fn(*args)` in a daemon thread; hands the result or the exception to the callbacks."""
    def work():
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001 - shown to the person by on_error
            if on_error:
                on_error(e)
            return
        if on_done:
            on_done(result)
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


class Latest:
    """Runs `fn(*args)` in one background thread; only the newest request's answer is kept."""

    def __init__(self, fn, done):
        self.fn, self.done = fn, done
        self.lock, self.idle = threading.Lock(), threading.Event()
        self.pending, self.thread = None, None
        self.idle.set()

    def submit(self, *args) -> None:
        with self.lock:
            self.pending = args
            self.idle.clear()
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.lock:
                args, self.pending = self.pending, None
                if args is None:
                    self.thread = None
                    self.idle.set()
                    return
            try:
                result, error = self.fn(*args), None
            except Exception as e:  # noqa: BLE001 - handed to `done`
                result, error = None, e
            with self.lock:
                stale = self.pending is not None
            if not stale:
                self.done(args, result, error)

    def wait(self, timeout_s: float = 30.0) -> bool:
        return self.idle.wait(timeout_s)


# ---------------------------------------------------------------------------------------
# What the form lists


def constellation_tokens() -> dict[str, int]:
    """Train tokens per constellation, for the form's list (`lab.corpus.manifests`)."""
    return train_tokens_by_constellation()


def account_names() -> list[str]:
    try:
        from lab.kaggle import client as kaggle_client
        return [a.name for a in kaggle_client.list_accounts()]
    except UserError:
        return []


def box_cards() -> dict[str, str]:
    """The lab's boxes over SSH, each with the card set its check found ("" before a check)."""
    from lab.machines.ssh_boxes import list_boxes, read_check
    try:
        return {b.name: (read_check(b.name) or {}).get("gpu") or "" for b in list_boxes()}
    except UserError:
        return {}


def machine_cards(machine: str) -> str:
    """The card set of the machine a run goes to, as its check or this computer found it ("" for
    Kaggle's, Auto's or an unchecked machine's)."""
    if machine == "local":
        return local_gpu()[0]
    if machine == "auto":
        return ""
    from lab.machines.ssh_boxes import read_check
    return (read_check(machine) or {}).get("gpu") or ""


def machine_choices(accounts: list[str] | None = None) -> list[tuple[str, str]]:
    """The machines a run may be sent to, as the form and the runs cell list them."""
    boxes = box_cards()
    return ([(tr("Auto", "Авто"), "auto"), (tr("This computer", "Этот компьютер"), "local")]
            + [(f"Kaggle: {a}", a) for a in (account_names() if accounts is None else accounts)]
            + [(f"{tr('Box', 'Машина')}: {name}" + (f" ({gpu})" if gpu else ""), name) for name, gpu in boxes.items()])


def checkpoints() -> dict[str, dict]:
    """Every checkpoint of the lab's runs, newest run first: path -> {step, config, path, run}."""
    from lab.kernel.checkpoint import list_checkpoints
    from lab.runs import list_runs
    out: dict[str, dict] = {}
    for run in sorted(list_runs(), key=lambda r: (r.created, r.id), reverse=True):
        for pt in reversed(list_checkpoints(run.folder / "checkpoints")):
            info = sizing.checkpoint_info(str(pt))
            if info:
                out[info["path"]] = {**info, "run": run.id}
    return out


# ---------------------------------------------------------------------------------------
# Accounts and machines (the machines cell)


def check_account_name(name: str) -> None:
    """Raises UserError when `name` cannot be a new account's (bad, or taken)."""
    from lab.kaggle.accounts import check_new_name
    check_new_name((name or "").strip())


def add_account(name: str, kaggle_json: bytes | None = None, token: str | None = None,
                username: str | None = None, filename: str = "kaggle.json"
                ) -> tuple[str, str, float | None, float | None, UserError | None]:
    """Stores a Kaggle account as `lab accounts add` does (its folder 0700, the file 0600) and
    checks it with Kaggle: (name, Kaggle user, quota left h, total h, why it could not be
    checked). Credentials Kaggle refuses are removed again and raised. `filename`: the uploaded
    file's, for its errors."""
    global _overview
    from lab.kaggle import client as kc
    from lab.kaggle.accounts import parse_kaggle_json
    name = (name or "").strip()
    if kaggle_json is not None:
        parse_kaggle_json(kaggle_json, filename)  # an error names the person's file
    if token is not None:
        token = token.strip()
        username = (username or "").strip() or kc.token_username(token, account=name or "new account")
    account = kc.add_account(name, kaggle_json=kaggle_json, token=token, username=username)
    _overview = None
    try:
        quota = kc.verify_new_account(account)
    except kc.KaggleError as e:
        if e.status in (401, 403):
            raise
        return account.name, account.username, None, None, e
    return account.name, account.username, quota.left_s / 3600, quota.total_s / 3600, None


def remove_account(name: str) -> None:
    """Forgets an account (its credentials deleted); refused while a run has a session there."""
    global _overview
    from lab.kaggle import client as kc
    from lab.machines.control import active_runs
    busy = active_runs().get(name)
    if busy:
        raise UserError(f"account {name} runs {', '.join(busy)} now: stop it first",
                        ru=f"на аккаунте {name} сейчас идёт {', '.join(busy)}: сначала остановите")
    kc.remove_account(name)
    _overview = None


def probe_cost() -> tuple[str, str]:
    """What a probe costs, (English, Russian), shown before the person confirms it."""
    from lab.probe.account import cost_line, settings_plan
    plan = settings_plan()
    return cost_line(plan), cost_line(plan, ru=True)


def probe(name: str, say) -> dict:
    """`lab probe NAME`: pushes the short probe session, stores and returns its record."""
    from lab.probe.account import probe_account
    return probe_account(name, say=say)  # as `lab probe` runs it: the person's settings


def check_machine(name: str, say: Callable[[str], None]) -> None:
    """The machine's own check (`Host.check`): raises UserError when it cannot be used now;
    `say` is told what a long one is doing."""
    machines.host_for(name).check(say)


def checkpoint_datasets() -> list[dict]:
    """The runs' checkpoint datasets kept on each account ({"account", "slug", "bytes", "run",
    "status", "finished"}), and {"account", "error"} for an account that could not be asked."""
    from lab.kaggle import client as kc
    from lab.machines.kaggle_data import checkpoint_datasets as on_account
    out: list[dict] = []
    for a in kc.list_accounts():
        try:
            out += [{"account": a.name, **d} for d in on_account(kc.client_for(a, retry=_list_retry(), timeout_s=30.0))]
        except UserError as e:  # one account's trouble does not hide the rest
            out.append({"account": a.name, "error": e})
    return out


def remove_checkpoint_dataset(account: str, slug: str) -> None:
    from lab.kaggle import client as kc
    from lab.machines.kaggle_data import remove_checkpoint_dataset as remove
    remove(kc.client_for(account, retry=_list_retry(), timeout_s=30.0), slug)


def _list_retry():
    from lab.kaggle.client import RetryPolicy
    return RetryPolicy(attempts=2, base_s=1.0, cap_s=2.0, max_retry_after_s=10.0)


# ---------------------------------------------------------------------------------------
# The data (the data cell)


def constellations() -> list[dict]:
    """Each declared constellation with its sources, licence and train tokens where prepared."""
    from lab import corpus
    tokens = constellation_tokens()
    return [{"name": c.name, "description": c.description, "sources": list(c.sources), "licence": c.licence,
             "source": c.source, "tokens": tokens.get(c.name)} for c in corpus.load_constellations().values()]


def save_uploads(name: str, files: list[tuple[str, bytes]]) -> tuple[str, list[str]]:
    """Uploaded text files kept in `$LAB_HOME/texts/<name>/`: (that folder as a source, relative to
    the lab home; the names skipped as not text files)."""
    from lab.corpus.constellations import TEXT_SUFFIXES, _check_name
    from lab.home import lab_home
    _check_name(name, f"constellation name {name!r}")
    folder = lab_home() / "texts" / name
    skipped = []
    for filename, data in files:
        base = Path(filename).name
        if not base or base.startswith(".") or not base.lower().endswith(TEXT_SUFFIXES):
            skipped.append(filename)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / base).write_bytes(data)
    return f"texts/{name}", skipped


def add_constellation(name: str, sources: list[str], description: str = "", licence: str = "", source: str = ""):
    from lab.corpus.constellations import add_constellation as add
    return add(name, sources, description, licence, source)


def update_constellation(name: str, sources: list[str], description: str = "", licence: str = "", source: str = ""):
    from lab.corpus.constellations import update_constellation as update
    return update(name, sources, description, licence, source)


def remove_constellation(name: str) -> None:
    from lab.corpus.constellations import remove_constellation as remove
    remove(name)


def prepare(names: list[str], progress) -> Path:
    """`lab prepare -c NAME ...`, telling `progress(stage, done, total)` as it goes."""
    from lab import corpus
    return corpus.prepare(names, progress=progress)
