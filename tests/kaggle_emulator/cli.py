"""`python -m kaggle_emulator` (or `scripts/kaggle-emulator`): a local Kaggle API for trying the kit."""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import threading
from pathlib import Path

from kaggle_emulator.core import KaggleEmulator
from kaggle_emulator.model import EmulatedAccount


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _parse_account(spec: str, token: bool) -> EmulatedAccount:
    name, _, secret = spec.partition(":")
    secret = secret or (secrets.token_urlsafe(24) if token else secrets.token_hex(16))
    return EmulatedAccount(name, token=secret) if token else EmulatedAccount(name, key=secret)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/kaggle-emulator",
                                description="A local Kaggle API for trying the lab kit without Kaggle.")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--state", required=True, help="folder for uploads, datasets, sessions and credentials")
    p.add_argument("--account", action="append", default=[], metavar="NAME[:KEY]",
                   help="a username/key account (a random key if none is given); repeatable")
    p.add_argument("--token-account", action="append", default=[], metavar="NAME[:TOKEN]",
                   help="an access-token account; repeatable")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulated seconds per wall second")
    p.add_argument("--quota-hours", type=float, default=30.0, help="weekly GPU quota of each account")
    p.add_argument("--dataset-ready-s", type=float, default=2.0)
    p.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL, wall seconds")
    p.add_argument("--old-input-layout", action="store_true", help="mount inputs at input/<slug>")
    p.add_argument("--log-at-end", action="store_true",
                   help="a running session's log is readable only once it ends (Kaggle's cadence is unknown)")
    p.add_argument("--no-gpu", action="append", default=[], metavar="NAME",
                   help="an account not verified (phone, identity): its GPU pushes run without a GPU; repeatable")
    args = p.parse_args(argv)
    accounts = [_parse_account(s, False) for s in args.account] + [_parse_account(s, True) for s in args.token_account]
    if not accounts:
        accounts = [_parse_account("lab-user", False)]
    for a in accounts:
        a.gpu_total_s = args.quota_hours * 3600
        a.gpu_allowed = a.username not in args.no_gpu
    state = Path(args.state).resolve()
    emu = KaggleEmulator(state, accounts=accounts, time_scale=args.time_scale, dataset_ready_s=args.dataset_ready_s,
                         grace_s=args.grace_s, input_layout="old" if args.old_input_layout else "new",
                         host=args.host, port=args.port)
    emu.log_while_running = not args.log_at_end
    emu.start()
    print(f"Kaggle emulator at {emu.url} (state in {state})", flush=True)
    # Its sessions have no GPU: a session without cards trains on the CPU only with this setting.
    print(f"  export LAB_KAGGLE_API_URL={emu.url} LAB_KAGGLE_ALLOW_CPU=1")
    for a in accounts:
        folder = state / "credentials" / a.username
        if a.token:
            _write_private(folder / "access_token", a.token + "\n")
            print(f"  lab accounts add {a.username} --token-file {folder / 'access_token'}")
        else:
            _write_private(folder / "kaggle.json", json.dumps({"username": a.username, "key": a.key}))
            print(f"  lab accounts add {a.username} --kaggle-json {folder / 'kaggle.json'}")
    print("Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
