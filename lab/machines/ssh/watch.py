"""Following a link's session on an SSH machine from the run's own files, over one connection
that is made again whenever it drops.

The box's half (`ssh_remote watch`) sends a JSON line every LAB_SSH_POLL_S seconds (default 5):
the bytes its `metrics.jsonl` grew by, the tail of the session's log and whether the session
still runs. The new metrics are appended to the link's `live-metrics.jsonl` here (its size is
how far it has read, so a control side that crashed goes on where it stopped, without a gap
or a repeat), which the monitor and `lab watch RUN` show as the live curve until the outputs
come back. A connection that drops is no failed run: the session runs on, detached, and the
watch connects again, backing off to a minute; after WATCH_PATIENCE_S without contact it gives
up for now (the link stays as it is: `lab watch RUN` takes it up again). A cancel asks each
host's session to save a checkpoint and stop (its stop request).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from lab.config import UserError
from lab.kernel.checkpoint import atomic_write
from lab.machines.links import get_link
from lab.machines.ssh.record import BoxLinkRecord
from lab.machines.ssh.client import SSH_FAILED, SshError, connection_error, python_word, ssh_argv
from lab.machines.ssh.link import REMOTE, BoxLink, remote

POLL_ENV = "LAB_SSH_POLL_S"  # how often the box says how its session goes (the person's setting)
POLL_S = 5.0
WATCH_PATIENCE_S = 1800.0  # this long without reaching the box: the watch gives up for now
LIVE, LOG = "live-metrics.jsonl", "live.log"


def watch(ctx: BoxLink, host: dict) -> dict:
    """Follows the session on the group's first host (its rank 0 writes the run's files) to its
    end; returns the box's last word ({"phase": "ended" | "died" | "never", "exit": ...})."""
    live = ctx.folder / LIVE
    live.parent.mkdir(parents=True, exist_ok=True)
    lost_at, backoff, said = None, 1.0, _rows_in(live)
    while True:
        if ctx.cancelled():
            ask_to_stop(ctx, "cancelled with lab cancel")
        last, said = _stream(ctx, host, live, said)
        if last is not None and last.get("phase") != "running":
            return last
        if last is not None:  # it answered, then the connection dropped: a new loss
            lost_at, backoff = None, 1.0
        if lost_at is None:
            lost_at = time.monotonic()
            ctx.say(f"link {ctx.n}: lost the connection to {host['host']}; the session goes on there, detached, "
                    "and the lab connects again")
        elif time.monotonic() - lost_at > WATCH_PATIENCE_S:
            raise UserError(f"{ctx.box.where}: no contact with {host['host']} for {WATCH_PATIENCE_S / 60:.0f} min; "
                            "the session there goes on, detached. When the box is reachable again, "
                            "`lab watch RUN` follows it and collects its outputs")
        time.sleep(backoff)
        backoff = min(backoff * 2, 60.0)


def _stream(ctx: BoxLink, host: dict, live: Path, said: int) -> tuple[dict | None, int]:
    """One connection's worth of the box's lines; (the last state line, the rows said so far)."""
    offset = live.stat().st_size if live.is_file() else 0
    command = " ".join([python_word(ctx.box.python), "-", "watch", _q(host["link"]), str(offset), f"{ctx.poll_s:g}"])
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(ssh_argv(ctx.box.hosts[0], command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=errors, text=True, bufsize=1)
    threading.Thread(target=_feed, args=(proc, REMOTE), daemon=True).start()
    last = None
    try:
        for line in proc.stdout:
            try:
                state = json.loads(line)
            except ValueError:
                continue  # a line the box's login printed: not ours
            _append(live, state)
            if "phase" in state:
                last = state
                _keep_log(ctx.folder, state.get("log") or "")
                said = _progress(ctx, live, said)
                if ctx.cancelled():
                    ask_to_stop(ctx, "cancelled with lab cancel")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        errors.seek(0)
        stderr = errors.read()
        errors.close()
    if proc.returncode == SSH_FAILED:
        failure = connection_error(ctx.box.hosts[0], stderr)
        if failure.kind in ("host-key", "auth"):  # waiting does not mend these: the person must
            raise UserError(f"{failure}. The session there goes on, detached; once that is fixed, `lab watch RUN` "
                            "follows it and collects its outputs") from None
    return last, said


def _feed(proc: subprocess.Popen, script: str) -> None:
    try:
        proc.stdin.write(script)
        proc.stdin.close()
    except OSError:
        pass  # the connection dropped before the script went up: the watch connects again


def _append(live: Path, state: dict) -> None:
    """The box's new metrics bytes, appended where they belong (a repeat is not appended twice)."""
    text = state.get("metrics") or ""
    here = live.stat().st_size if live.is_file() else 0
    if not text or state.get("from") != here:
        return
    with open(live, "a", encoding="utf-8") as f:
        f.write(text)


def _keep_log(folder: Path, text: str) -> None:
    atomic_write(folder / LOG, lambda f: f.write(text.encode("utf-8")))


def _rows_in(live: Path) -> int:
    try:
        return sum(1 for line in live.read_text(encoding="utf-8").splitlines() if line.strip())
    except OSError:
        return 0


def _progress(ctx: BoxLink, live: Path, said: int) -> int:
    """Says the newest live row once per new batch of rows."""
    rows = read_rows(live)
    if len(rows) <= said:
        return said
    run, _ = get_link(ctx.run_id, ctx.n)
    row = rows[-1]
    loss = f" loss {row['loss']:.4f}" if isinstance(row.get("loss"), (int, float)) else ""
    val = f" val {row['val_loss']:.4f}" if isinstance(row.get("val_loss"), (int, float)) else ""
    speed = f" {row['tok_s']:,.0f} tok/s" if isinstance(row.get("tok_s"), (int, float)) else ""
    if ctx.progress:
        ctx.say(f"link {ctx.n}: step {row['step']:,}/{run.cfg.steps_until:,}{loss}{val}{speed} (live, from the "
                f"box's metrics.jsonl)")
    return len(rows)


def read_rows(live: Path) -> list[dict]:
    rows = []
    try:
        lines = live.read_text(encoding="utf-8").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def ask_to_stop(ctx: BoxLink, reason: str) -> list[str]:
    """Asks the session on every host to save a checkpoint and stop, once per link; returns the
    hosts that could not be reached (they are asked again at the next look)."""
    _, link = get_link(ctx.run_id, ctx.n)
    if BoxLinkRecord.of(link).stop_sent:
        return []
    missed = []
    for i, host in enumerate(BoxLinkRecord.of(link).hosts or []):
        try:
            remote(ctx.box, i, "stop", host["link"], reason)
        except (SshError, UserError):
            missed.append(host["host"])
    if not missed:
        BoxLinkRecord.update(ctx.run_id, ctx.n, stop_sent=True)
        ctx.say(f"link {ctx.n}: asked {ctx.box.where} to save a checkpoint and stop")
    return missed


def _q(text: str) -> str:
    return shlex.quote(text)
