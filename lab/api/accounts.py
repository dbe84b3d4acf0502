"""Kaggle accounts: listed with their quota, added (a kaggle.json or a pasted token, stored with
mode 0600 and never echoed), removed, probed; their sessions' measurements and the runs'
checkpoint datasets kept on them. Nothing here returns a secret.

    accounts(offline)                 each account as an AccountRow: user, quota (both "left" figures, and
                                      used past the total), probe, runs there, a hint before its first run
    add(name, kaggle_json | token)    stored and checked with Kaggle: an Added
    remove(name)                      refused while a run has a session there
    checkpoint_datasets(name)         each account's checkpoint datasets, and its storage
    probe_cost(), probe(name, say)    `lab probe`; probe_record(name) the stored verdict
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.kaggle import client as kc
from lab.kaggle.accounts import check_new_name, get_account, list_accounts, parse_kaggle_json, read_token_file
from lab.kaggle.limits import GPU_CHECKS_EN, GPU_CHECKS_RU
from lab.kaggle.probed import age, read_probe, summary
from lab.kaggle.sessions import seen_line, session_overheads
from lab.machines.control import active_runs
from lab.machines.kaggle.data import account_storage, remove_checkpoint_dataset
from lab.machines.kaggle.data import checkpoint_datasets as datasets_on
from lab.probe.account import cost_line, probe_account, settings_plan

KaggleError = kc.KaggleError
# A list asks every account in turn: short waits, few tries, so one dead account is quick.
LIST_RETRY = kc.RetryPolicy(attempts=2, base_s=1.0, cap_s=2.0, max_retry_after_s=10.0)


@dataclass(frozen=True)
class AccountRow:
    """One account as `lab accounts` and the machines panel list it. `error`: why its quota could
    not be read (its credentials damaged, Kaggle's answer); quota figures in hours: `quota_left_h`
    what a new session has (total − used − what running sessions hold reserved: the lab plans with
    it), `quota_said_left_h` total − used (what `kaggle quota` shows), `quota_used_h` may pass the
    total (a running session is not stopped at it); `auth` how its credentials are sent ("key": a
    username and API key, "token": an access token); `hint`: a word before its first run."""
    name: str
    username: str
    quota_left_h: float | None = None
    quota_total_h: float | None = None
    refresh: str | None = None  # "YYYY-MM-DD HH:MM" UTC
    error: str | None = None
    probe: str = ""  # the last probe's verdict and age, in English
    probe_ru: str = ""
    runs: list[str] = field(default_factory=list)
    sessions_seen: str | None = None  # what its sessions measured, one line
    quota_said_left_h: float | None = None
    quota_used_h: float | None = None
    auth: str = "key"
    hint: str | None = None
    hint_ru: str | None = None

    @property
    def quota_over_h(self) -> float:
        """How far its sessions ran past the weekly total (0 when they did not)."""
        if self.quota_used_h is None or self.quota_total_h is None:
            return 0.0
        return max(0.0, self.quota_used_h - self.quota_total_h)


@dataclass(frozen=True)
class Added:
    """An account just stored: its name and Kaggle user, its quota as Kaggle answered (hours), or
    why Kaggle could not be asked (the account is kept); `auth` how it was stored ("key" or "token"),
    and `stored_as`, `stored_as_ru` that in words for the person (a KGAT_ key from a kaggle.json
    is an access token)."""
    name: str
    username: str
    quota_left_h: float | None = None
    quota_total_h: float | None = None
    unchecked: UserError | None = None
    auth: str = "key"
    stored_as: str = ""
    stored_as_ru: str = ""


def names() -> list[str]:
    """The lab's accounts by name; none when the accounts folder cannot be read."""
    try:
        return [a.name for a in list_accounts()]
    except UserError:
        return []


def check_name(name: str) -> None:
    """Raises UserError when `name` cannot be a new account's (bad, or taken)."""
    check_new_name((name or "").strip())


def accounts(offline: bool = False) -> list[AccountRow]:
    """Every account with its quota (asked of Kaggle unless `offline`), its probe and what runs
    there. A global token that would make every account act as one is refused first."""
    found = list_accounts()
    if found and not offline:
        kc.check_no_global_token()
    active = active_runs()
    return [_row(a, active.get(a.name, []), offline) for a in found]


def _row(a, runs: list[str], offline: bool) -> AccountRow:
    record = read_probe(a.name)
    probe = summary(record) + (f" ({age(record)} ago)" if record else "")
    probe_ru = summary(record, ru=True) + (f" ({age(record, ru=True)} назад)" if record else "")
    base = dict(name=a.name, username=a.username, probe=probe, probe_ru=probe_ru, runs=runs,
                sessions_seen=seen_line(a.name), auth=a.auth)
    if a.auth == "broken":
        return AccountRow(**{**base, "username": "?"}, error="damaged: remove and add it again")
    if offline:
        return AccountRow(**base)
    try:
        q = kc.client_for(a, retry=LIST_RETRY, timeout_s=20.0).quota()
    except UserError as e:  # KaggleError included: one account's trouble does not hide the rest
        return AccountRow(**base, error=getattr(e, "what", str(e)))
    hint, hint_ru = first_run_hint(a.name, q.has_ever_run) or (None, None)
    return AccountRow(**base, quota_left_h=q.left_s / 3600, quota_total_h=q.total_s / 3600,
                      refresh=q.refresh_time.strftime("%Y-%m-%d %H:%M") if q.refresh_time else None,
                      quota_said_left_h=q.said_left_s / 3600, quota_used_h=q.used_s / 3600, hint=hint,
                      hint_ru=hint_ru)


def first_run_hint(name: str, has_ever_run: bool | None) -> tuple[str, str] | None:
    """A word for an account before its first run, when Kaggle's quota says it never started a GPU
    session (kagglesdk 0.1.38's `hasEverRun`) and the lab has neither probed it nor run a session
    there; None otherwise."""
    if has_ever_run is not False or read_probe(name) is not None or session_overheads(name) is not None:
        return None
    return (f"Kaggle says this account has not started a GPU session yet. {GPU_CHECKS_EN}; `lab probe {name}` "
            "shows whether it gets one.",
            f"Kaggle говорит, что этот аккаунт ещё не запускал сессий GPU. {GPU_CHECKS_RU}; `lab probe {name}` "
            "покажет, даёт ли Kaggle ему GPU.")


def add(name: str, *, kaggle_json: str | Path | bytes | None = None, token: str | None = None,
        token_file: str | Path | None = None, username: str | None = None, check: bool = True,
        filename: str = "kaggle.json") -> Added:
    """Stores a Kaggle account (its folder 0700, the file 0600) from a kaggle.json (a path or the
    uploaded bytes, `filename` naming it in errors), a token or a token file, and checks it with
    Kaggle unless `check` is off. Credentials Kaggle refuses are removed again and raised."""
    name = (name or "").strip()
    if isinstance(kaggle_json, bytes):
        parse_kaggle_json(kaggle_json, filename)  # an error names the person's file
    if token_file is not None:
        token = read_token_file(token_file)
    if token is not None:
        token = token.strip()
        username = (username or "").strip() or kc.token_username(token, account=name or "new account")
    account = kc.add_account(name, kaggle_json=kaggle_json, token=token, username=username)
    words = dict(auth=account.auth, **_stored_as(account.auth, from_json=kaggle_json is not None))
    if not check:
        return Added(account.name, account.username, **words)
    try:
        quota = kc.verify_new_account(account)
    except kc.KaggleError as e:
        if e.status in (401, 403):
            raise _refused_new(e) from None
        return Added(account.name, account.username, unchecked=e, **words)
    return Added(account.name, account.username, quota.left_s / 3600, quota.total_s / 3600, **words)


def _stored_as(auth: str, from_json: bool) -> dict:
    """How the credentials were stored, in words: a kaggle.json whose key is a KGAT_ token holds an
    access token, which Kaggle takes only as one (kaggle-cli#1188)."""
    if auth == "key":
        return {"stored_as": "as a username and API key (a legacy key)",
                "stored_as_ru": "как имя пользователя и API-ключ (ключ старого вида)"}
    if from_json:
        return {"stored_as": "as an access token: its kaggle.json's key is a KGAT_ token, Kaggle's new kind, "
                             "which Kaggle takes only as a token (sent as a Bearer token, not as a username and key)",
                "stored_as_ru": "как токен доступа: ключ в его kaggle.json — токен KGAT_, нового вида, который Kaggle "
                                "принимает только как токен (Bearer), а не как имя пользователя и ключ"}
    return {"stored_as": "as an access token (sent as a Bearer token)",
            "stored_as_ru": "как токен доступа (Bearer)"}


def _refused_new(e: KaggleError) -> KaggleError:
    """Kaggle refused a new account's key or token: it was not kept, so there is nothing to remove
    (the client's words for an account that exists say `lab accounts remove` first)."""
    name = e.account
    refused = KaggleError(name, f"Kaggle refused the key or token given for it (HTTP {e.status})",
                          "It is wrong or was revoked: make a new one at kaggle.com/settings (API, Create New Token) "
                          "and add the account with it. The account was not added.", status=e.status)
    refused.ru = (f"Аккаунт Kaggle «{name}»: Kaggle не принял его ключ или токен (HTTP {e.status}). Он неверен или "
                  "отозван: создайте новый на kaggle.com/settings (API, Create New Token) и добавьте аккаунт с ним. "
                  "Аккаунт не добавлен.")
    return refused


def remove(name: str) -> None:
    """Forgets an account (its credentials deleted); refused while a run has a session there."""
    busy = active_runs().get(name)
    if busy:
        raise UserError(f"account {name} runs {', '.join(busy)} now: stop it first",
                        ru=f"на аккаунте {name} сейчас идёт {', '.join(busy)}: сначала остановите")
    kc.remove_account(name)


@dataclass(frozen=True)
class Datasets:
    """One account's checkpoint datasets ({"slug", "bytes", "run", "status", "finished"}) and its
    dataset storage ({"bytes", "datasets", "lab_bytes", "lab_datasets"}), or why it could not be asked."""
    account: str
    datasets: list[dict] = field(default_factory=list)
    storage: dict | None = None
    error: UserError | None = None


def checkpoint_datasets(name: str | None = None, storage: bool = False) -> list[Datasets]:
    """The runs' checkpoint datasets kept on each account (or on `name`), with its storage when
    asked; one account's trouble does not hide the rest."""
    kc.check_no_global_token()
    out = []
    for a in [get_account(name)] if name else list_accounts():
        try:
            c = kc.client_for(a, retry=LIST_RETRY, timeout_s=30.0)
            out.append(Datasets(a.name, datasets_on(c), account_storage(c) if storage else None))
        except UserError as e:
            out.append(Datasets(a.name, error=e))
    return out


def remove_checkpoint_datasets(account: str, slugs: list[str]) -> None:
    c = kc.client_for(account, retry=LIST_RETRY, timeout_s=30.0)
    for slug in slugs:
        remove_checkpoint_dataset(c, slug)


def probe_cost() -> tuple[str, str]:
    """What a probe costs, (English, Russian), shown before the person confirms it."""
    plan = settings_plan()
    return cost_line(plan), cost_line(plan, ru=True)


def check_known(name: str) -> None:
    """Raises UserError, listing the lab's accounts, when `name` is not one of them."""
    get_account(name)


def probe(name: str, say: Callable[[str], None] = print) -> dict:
    """`lab probe NAME`: pushes the short probe session as the person's settings say, stores and
    returns its record."""
    get_account(name)  # an unknown name: the error lists the lab's accounts
    return probe_account(name, say=say)


@dataclass(frozen=True)
class ProbeRecord:
    """An account's stored probe: the record itself, its one-line verdict and its age."""
    record: dict | None
    summary: str
    summary_ru: str
    age: str | None
    age_ru: str | None


def probe_record(name: str) -> ProbeRecord:
    record = read_probe(name)
    return ProbeRecord(record, summary(record), summary(record, ru=True), age(record) if record else None,
                       age(record, ru=True) if record else None)
