"""What each Kaggle session of an account measured, kept per account, and the margin the next push
asks from it: read by the Kaggle machine (the push's margin), `lab accounts`, the machines panel and
the calculator (a session's costs), written when a link ends (`lab.machines.kaggle.session.measure`).

`$LAB_HOME/accounts/<name>/sessions.jsonl` holds one row per link:

    boot_s          from the push to the notebook's first cell (the queue, the machine, the mounts)
    data_checks_s   from the first cell to the inputs checked (imports, the cards, the sha256 of the inputs)
    compile_s       the model's compile
    first_step_s    from the loop's clock start to the first steps synced
    final_save_s    the last checkpoint save (the unsaved result of a failed save has none)
    overrun_s       how far past its own limit the notebook ran (a link stopped by its time limit)
    output_copy_s   from the notebook's end until Kaggle reported the session ended
    ended           the status, whether outputs came back, whether it was cut off, how long it ran

The next push on that account asks for its link's limit plus a margin sized from the medians of
the account's last sessions (boot, overrun, output copy, and two minutes to spare), never below
`KAGGLE_MARGIN_FLOOR_MIN`. `session_overheads(account)` gives those medians to the calculator's
speed model. Stdlib only; no call to Kaggle.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from lab.kaggle.limits import KAGGLE_MARGIN_FLOOR_MIN
from lab.home import accounts_dir

SESSIONS_FILE = "sessions.jsonl"
KEEP = 20  # the medians are of the account's last 20 sessions
SPARE_S = 120.0  # on top of the measured boot, overrun and output copy
OVERHEADS = ("boot_s", "data_checks_s", "compile_s", "first_step_s", "final_save_s", "overrun_s", "output_copy_s")


def _sessions_path(account: str) -> Path:
    return accounts_dir() / account / SESSIONS_FILE


def record_session(account: str, run_id: str, n: int, at: str | None, measured: dict) -> None:
    """Keeps link `n`'s measurements in the account's sessions file, once per link."""
    entry = {"run": run_id, "link": n, "at": at, **measured}
    rows = [r for r in sessions_seen(account) if (r.get("run"), r.get("link")) != (run_id, n)] + [entry]
    path = _sessions_path(account)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows[-200:]), encoding="utf-8")
    tmp.replace(path)


def sessions_seen(account: str) -> list[dict]:
    """The account's recorded sessions, oldest first."""
    try:
        lines = _sessions_path(account).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def session_overheads(account: str) -> dict | None:
    """{"sessions", "boot_s", "data_checks_s", "compile_s", "first_step_s", "final_save_s",
    "overrun_s", "output_copy_s", "margin_min"}: the medians of the account's last sessions (a
    figure None where none measured it); None when no session of the account was measured. The
    calculator's speed model takes boot and output copy from here."""
    rows = sessions_seen(account)[-KEEP:]
    if not rows:
        return None
    out: dict = {"sessions": len(rows)}
    for name in OVERHEADS:
        values = [float(r[name]) for r in rows if isinstance(r.get(name), (int, float))]
        out[name] = round(statistics.median(values), 3) if values else None
    spent = sum(max(0.0, out[name] or 0.0) for name in ("boot_s", "overrun_s", "output_copy_s"))
    out["margin_min"] = round(max(KAGGLE_MARGIN_FLOOR_MIN, (spent + SPARE_S) / 60), 1)
    return out


def push_margin_min(account: str) -> float:
    """The minutes the next push on the account asks beyond its link's limit: from the measured
    sessions, never below the floor."""
    seen = session_overheads(account)
    return seen["margin_min"] if seen else KAGGLE_MARGIN_FLOOR_MIN


def last_cut_off(account: str) -> dict | None:
    """The account's latest session that Kaggle ended before the notebook did, if any."""
    cut = [r for r in sessions_seen(account) if (r.get("ended") or {}).get("cut_off")]
    return cut[-1] if cut else None


def _short(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if abs(seconds) < 90 else f"{seconds / 60:.1f} min"


def seen_line(account: str) -> str | None:
    """One line for `lab accounts`: what the account's sessions measured, and the latest cut-off."""
    seen = session_overheads(account)
    if seen is None:
        return None
    figures = ", ".join(f"{label} {_short(seen[name])}" for label, name in (
        ("boot", "boot_s"), ("data checks", "data_checks_s"), ("compile", "compile_s"),
        ("first step", "first_step_s"), ("final save", "final_save_s"), ("output copy", "output_copy_s")))
    line = (f"{account}: {seen['sessions']} session(s) measured (medians): {figures}; the next push asks "
            f"{seen['margin_min']:g} min beyond its limit")
    cut = last_cut_off(account)
    if cut:
        ended = cut["ended"]
        line += (f"; cut off by Kaggle {str(cut.get('at') or '?')[:10]}: {ended.get('status')}, outputs "
                 f"{'kept' if ended.get('outputs') else 'lost'}")
    return line
