"""`lab accounts`: the lab's Kaggle accounts.

    lab accounts                      list them: user, GPU quota left, refresh time, what runs, the last probe,
                                      and what their sessions measured
    lab accounts add NAME --kaggle-json PATH | --token-file PATH [--username U] [--no-check]
    lab accounts remove NAME
    lab accounts checkpoints [NAME] [--remove RUN ... | --remove-finished]
                                      checkpoint datasets kept on Kaggle, with size, and each account's
                                      dataset storage; remove some
"""
from __future__ import annotations

import argparse

from lab.kaggle import client as kc
from lab.config import UserError

# Listing asks every account in turn: short waits, few tries, so one dead account is quick.
_LIST_RETRY = kc.RetryPolicy(attempts=2, base_s=1.0, cap_s=2.0, max_retry_after_s=10.0)


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
        kc.remove_account(args.name)
        print(f"Removed account '{args.name}'.")
        return 0
    return _list(offline=bool(getattr(args, "offline", False)))


def _add(args: argparse.Namespace) -> int:
    token = kc.read_token_file(args.token_file) if args.token_file else None
    username = args.username
    if token is not None and not username:
        username = kc.token_username(token, account=args.name)
    account = kc.add_account(args.name, kaggle_json=args.kaggle_json, token=token, username=username)
    if args.no_check:
        print(f"Added account '{account.name}' (Kaggle user {account.username}); not checked with Kaggle.")
        return 0
    try:
        quota = kc.verify_new_account(account)  # refused credentials: removed again, and raised
    except kc.KaggleError as e:
        if e.status in (401, 403):
            raise
        print(f"Added account '{account.name}' (Kaggle user {account.username}), but could not check it "
              f"with Kaggle: {e}")
        return 0
    print(f"Added account '{account.name}' (Kaggle user {account.username}): "
          f"{_hours(quota.left_s)} of {_hours(quota.total_s)} GPU quota left.")
    return 0


def _list(offline: bool) -> int:
    accounts = kc.list_accounts()
    if not accounts:
        print("No Kaggle accounts yet. Add one: lab accounts add NAME --kaggle-json PATH/kaggle.json")
        return 0
    if not offline:
        kc.check_no_global_token()
    from lab.machines.control import active_runs  # the registry: what runs where
    active = active_runs()
    rows, failed = [("NAME", "KAGGLE USER", "GPU LEFT / TOTAL", "REFRESH (UTC)", "PROBE", "RUNS")], 0
    for a in accounts:
        runs = (_probe(a.name), ", ".join(active.get(a.name, [])) or "-")
        if a.auth == "broken":
            rows.append((a.name, "?", "damaged: remove and add it again", "", *runs))
            failed += 1
            continue
        if offline:
            rows.append((a.name, a.username, "-", "-", *runs))
            continue
        try:
            q = kc.client_for(a, retry=_LIST_RETRY, timeout_s=20.0).quota()
        except UserError as e:  # KaggleError included: one account's trouble does not hide the rest
            rows.append((a.name, a.username, f"error: {getattr(e, 'what', e)}", "", *runs))
            failed += 1
            continue
        refresh = q.refresh_time.strftime("%Y-%m-%d %H:%M") if q.refresh_time else "?"
        rows.append((a.name, a.username, f"{_hours(q.left_s)} / {_hours(q.total_s)}", refresh, *runs))
    _print_table(rows)
    _print_sessions_seen([a.name for a in accounts])
    return 1 if failed else 0


def _print_sessions_seen(names: list[str]) -> None:
    """What each account's sessions measured (lab.machines.kaggle_sessions), under the table."""
    from lab.machines.kaggle_sessions import seen_line
    lines = [line for line in map(seen_line, names) if line]
    if lines:
        print("\nSessions seen:")
        for line in lines:
            print("  " + line)


def _probe(name: str) -> str:
    """The account's last probe (`lab probe NAME`): its verdict, figures and age."""
    from lab.probe.record import age, read_probe, summary
    record = read_probe(name)
    return summary(record) + (f" ({age(record)} ago)" if record else "")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _checkpoints(args: argparse.Namespace) -> int:
    from lab.machines.kaggle_data import account_storage, checkpoint_datasets, remove_checkpoint_dataset
    kc.check_no_global_token()
    accounts = [kc.get_account(args.name)] if args.name else kc.list_accounts()
    wanted, rows, failed = set(args.remove), [("ACCOUNT", "DATASET", "SIZE", "RUN", "STATE")], 0
    storage: list[str] = []
    for a in accounts:
        try:
            c = kc.client_for(a, retry=_LIST_RETRY, timeout_s=30.0)
            held = account_storage(c)
            storage.append(f"  {a.name}: {_gb(held['bytes'])} in {held['datasets']} dataset(s), the lab's "
                           f"{_gb(held['lab_bytes'])} in {held['lab_datasets']}")
            for d in checkpoint_datasets(c):
                state = d["status"]
                if (args.remove_finished and d["finished"]) or (d["run"] in wanted):
                    if not d["finished"]:
                        raise UserError(f"run {d['run']} is {d['status']}: its checkpoint dataset {d['slug']} is its "
                                        f"hand-off; cancel it first (`lab cancel {d['run']}`)")
                    remove_checkpoint_dataset(c, d["slug"])
                    state = "removed"
                rows.append((a.name, d["slug"], f"{d['bytes'] / 1e6:.1f} MB", d["run"] or "-", state))
        except kc.KaggleError as e:  # one account's trouble does not hide the rest
            rows.append((a.name, f"error: {e.what}", "", "", ""))
            failed += 1
    if len(rows) == 1:
        print("No checkpoint datasets on the lab's accounts.")
    else:
        _print_table(rows)
    if storage:
        print("\nDataset storage (each dataset at its current version; the lab keeps no older ones). Kaggle's "
              "private storage is about 100 GB an account, not documented; over it uploads are reported to fail "
              "without a clear error (kaggle-cli#284):")
        print("\n".join(storage))
    return 1 if failed else 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
