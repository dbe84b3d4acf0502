"""`lab accounts`: the lab's Kaggle accounts.

    lab accounts                      list them: user, GPU quota left (for a new session, and as `kaggle quota`
                                      says it), refresh time, what runs, the last probe, a hint before the first
                                      run, and what their sessions measured
    lab accounts add NAME --kaggle-json PATH | --token-file PATH [--username U] [--no-check]
    lab accounts remove NAME
    lab accounts checkpoints [NAME] [--remove RUN ... | --remove-finished]
                                      checkpoint datasets kept on Kaggle, with size, and each account's
                                      dataset storage; remove some
"""
from __future__ import annotations

import argparse

from lab.api import accounts
from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--offline", action="store_true", help="list without asking Kaggle for quota")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="the accounts with their GPU quota (the default)")
    ls.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                    help="without asking Kaggle for quota")
    add = sub.add_parser("add", help="add an account from its kaggle.json or an API token")
    add.add_argument("name", help="the lab's name for it: a-z, 0-9, '-', '_'")
    creds = add.add_mutually_exclusive_group(required=True)
    creds.add_argument("--kaggle-json", metavar="PATH", help="kaggle.json from kaggle.com/settings (API)")
    creds.add_argument("--token-file", metavar="PATH", help="a file holding one API token")
    add.add_argument("--username", help="with --token-file: the Kaggle username (else Kaggle is asked)")
    add.add_argument("--no-check", action="store_true", help="store without checking with Kaggle")
    rm = sub.add_parser("remove", help="forget an account (its credentials are deleted)")
    rm.add_argument("name")
    ck = sub.add_parser("checkpoints", help="the runs' checkpoint datasets kept on each account, with size")
    ck.add_argument("name", nargs="?", help="one account (default: every account)")
    gone = ck.add_mutually_exclusive_group()
    gone.add_argument("--remove", metavar="RUN", action="append", default=[],
                      help="delete the checkpoint dataset of this finished run (repeatable)")
    gone.add_argument("--remove-finished", action="store_true",
                      help="delete the checkpoint datasets of every finished run")


def run(args: argparse.Namespace) -> int:
    if args.action == "add":
        return _add(args)
    if args.action == "checkpoints":
        return _checkpoints(args)
    if args.action == "remove":
        accounts.remove(args.name)
        print(f"Removed account '{args.name}'.")
        return 0
    return _list(offline=bool(getattr(args, "offline", False)))


def _add(args: argparse.Namespace) -> int:
    got = accounts.add(args.name, kaggle_json=args.kaggle_json, token_file=args.token_file, username=args.username,
                       check=not args.no_check)
    who = f"'{got.name}' (Kaggle user {got.username}), stored {got.stored_as}"
    if args.no_check:
        print(f"Added account {who}; not checked with Kaggle.")
    elif got.unchecked is not None:
        print(f"Added account {who}, but could not check it with Kaggle: {got.unchecked}")
    else:
        print(f"Added account {who}: {got.quota_left_h:.1f} h of {got.quota_total_h:.1f} h GPU quota left.")
    return 0


def _list(offline: bool) -> int:
    rows = accounts.accounts(offline)
    if not rows:
        print("No Kaggle accounts yet. Add one: lab accounts add NAME --kaggle-json PATH/kaggle.json")
        return 0
    table = [("NAME", "KAGGLE USER", "GPU LEFT FOR A NEW SESSION / TOTAL", "`KAGGLE QUOTA` LEFT", "REFRESH (UTC)",
              "PROBE", "RUNS")]
    for a in rows:
        quota = f"error: {a.error}" if a.error else "-" if a.quota_left_h is None else \
            f"{a.quota_left_h:.1f} h / {a.quota_total_h:.1f} h"
        refresh = "" if a.error else (a.refresh or ("-" if offline else "?"))
        user = a.username + (" (access token)" if a.auth == "token" else "")
        table.append((a.name, user, quota, _said_left(a), refresh, a.probe, ", ".join(a.runs) or "-"))
    _print_table(table)
    print("(left for a new session: the total less what is used and what running sessions hold reserved, which "
          "the lab plans with; `kaggle quota` shows the total less what is used)")
    for title, lines in (("Before the first run", [f"{a.name}: {a.hint}" for a in rows if a.hint]),
                         ("Sessions seen", [a.sessions_seen for a in rows if a.sessions_seen])):
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print("  " + line)
    return 1 if any(a.error for a in rows) else 0


def _said_left(a: accounts.AccountRow) -> str:
    """What `kaggle quota` says is left, and how far past the total the sessions ran where they did."""
    if a.error or a.quota_said_left_h is None:
        return "" if a.error else "-"
    if a.quota_over_h > 0:
        return f"0.0 h (used {a.quota_used_h:.1f} h: {a.quota_over_h:.1f} h past the total)"
    return f"{a.quota_said_left_h:.1f} h"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _checkpoints(args: argparse.Namespace) -> int:
    wanted, rows, storage = set(args.remove), [("ACCOUNT", "DATASET", "SIZE", "RUN", "STATE")], []
    found = accounts.checkpoint_datasets(args.name, storage=True)
    for held in found:
        if held.error is not None:  # one account's trouble does not hide the rest
            rows.append((held.account, f"error: {getattr(held.error, 'what', held.error)}", "", "", ""))
            continue
        s = held.storage
        storage.append(f"  {held.account}: {_gb(s['bytes'])} in {s['datasets']} dataset(s), the lab's "
                       f"{_gb(s['lab_bytes'])} in {s['lab_datasets']}")
        for d in held.datasets:
            state = d["status"]
            if (args.remove_finished and d["finished"]) or (d["run"] in wanted):
                if not d["finished"]:
                    raise UserError(f"run {d['run']} is {d['status']}: its checkpoint dataset {d['slug']} is its "
                                    f"hand-off; cancel it first (`lab cancel {d['run']}`)")
                accounts.remove_checkpoint_datasets(held.account, [d["slug"]])
                state = "removed"
            rows.append((held.account, d["slug"], f"{d['bytes'] / 1e6:.1f} MB", d["run"] or "-", state))
    if len(rows) == 1:
        print("No checkpoint datasets on the lab's accounts.")
    else:
        _print_table(rows)
    if storage:
        print("\nDataset storage (each dataset at its current version; the lab keeps no older ones). Kaggle's "
              "private storage is about 100 GB an account, not documented; over it uploads are reported to fail "
              "without a clear error (kaggle-cli#284):")
        print("\n".join(storage))
    return 1 if any(h.error is not None for h in found) else 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
