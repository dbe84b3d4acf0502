"""`lab machines`: every machine of the lab, and the lab's own boxes over SSH.

    lab machines [--json]             this computer, each Kaggle account and each box: GPU, quota,
                                      what runs there, the box's last check with its age
    lab machines add NAME --ssh [USER@]HOST [--port P] [--python PATH] [--workdir DIR] [--no-check]
    lab machines add NAME --hosts H1,H2,... [...]
                                      a box, or a group of boxes that trains one run under torchrun;
                                      checked at once (as `lab machines check`) unless --no-check
    lab machines remove NAME          forget it (nothing on the box is touched)
    lab machines check NAME [--json]  Python, torch, CUDA, the cards, free disk, what is missing and
                                      how to install it, and a short measured training burst

The kit connects with your own OpenSSH client and its config (`LAB_SSH_CONFIG=FILE`: that config
instead): if `ssh HOST` works, the kit works. No password is stored; host keys are checked.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per machine")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="every machine with its state (the default)")
    ls.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object per machine")
    add = sub.add_parser("add", help="add a box (--ssh) or a group of boxes (--hosts) reached over SSH")
    add.add_argument("name", help="the lab's name for it: a-z, 0-9, '-', '_'")
    add.add_argument("--ssh", metavar="[USER@]HOST", help="the box, as `ssh` reaches it (an alias of your ssh config)")
    add.add_argument("--hosts", metavar="H1,H2,...", help="a group: its hosts, the first one hosts the rendezvous")
    add.add_argument("--port", type=int, help="the SSH port, where your ssh config does not say it")
    add.add_argument("--python", help="the box's Python with torch (default: python3)")
    add.add_argument("--workdir", help="where the kit keeps data and runs on the box (default: ~/lab-box)")
    add.add_argument("--no-check", action="store_true", help="store it without connecting")
    rm = sub.add_parser("remove", help="forget a box (nothing on it is touched)")
    rm.add_argument("name")
    ck = sub.add_parser("check", help="check a box: Python, torch, CUDA, cards, disk, a measured burst")
    ck.add_argument("name")
    ck.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    if args.action == "add":
        return _add(args)
    if args.action == "remove":
        from lab.machines.control import active_runs
        from lab.machines.ssh_boxes import remove_box
        running = active_runs().get(args.name)
        if running:
            raise UserError(f"machine '{args.name}' runs {', '.join(running)} now: `lab cancel {running[0]}` first "
                            "(its outputs come back), then remove it")
        remove_box(args.name)
        print(f"Removed machine '{args.name}' (what the kit left on it stays there).")
        return 0
    if args.action == "check":
        from lab.probe.box import check_machine
        record = check_machine(args.name, say=lambda s: print(s, flush=True))
        return _print_check(record, bool(getattr(args, "json", False)))
    return _list(bool(getattr(args, "json", False)))


def _add(args: argparse.Namespace) -> int:
    from lab.machines.registry import machine_names
    from lab.machines.ssh_boxes import add_box, parse_hosts, remove_box
    box = add_box(args.name, parse_hosts(args.ssh, args.hosts, args.port), args.python, args.workdir,
                  taken=machine_names())
    print(f"Added {box.where}.")
    if args.no_check:
        print(f"Not checked: `lab machines check {box.name}` (a run on it checks it first).")
        return 0
    from lab.probe.box import check_machine
    try:
        record = check_machine(box.name, say=lambda s: print(s, flush=True))
    except UserError as e:  # unreachable, a changed host key, no Python there: not worth keeping
        remove_box(box.name)
        text = str(e)
        raise UserError(text + (" " if text.endswith((".", "?")) else ". ") + "The machine was not added.") from None
    return _print_check(record, False)


def _print_check(record: dict, as_json: bool) -> int:
    from lab.probe.record import age
    if as_json:
        print(json.dumps(record, ensure_ascii=False))
    else:
        print(f"{record['machine']}: {check_summary(record)} (checked {age(record)} ago)")
        for h in record.get("hosts") or []:
            if h.get("error"):
                continue
            gpus = ", ".join(f"{g['name']} {g['memory_gb']:g} GB (compute {g['capability']})" for g in h.get("gpus")
                             or []) or "no GPU"
            print(f"  {h['host']}: Python {h.get('python')}, torch {h.get('torch') or '-'}, CUDA {h.get('cuda') or '-'}; "
                  f"{gpus}; {h.get('free_gb')} GB free in {h.get('workdir')}; rsync {'yes' if h.get('rsync') else 'no'}")
    if record.get("can_run") is False:
        from lab.machines.ssh_boxes import check_problem
        raise UserError(f"{record['machine']} cannot run the lab's sessions: {check_problem(record['machine'])}")
    return 0


def check_summary(record: dict | None) -> str:
    """One line: the verdict, the cards and the measured speed."""
    if record is None:
        return "not checked (lab machines check NAME)"
    if record.get("can_run") is False:
        return "cannot run: " + str(record.get("why"))
    parts = [str(record.get("gpu") or "?")]
    if record.get("tok_s"):
        parts.append(f"{record['tok_s']:,.0f} tok/s measured")
    if record.get("warning"):
        parts.append("warning: " + record["warning"])
    return ", ".join(parts)


def _list(as_json: bool) -> int:
    from lab.machines import driver as machines
    from lab.machines.ssh_boxes import read_check
    from lab.probe.record import age
    found = machines.overview()
    if as_json:
        for m in found:
            print(json.dumps(asdict(m), ensure_ascii=False))
        return 0
    rows = [("MACHINE", "KIND", "GPU", "GPU QUOTA LEFT / TOTAL", "REFRESH (UTC)", "STATE", "RUNS", "CHECKED")]
    for m in found:
        quota = "-" if m.quota_left_h is None else f"{m.quota_left_h:.1f} / {m.quota_total_h:.1f} h"
        refresh = (m.refresh or "-")[:16].replace("T", " ")
        state = f"error: {m.error}" if m.error else ("free" if m.free else "busy")
        record = read_check(m.name) if m.kind == "ssh" else None
        checked = f"{age(record)} ago" if record else ("never" if m.kind == "ssh" else "-")
        rows.append((m.name, m.kind, m.gpu, quota, refresh, state, ", ".join(m.running) or "-", checked))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 1 if any(m.error for m in found) else 0
