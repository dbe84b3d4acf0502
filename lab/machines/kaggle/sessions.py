"""What a Kaggle link's session measured, read off its outputs' timestamps and what the watch saw;
kept per account by `lab.kaggle.sessions` (which also gives the margin the next push asks).

The notebook writes `timeline.json` (its first cell, the cards and inputs checked, its end) and
`result.json` (the compile, the first step, the final save) into its outputs; the control side
saw the push, the first RUNNING and the end.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from lab.kernel.preflight import TIMELINE  # the session writes it into its outputs
from lab.machines.kaggle.record import KaggleLinkRecord
from lab.machines.lifecycle import Away
from lab.runs import Link


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except (TypeError, ValueError):
        return None


def _read_json(path: Path) -> dict:
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def _span(start: float | None, end: float | None) -> float | None:
    return round(end - start, 3) if start is not None and end is not None else None


def measure(link: Link, folder: Path) -> dict:
    """What the link's session measured: its outputs' timestamps and what the watch saw."""
    d, away, marks = KaggleLinkRecord.of(link), Away.of(link), _read_json(folder / TIMELINE)
    output = away.output or {}
    result = output.get("result") or {}
    first, ended = marks.get("first_cell"), marks.get("ended")
    pushed, ended_seen = _epoch(d.kernel.pushed_at), _epoch(d.status_at)
    started = first if first is not None else _epoch(d.running_at)
    stopped_by_limit = result.get("reason") == "time limit" and not result.get("failed")
    ended_by_itself = bool(result) or any(output.get(k) for k in ("input_not_ready", "no_gpu"))
    came_back = any((folder / name).is_file() for name in ("metrics.jsonl", "result.json"))
    ran = started is not None or d.ran
    return {
        "boot_s": _span(pushed, first),
        "data_checks_s": _span(first, marks.get("inputs_checked")),
        "compile_s": result.get("compile_s"),
        "first_step_s": result.get("first_step_s"),
        "final_save_s": result.get("save_s"),
        "overrun_s": _span(first + link.limit_min * 60, ended) if stopped_by_limit and first and link.limit_min
        else None,
        "output_copy_s": _span(ended, ended_seen),
        "ended": {"status": d.kaggle_status, "failure": d.failure or "",
                  "outputs": came_back, "cut_off": ran and not ended_by_itself
                  and d.kaggle_status != "COMPLETE" and not away.stop_sent,
                  "ran_s": _span(started, ended_seen), "timeout_s": d.session_timeout_s},
    }
