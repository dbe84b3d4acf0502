"""The lab's Kaggle accounts on disk, and the global-token trap.

Accounts live in `$LAB_HOME/accounts/<name>/` (folder 0700): `kaggle.json` with a username and
key, or `access_token` (+ `account.json` naming the user), files 0600. Nothing here talks to
Kaggle or knows of runs.

Kaggle's settings page now gives one opaque access token, `KGAT_...` (kaggle-cli#1188): put into
kaggle.json's `key` it gets 401 as a username and key, since it is a Bearer token. A kaggle.json
whose key is one is stored as an access token; one stored so by an older kit is read as one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from lab.config import UserError
from lab.home import accounts_dir

_ACCOUNT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_KAGGLE_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SECRET = re.compile(r"\S{1,512}")
ACCESS_TOKEN_PREFIX = "KGAT_"  # Kaggle's new access tokens (kaggle-cli#1188): sent as Bearer, never as a key


def is_access_token(secret: str) -> bool:
    return secret.startswith(ACCESS_TOKEN_PREFIX)


@dataclass(frozen=True)
class Account:
    """One lab account: a name the lab uses, and the Kaggle user it signs in as (no secret)."""
    name: str
    username: str
    auth: str  # "key" or "token"
    folder: Path


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _ACCOUNT_NAME.fullmatch(name):
        raise UserError(f"Bad account name {name!r}: use 1-40 characters a-z, 0-9, '-' or '_', "
                        "starting with a letter or digit.",
                        ru=f"Неверное имя аккаунта {name!r}: 1–40 знаков a-z, 0-9, '-' или '_', первый — буква "
                           "или цифра.")
    return name


def _write_private(path: Path, text: str) -> None:
    """Writes a 0600 file atomically: the secret is never readable by others, not even briefly."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_kaggle_json(path: str | Path) -> tuple[str, str]:
    """(username, key) from a kaggle.json; errors name the file, never its content."""
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UserError(f"No such file: {p}. Download kaggle.json from kaggle.com/settings (API).",
                        ru=f"Нет такого файла: {p}. Скачайте kaggle.json на kaggle.com/settings (API).") from None
    except OSError:
        raise UserError(f"Cannot read {p}.", ru=f"Не удаётся прочитать {p}.") from None
    return parse_kaggle_json(data, str(p))


def parse_kaggle_json(data: bytes, where: str) -> tuple[str, str]:
    """(username, key) from the bytes of a kaggle.json (`where` names it in errors, which never
    hold its content)."""
    try:
        parsed = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        raise UserError(f"{where} is not a kaggle.json: it should be JSON like " '{"username": "...", "key": "..."}.',
                        ru=f"{where} — не kaggle.json: там должен быть JSON вида "
                           '{"username": "...", "key": "..."}.') from None
    if not isinstance(parsed, dict):
        raise UserError(f"{where} is not a kaggle.json: it should be a JSON object with username and key.",
                        ru=f"{where} — не kaggle.json: там должен быть JSON-объект с username и key.")
    username, key = parsed.get("username"), parsed.get("key")
    if not isinstance(username, str) or not _KAGGLE_USER.fullmatch(username):
        raise UserError(f"{where} has no valid \"username\".", ru=f"в {where} нет верного \"username\".")
    if not isinstance(key, str) or not _SECRET.fullmatch(key):
        raise UserError(f"{where} has no valid \"key\" (a single word without spaces).",
                        ru=f"в {where} нет верного \"key\" (одно слово без пробелов).")
    return username, key


def read_token_file(path: str | Path) -> str:
    p = Path(path).expanduser()
    try:
        token = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise UserError(f"Cannot read the token file {p}.") from None
    if not _SECRET.fullmatch(token):
        raise UserError(f"{p} does not hold one API token (a single word without spaces).")
    return token


def add_account(name: str, *, kaggle_json: str | Path | bytes | None = None, token: str | None = None,
                username: str | None = None) -> Account:
    """Stores an account from a kaggle.json (a file, or its bytes as uploaded) or an API token
    (`username` is then required)."""
    _check_name(name)
    if (kaggle_json is None) == (token is None):
        raise UserError("Give exactly one of a kaggle.json file or an API token.",
                        ru="Дайте что-то одно: kaggle.json или API-токен.")
    if isinstance(kaggle_json, bytes):
        username, key = parse_kaggle_json(kaggle_json, "the uploaded file")
    elif kaggle_json is not None:
        username, key = _read_kaggle_json(kaggle_json)
    else:
        key = None
        if not _SECRET.fullmatch(token or ""):
            raise UserError("The API token must be a single word without spaces.",
                            ru="API-токен — это одно слово без пробелов.")
        if not username or not _KAGGLE_USER.fullmatch(username):
            raise UserError("An account added with a token needs its Kaggle username.",
                            ru="Аккаунту, добавленному по токену, нужно имя пользователя Kaggle.")
    folder = check_new_name(name)
    twin = next((a for a in list_accounts() if a.username.lower() == username.lower()), None)
    if twin is not None:
        raise UserError(f"Kaggle user {username} is already account '{twin.name}': two names for one "
                        "account would spend its quota twice.",
                        ru=f"Пользователь Kaggle {username} уже добавлен как '{twin.name}': два имени одного "
                           "аккаунта тратили бы его квоту дважды.")
    accounts_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    if key is not None and is_access_token(key):
        token, key = key, None  # a KGAT_ access token in kaggle.json's key: stored (and sent) as the token it is
    if key is not None:
        _write_private(folder / "kaggle.json", json.dumps({"username": username, "key": key}))
    else:
        _write_private(folder / "access_token", token + "\n")
        _write_private(folder / "account.json", json.dumps({"username": username}))
    return get_account(name)


def check_new_name(name: str) -> Path:
    """The folder a new account of this name gets; an error when the name is bad or taken."""
    folder = accounts_dir() / _check_name(name)
    if folder.exists():
        raise UserError(f"Account '{name}' already exists; `lab accounts remove {name}` first to replace it.",
                        ru=f"Аккаунт '{name}' уже есть; чтобы заменить его, сначала удалите его.")
    return folder


def get_account(name: str) -> Account:
    folder = accounts_dir() / _check_name(name)
    if (folder / "kaggle.json").is_file():
        username, key = _read_kaggle_json(folder / "kaggle.json")
        return Account(name, username, "token" if is_access_token(key) else "key", folder)
    if (folder / "access_token").is_file() and (folder / "account.json").is_file():
        try:
            username = json.loads((folder / "account.json").read_text(encoding="utf-8"))["username"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{folder / 'account.json'} is damaged; remove and add the account again.") from None
        return Account(name, username, "token", folder)
    if folder.is_dir():
        raise UserError(f"Account '{name}' has no credentials in {folder}; remove and add it again.")
    known = ", ".join(a.name for a in list_accounts()) or "none yet"
    raise UserError(f"No Kaggle account '{name}' (accounts: {known}). Add it: lab accounts add {name} "
                    "--kaggle-json PATH")


def list_accounts() -> list[Account]:
    """The stored accounts, by name; a damaged one shows with auth "broken"."""
    root = accounts_dir()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and _ACCOUNT_NAME.fullmatch(p.name)):
        try:
            found.append(get_account(folder.name))
        except UserError:
            found.append(Account(folder.name, "", "broken", folder))
    return found


def remove_account(name: str) -> None:
    folder = accounts_dir() / _check_name(name)
    if not folder.is_dir():
        raise UserError(f"No Kaggle account '{name}' to remove.")
    shutil.rmtree(folder)


def secrets_of(account: Account) -> tuple[str | None, str | None]:
    """(key, token): read only to build the account's client."""
    if account.auth == "key":
        return _read_kaggle_json(account.folder / "kaggle.json")[1], None
    if account.auth == "token":
        if not (account.folder / "access_token").is_file():  # a KGAT_ key an older kit kept in kaggle.json
            return None, _read_kaggle_json(account.folder / "kaggle.json")[1]
        return None, read_token_file(account.folder / "access_token")
    raise UserError(f"Account '{account.name}' has no usable credentials; remove and add it again.")



# ---------------------------------------------------------------------------------------------
# The global-token trap


def global_token_problem() -> str | None:
    """Why every username/key client would send one global token instead, or None.

    The real client (kagglesdk 0.1.38, `KaggleHttpClient._try_fill_auth`) looks for a token
    before it uses a username and key: in a Kaggle notebook, in `KAGGLE_API_TOKEN` (a token or
    a path to one), in `~/.kaggle/access_token` or `~/.kaggle/access_token.txt`.
    """
    if os.environ.get("KAGGLE_API_TOKEN"):
        return ("the environment variable KAGGLE_API_TOKEN is set, so the kaggle client would send "
                "that one token for every account. Unset it: the lab keeps each account's "
                "credentials in $LAB_HOME/accounts")
    for name in ("access_token", "access_token.txt"):
        path = Path(os.path.expanduser("~/.kaggle")) / name
        try:
            if path.is_file() and path.read_text(encoding="utf-8", errors="replace").strip():
                return (f"{path} exists, so the kaggle client would send that one token for every "
                        "account. Move it out of ~/.kaggle (add it to the lab with "
                        "`lab accounts add NAME --token-file FILE` if it is a lab account)")
        except OSError:
            continue
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return ("this runs inside a Kaggle notebook (KAGGLE_KERNEL_RUN_TYPE is set), where the kaggle "
                "client uses the notebook's own token for every account. Run the lab's control side "
                "on your own computer")
    return None


def check_no_global_token() -> None:
    problem = global_token_problem()
    if problem:
        raise UserError(f"Refusing to use Kaggle accounts: {problem}.")

