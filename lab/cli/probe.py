"""`lab probe ACCOUNT ...`: test Kaggle accounts with a short session before a run depends on them.

    lab probe alice           pushes the probe to alice, waits for it (a few minutes), stores and
                              prints what it found; `lab accounts` and the machines panel show it
    lab probe --show alice    prints the stored result without a new probe (no quota spent)
"""
from __future__ import annotations

import argparse
import json

from lab.api import accounts


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("accounts", nargs="+", metavar="ACCOUNT", help="the lab's name for a Kaggle account")
    parser.add_argument("--show", action="store_true", help="print the stored result; start no session")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    for name in args.accounts:  # an unknown name: the error lists the lab's accounts, before any quota is spent
        accounts.check_known(name)
    failed = 0
    for name in args.accounts:
        if args.show:
            record = accounts.probe_record(name).record
        else:
            record = accounts.probe(name, say=lambda s: print(s, flush=True))
        failed += _print(name, record, args.json)
    return 1 if failed else 0


def _print(name: str, record: dict | None, as_json: bool) -> int:
    if as_json:
        print(json.dumps(record, ensure_ascii=False))
        return 0 if record and record.get("can_run", True) is True else 1
    if record is None:
        print(f"{name}: never probed: `lab probe {name}`")
        return 1
    probed = accounts.probe_record(name)
    print(f"{name}: {probed.summary} (probed {probed.age} ago)")
    facts = record.get("facts") or {}
    if facts:
        gpus = ", ".join(f"{g['name']} {g['memory_gb']:g} GB" for g in facts.get("gpus") or []) or "none"
        print(f"  GPUs {gpus}; driver {facts.get('driver') or '-'}, CUDA {facts.get('cuda') or '-'}, "
              f"torch {facts.get('torch')}, NCCL {facts.get('nccl') or '-'}")
        reduce = record.get("all_reduce") or {}
        if reduce:
            print(f"  all-reduce of {reduce.get('megabytes')} MB: {'ok' if reduce.get('ok') else 'WRONG'}, "
                  f"{reduce.get('bus_gb_s')} GB/s")
        burst = (facts.get("worker") or {}).get("burst") or {}
        if burst:
            size = burst["size"]
            print(f"  burst: {burst['tok_s']:,.0f} tokens/s, {burst['precision']}, {size['layers']} layers × "
                  f"{size['width']}, n {size['context']}, batch {size['batch_per_card']} per card "
                  f"(the calculator counts it as a measurement on {record.get('gpu')})")
        mount = record.get("input") or {}
        print(f"  the lab's data mounts at /kaggle/input/{mount.get('mount') or '? (not found)'}"
              + ("" if mount.get("this_version", True) else " (an older version of it)"))
        disk = facts.get("free_disk_gb") or {}
        print(f"  free disk: {disk.get('working')} GB in /kaggle/working, {disk.get('tmp')} GB in /tmp")
    log = record.get("log_while_running")
    print("  the log of a running session: " + {True: "readable while it runs (live curves)",
                                                  False: "only when it ends (no live curve)"}.get(log, "not known"))
    return 0 if record.get("can_run", True) is True else 1
