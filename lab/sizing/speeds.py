"""Measured speeds: the tokens/s of every run folder the lab has (its runs, the probes'
bursts), read incrementally from metrics.jsonl, with the size and card each ran at. The speed
model (`lab.sizing.speedmodel`) fits itself to them."""
from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from lab.config import RunConfig, card_set
from lab.corpus.manifests import read_json_cached, stat_key
from lab.home import accounts_dir, machines_dir, runs_dir
from lab.sizing.cards import REFERENCE, card_for, flops_per_token
from lab.sizing.inputs import find_manifest, resolve_vocab

WARMUP_STEPS = 20  # steps at a session's start that compile kernels and fill caches
SPEED_SAMPLES = 1000  # the median is over the most recent steps: the current code's speed
TAIL_BYTES = 64 * 1024  # a first read takes only the end of a long log (~350 steps)
MIN_SPEED_SAMPLES = 5


class _SpeedLog:
    """tok_s values of one metrics.jsonl, read incrementally: a live run appends a line
    per step, and re-reading megabytes on every keystroke would be too slow.

    Only the latest session counts: a continued run's folder starts with the earlier
    sessions' rows, which may come from another card (device.json describes this one)."""

    def __init__(self) -> None:
        self.ino: int | None = None
        self.offset = 0
        self.values: deque = deque(maxlen=SPEED_SAMPLES)
        self.others: deque = deque(maxlen=SPEED_SAMPLES)  # others_cpu beside each value (CPU runs)
        self.session: Any = None
        self.last_elapsed: float | None = None
        self.segment_start: int | None = None  # first step of the current session
        self.cached_median: float | None = None

    def update(self, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        tail_read = False
        if st.st_ino != self.ino or st.st_size < self.offset:  # new, replaced or truncated
            self.__init__()
            self.ino = st.st_ino
            if st.st_size > TAIL_BYTES:
                self.offset, tail_read = st.st_size - TAIL_BYTES, True
                # Mid-session: no warm-up to skip until the next session starts.
                self.segment_start = -WARMUP_STEPS
        if st.st_size == self.offset:
            return
        with open(path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(st.st_size - self.offset)
        if tail_read:
            cut = chunk.find(b"\n") + 1  # the first line of a tail read is cut
            chunk, self.offset = chunk[cut:], self.offset + cut
        end = chunk.rfind(b"\n") + 1  # a line being written is read next time
        for line in chunk[:end].splitlines():
            self._add(line)
        self.offset += end
        self.cached_median = None

    def _add(self, line: bytes) -> None:
        try:
            rec = json.loads(line)
            tok_s, step = float(rec["tok_s"]), int(rec["step"])
        except (ValueError, KeyError, TypeError):
            return
        # A new session: the `session` number changes (or, in logs without it, the clock restarts).
        session, elapsed = rec.get("session"), rec.get("elapsed_s")
        restarted = isinstance(elapsed, (int, float)) and self.last_elapsed is not None and elapsed < self.last_elapsed
        if (session is not None and session != self.session and self.session is not None) or restarted:
            self.values.clear()
            self.others.clear()
            self.segment_start = None
        self.session = session
        if isinstance(elapsed, (int, float)):
            self.last_elapsed = float(elapsed)
        if self.segment_start is None:
            self.segment_start = step
        if step - self.segment_start >= WARMUP_STEPS and tok_s > 0:
            self.values.append(tok_s)
            others = rec.get("others_cpu")
            if isinstance(others, (int, float)):
                self.others.append(float(others))

    def median(self) -> float | None:
        if len(self.values) < MIN_SPEED_SAMPLES:
            return None
        if self.cached_median is None:
            self.cached_median = median(self.values)
        return self.cached_median

    def steady(self) -> "Steady | None":
        tok_s = self.median()
        if tok_s is None:
            return None
        # Rows of one sync window repeat its rate: the spread is over the distinct windows.
        rates = sorted(set(self.values))
        lo, hi = rates[len(rates) // 10], rates[-1 - len(rates) // 10]
        return Steady(tok_s, (hi - lo) / 2 / tok_s, median(self.others) if self.others else None)


@dataclass(frozen=True)
class Steady:
    """A run's steady speed: the median tokens/s after the warm-up, how far its sync windows
    moved around it (half the 10th-90th percentile range over the median), and how much of the
    machine other work used meanwhile (the median `others_cpu`; None: not recorded)."""
    tok_s: float
    spread: float
    others_cpu: float | None


def median(values: Iterable[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(frozen=True)
class Measured:
    """One of the lab's runs (or a probe's burst) with a steady tokens/s."""
    run: str
    gpu: str
    precision: str
    context: int
    width: int
    heads: int
    layers: int
    vocab: int
    batch_per_card: int
    tok_s: float
    grad_accum: int = 1
    compiled: bool | None = None  # from the session's result.json; None: not known (yet)
    threads: int | None = None  # a CPU run's torch threads (device.json); None: not recorded
    spread: float = 0.0  # Steady.spread: how much the run's own speed moved
    others_cpu: float | None = None  # Steady.others_cpu: the share of the cores other work used

    def size_key(self) -> tuple:
        return (self.context, self.width, self.heads, self.layers, self.vocab, self.batch_per_card, self.grad_accum)

    def flops_per_token(self) -> float:
        return flops_per_token(self.layers, self.width, self.vocab, self.context)


_speed_logs: dict[str, _SpeedLog] = {}
_run_infos: dict[str, tuple[tuple, dict | None]] = {}


def _run_gpu(cfg: dict, device: dict) -> str | None:
    """Which card the calculator knows (`card_for`) a run ran on: device.json
    (`lab.kernel.runtime.describe_runtime`: device, name, cards, world) when there is one, else the
    config's gpu unless it was "auto"."""
    if card_for(device.get("gpu")) is not None:
        return device["gpu"]
    if device.get("device") == "cpu":
        return "cpu"
    name = str(device.get("name", ""))
    if name:
        card = card_set(name, max(int(device.get("cards") or 1), int(device.get("world") or 1)))
        return card if card_for(card) is not None else None  # None: a card the calculator has no figures for
    return cfg.get("gpu") if card_for(cfg.get("gpu")) is not None else None


def _run_vocab(cfg: dict, device: dict) -> int:
    """A run's vocab: its config or device.json if they say (RunConfig has no vocab field),
    else its data's manifest, else the default."""
    vocab = cfg.get("vocab") or device.get("vocab")
    if isinstance(vocab, int):
        return vocab
    run_cfg = RunConfig(data_dir=str(cfg.get("data_dir") or ""),
                        constellations=[str(c) for c in cfg.get("constellations") or []])
    return resolve_vocab(None, find_manifest(run_cfg), None)[0]


def _compiled(result: Any) -> bool | None:
    """Whether the session trained compiled, from its result.json (`compile_s`)."""
    if not isinstance(result, dict) or "compile_s" not in result:
        return None
    return result["compile_s"] is not None


def run_info(folder: str) -> dict | None:
    """What a run folder says about its size and card (Measured's fields but the speed),
    worked out once per change of its config.json, device.json or result.json."""
    paths = [os.path.join(folder, f) for f in ("config.json", "device.json", "result.json")]
    key = tuple(stat_key(p) for p in paths)
    hit = _run_infos.get(folder)
    if hit and hit[0] == key:
        return hit[1]
    cfg, device, result = (read_json_cached(Path(p)) for p in paths)
    info = None
    try:
        if isinstance(cfg, dict):
            device = device if isinstance(device, dict) else {}
            gpu = _run_gpu(cfg, device)
            precision = device.get("precision") or cfg.get("precision") or "auto"
            if gpu is not None:
                info = {"gpu": gpu, "precision": card_for(gpu).precision if precision == "auto" else precision,
                        **{k: int(cfg.get(k, REFERENCE[k])) for k in ("context", "width", "heads", "layers",
                                                                      "batch_per_card")},
                        "vocab": _run_vocab(cfg, device), "grad_accum": int(cfg.get("grad_accum") or 1),
                        "compiled": _compiled(result),
                        "threads": int(device["threads"]) if isinstance(device.get("threads"), int) else None}
    except (TypeError, ValueError, AttributeError):
        info = None  # a run folder with odd files is left out, not an error
    _run_infos[folder] = (key, info)
    return info


def lab_runs() -> list[tuple[str, str]]:
    """The lab's runs: (run id, folder)."""
    return _scan(runs_dir())


def probe_bursts() -> list[tuple[str, str]]:
    """Each account's `lab probe` burst, a run folder (lab.kaggle.probed): ("probe:NAME", folder)."""
    return [(f"probe:{name}", os.path.join(path, "probe")) for name, path in _scan(accounts_dir())
            if os.path.isdir(os.path.join(path, "probe"))]


def box_checks() -> list[tuple[str, str]]:
    """Each box's `lab machines check` burst, a run folder too: ("check:NAME", folder)."""
    return [(f"check:{name}", os.path.join(path, "check")) for name, path in _scan(machines_dir())
            if os.path.isdir(os.path.join(path, "check"))]


# Where measurements come from: each source lists (name, run folder) pairs, the folder holding
# config.json, device.json and metrics.jsonl as `lab train` writes them. Another kind of burst
# is one more function here.
SOURCES: list[Callable[[], list[tuple[str, str]]]] = [lab_runs, probe_bursts, box_checks]


def measured_runs(gpu: str | None = None, root: Path | None = None) -> list[Measured]:
    """Every measurement the lab has (SOURCES; or only the run folders in `root`), on `gpu` or
    all, whose metrics give a steady speed."""
    folders = _scan(root) if root is not None else [f for source in SOURCES for f in source()]
    out = []
    for name, folder in folders:
        info = run_info(folder)
        if info is None or (gpu is not None and info["gpu"] != gpu):
            continue  # read metrics only for runs that can matter
        got = steady(folder)
        if got is not None:
            out.append(Measured(name, tok_s=got.tok_s, spread=got.spread, others_cpu=got.others_cpu, **info))
    return out


def steady(folder: str) -> Steady | None:
    """A run folder's latest session's steady speed after its warm-up (None: too few steps yet)."""
    log = _speed_logs.setdefault(folder, _SpeedLog())
    log.update(os.path.join(folder, "metrics.jsonl"))
    return log.steady()


def steady_tok_s(folder: str) -> float | None:
    """The median tokens/s of a run folder's latest session after its warm-up (None: too few
    steps yet)."""
    got = steady(folder)
    return got.tok_s if got else None


def _scan(root: Path) -> list[tuple[str, str]]:
    try:
        return [(e.name, e.path) for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []
