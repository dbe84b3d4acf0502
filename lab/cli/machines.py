"""`lab machines`: every machine of the lab, and the lab's own boxes over SSH and Slurm clusters.

    lab machines [--json]             this computer, each Kaggle account and each box: GPU, quota,
                                      what runs there, the box's last check with its age
    lab machines add NAME --ssh [USER@]HOST [--port P] [--python PATH] [--workdir DIR] [--no-check]
    lab machines add NAME --hosts H1,H2,... [...]
                                      a box, or a group of boxes that trains one run under torchrun;
                                      checked at once (as `lab machines check`) unless --no-check
    lab machines add NAME --slurm [USER@]LOGIN_HOST|local [--partition P] [--account A] [--gres gpu:N]
                      [--nodes N] [--time T] [--python PATH] [--workdir DIR] [--no-check]
                                      a Slurm cluster: runs go to its partition as jobs; checked at
                                      once (the partition, and a short measured job) unless --no-check
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

from lab.api import machines
from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per machine")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="every machine with its state (the default)")
    ls.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object per machine")
    add = sub.add_parser("add", help="add a box (--ssh), a group of boxes (--hosts) reached over SSH, or a Slurm "
                                     "cluster (--slurm)")
    add.add_argument("name", help="the lab's name for it: a-z, 0-9, '-', '_'")
    add.add_argument("--ssh", metavar="[USER@]HOST", help="the box, as `ssh` reaches it (an alias of your ssh config)")
    add.add_argument("--hosts", metavar="H1,H2,...", help="a group: its hosts, the first one hosts the rendezvous")
    add.add_argument("--slurm", metavar="[USER@]LOGIN_HOST", help="a Slurm cluster, by its login node as `ssh` "
                                                                  "reaches it, or `local` when this is the login node")
    add.add_argument("--partition", help="Slurm: the partition the runs go to (default: the cluster's default)")
    add.add_argument("--account", help="Slurm: the account the jobs are charged to")
    add.add_argument("--gres", metavar="gpu:N", help="Slurm: the cards per node, as sbatch's --gres takes them")
    add.add_argument("--nodes", type=int, help="Slurm: the nodes one run trains on together (default 1)")
    add.add_argument("--time", metavar="T", help="Slurm: the job's time limit (minutes, H:MM:SS or D-HH:MM:SS; "
                                                 "default: the partition's)")
    add.add_argument("--port", type=int, help="the SSH port, where your ssh config does not say it")
    add.add_argument("--python", help="the box's or cluster's Python with torch (default: python3)")
    add.add_argument("--workdir", help="where the kit keeps data and runs there (default: ~/lab-box; a cluster's "
                                       "~/lab-slurm, on its shared file system)")
    add.add_argument("--no-check", action="store_true", help="store it without connecting")
    rm = sub.add_parser("remove", help="forget a box or a cluster (nothing on it is touched)")
    rm.add_argument("name")
    ck = sub.add_parser("check", help="check a box or a cluster: Python, torch, CUDA, cards, disk, a measured burst")
    ck.add_argument("name")
    ck.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    if args.action == "add":
        return _add(args)
    if args.action == "remove":
        machines.remove_box(args.name)  # a box or a cluster
        print(f"Removed machine '{args.name}' (what the kit left on it stays there).")
        return 0
    if args.action == "check":
        record = machines.check_box(args.name, say=lambda s: print(s, flush=True))  # a box's or a cluster's
        return _print_check(record, bool(getattr(args, "json", False)))
    return _list(bool(getattr(args, "json", False)))


def _add(args: argparse.Namespace) -> int:
    if args.slurm:
        if args.ssh or args.hosts:
            raise UserError("give the cluster's login node with --slurm alone (--ssh and --hosts are a box's)")
        cluster, record = machines.add_cluster(args.name, args.slurm, args.port, args.partition, args.account,
                                               args.gres, args.nodes, args.time, args.python, args.workdir,
                                               check=not args.no_check, say=lambda s: print(s, flush=True))
        print(f"Added {cluster.where}.")
        if record is None:
            print(f"Not checked: `lab machines check {cluster.name}` measures it (a run on it reads the partition "
                  "first).")
            return 0
        return _print_check(record, False)
    if any(getattr(args, f) is not None for f in ("partition", "account", "gres", "nodes", "time")):
        raise UserError("--partition, --account, --gres, --nodes and --time are a Slurm cluster's: give --slurm "
                        "[USER@]LOGIN_HOST (or --slurm local)")
    box, record = machines.add_box(args.name, args.ssh, args.hosts, args.port, args.python, args.workdir,
                                   check=not args.no_check, say=lambda s: print(s, flush=True))
    print(f"Added {box.where}.")
    if record is None:
        print(f"Not checked: `lab machines check {box.name}` (a run on it checks it first).")
        return 0
    return _print_check(record, False)


def _print_check(record: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(record, ensure_ascii=False))
    else:
        print(f"{record['machine']}: {check_summary(record)} (checked {machines.box_age(record)} ago)")
        if record.get("partition"):  # a Slurm cluster's
            print(f"  {machines.partition_line(record['partition'])}; the check's job {record.get('job')} waited "
                  f"{record.get('queue_wait_s', 0):g} s in the queue")
        for h in record.get("hosts") or []:
            if h.get("error"):
                continue
            gpus = ", ".join(f"{g['name']} {g['memory_gb']:g} GB (compute {g['capability']})" for g in h.get("gpus")
                             or []) or "no GPU"
            print(f"  {h['host']}: Python {h.get('python')}, torch {h.get('torch') or '-'}, CUDA {h.get('cuda') or '-'}; "
                  f"{gpus}; {h.get('free_gb')} GB free in {h.get('workdir')}; rsync {'yes' if h.get('rsync') else 'no'}")
    if record.get("can_run") is False:
        raise UserError(f"{record['machine']} cannot run the lab's sessions: {machines.box_problem(record['machine'])}")
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
        if m.wait_h is not None and not m.error:  # a Slurm cluster: what its queue says now
            state += f" (queue: starts in ~{m.wait_h * 60:.0f} min)"
        if m.busy_until and not m.error:  # Kaggle asked for a pause (a busy spell): not broken, not free
            state = f"busy: asked to wait until {m.busy_until[11:19]} UTC"
        record = machines.box_record(m.name) if m.kind in ("ssh", "slurm") else None
        checked = f"{machines.box_age(record)} ago" if record else ("never" if m.kind in ("ssh", "slurm") else "-")
        rows.append((m.name, m.kind, m.gpu, quota, refresh, state, ", ".join(m.running) or "-", checked))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 1 if any(m.error for m in found) else 0
