"""Measured speeds and calibration: the lab's runs' tokens/s (read incrementally from
runs/<id>/metrics.jsonl) and the speed figure they calibrate, or the guide's reference
scaled by FLOPs per token when there are none."""
from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from lab.config import RunConfig, card_set
from lab.corpus.manifests import read_json_cached, stat_key
from lab.home import accounts_dir, machines_dir, runs_dir
from lab.sizing.cards import CARDS, REFERENCE, Card, flops_per_token, rate_known, reference_tok_s
from lab.sizing.figures import Figure
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
            self.segment_start = None
        self.session = session
        if isinstance(elapsed, (int, float)):
            self.last_elapsed = float(elapsed)
        if self.segment_start is None:
            self.segment_start = step
        if step - self.segment_start >= WARMUP_STEPS and tok_s > 0:
            self.values.append(tok_s)

    def median(self) -> float | None:
        if len(self.values) < MIN_SPEED_SAMPLES:
            return None
        if self.cached_median is None:
            self.cached_median = _median(self.values)
        return self.cached_median


def _median(values: Iterable[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(frozen=True)
class Measured:
    """One of the lab's runs with a steady tokens/s."""
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

    def size_key(self) -> tuple:
        return (self.context, self.width, self.heads, self.layers, self.vocab, self.batch_per_card)

    def flops_per_token(self) -> float:
        return flops_per_token(self.layers, self.width, self.vocab, self.context)


_speed_logs: dict[str, _SpeedLog] = {}
_run_infos: dict[str, tuple[tuple, tuple | None]] = {}


def _run_gpu(cfg: dict, device: dict) -> str | None:
    """Which of CARDS a run ran on: device.json (`lab.train.describe_runtime`: device, name,
    cards, world) when there is one, else the config's gpu unless it was "auto"."""
    if device.get("gpu") in CARDS:
        return device["gpu"]
    if device.get("device") == "cpu":
        return "cpu"
    name = str(device.get("name", ""))
    if name:
        card = card_set(name, max(int(device.get("cards") or 1), int(device.get("world") or 1)))
        return card if card in CARDS else None  # None: a card the calculator has no figures for
    return cfg.get("gpu") if cfg.get("gpu") in CARDS else None


def _run_vocab(cfg: dict, device: dict) -> int:
    """A run's vocab: its config or device.json if they say (RunConfig has no vocab field),
    else its data's manifest, else the default."""
    vocab = cfg.get("vocab") or device.get("vocab")
    if isinstance(vocab, int):
        return vocab
    run_cfg = RunConfig(data_dir=str(cfg.get("data_dir") or ""),
                        constellations=[str(c) for c in cfg.get("constellations") or []])
    return resolve_vocab(None, find_manifest(run_cfg), None)[0]


def _run_info(folder: str) -> tuple | None:
    """(gpu, precision, context, width, heads, layers, vocab, batch_per_card) of a run
    folder, worked out once per change of its config.json or device.json."""
    cfg_path, dev_path = os.path.join(folder, "config.json"), os.path.join(folder, "device.json")
    key = (stat_key(cfg_path), stat_key(dev_path))
    hit = _run_infos.get(folder)
    if hit and hit[0] == key:
        return hit[1]
    cfg, device = read_json_cached(Path(cfg_path)), read_json_cached(Path(dev_path))
    info = None
    try:
        if isinstance(cfg, dict):
            device = device if isinstance(device, dict) else {}
            gpu = _run_gpu(cfg, device)
            precision = device.get("precision") or cfg.get("precision") or "auto"
            if gpu is not None:
                info = (gpu, CARDS[gpu].precision if precision == "auto" else precision,
                        *(int(cfg.get(k, REFERENCE[k])) for k in ("context", "width", "heads", "layers")),
                        _run_vocab(cfg, device), int(cfg.get("batch_per_card", REFERENCE["batch_per_card"])))
    except (TypeError, ValueError, AttributeError):
        info = None  # a run folder with odd files is left out, not an error
    _run_infos[folder] = (key, info)
    return info


def measured_runs(gpu: str | None = None, root: Path | None = None) -> list[Measured]:
    """The lab's runs in `root` (default `$LAB_HOME/runs`, each account's probe burst, `lab
    probe`, and each box's check burst, `lab machines check`), on `gpu` or all, whose metrics give
    a steady speed."""
    folders = _scan(runs_dir() if root is None else root)
    if root is None:  # a probe's burst is a run folder too (lab.probe.record), and so is a box check's
        folders += [(f"probe:{name}", os.path.join(path, "probe")) for name, path in _scan(accounts_dir())
                    if os.path.isdir(os.path.join(path, "probe"))]
        folders += [(f"check:{name}", os.path.join(path, "check")) for name, path in _scan(machines_dir())
                    if os.path.isdir(os.path.join(path, "check"))]
    out = []
    for name, folder in folders:
        info = _run_info(folder)
        if info is None or (gpu is not None and info[0] != gpu):
            continue  # read metrics only for runs that can matter
        log = _speed_logs.setdefault(folder, _SpeedLog())
        log.update(os.path.join(folder, "metrics.jsonl"))
        tok_s = log.median()
        if tok_s is not None:
            out.append(Measured(name, *info, tok_s))
    return out


def _scan(root: Path) -> list[tuple[str, str]]:
    try:
        return [(e.name, e.path) for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []


def speed_figure(card: Card, cfg: RunConfig, vocab: int, precision: str, runs: list[Measured]) -> Figure:
    """tokens/s: the measurement at this size when there is one, else a FLOP rate (tokens/s
    × FLOPs per token) carried over from measured sizes, divided by this size's FLOPs."""
    flops = flops_per_token(cfg.layers, cfg.width, vocab, cfg.context)
    key = (cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card)
    own = [r for r in runs if r.gpu == card.name and r.precision == precision]
    if own:
        same = [r for r in own if r.size_key() == key]
        if same:
            names = ", ".join(sorted(r.run for r in same))
            return Figure(round(_median(r.tok_s for r in same)), "measured", "tokens/s",
                          f"median of the lab's runs at this size on {card.name}: {names}",
                          f"медиана прогонов лабы этого размера на {card.name}: {names}")
        rate, used = _interpolated_rate(own, flops)
        return Figure(round(rate / flops), "calibrated", "tokens/s",
                      f"scaled by FLOPs per token from the lab's runs on {card.name}: {used}",
                      f"пересчитано по FLOPs на токен от прогонов лабы на {card.name}: {used}")
    ref = REFERENCE
    ref_flops = flops_per_token(ref["layers"], ref["width"], ref["vocab"], ref["context"])
    tok_s = reference_tok_s(card, precision) * ref_flops / flops
    at_ref = key == tuple(ref[k] for k in ("context", "width", "heads", "layers", "vocab", "batch_per_card"))
    if card.ref_measured and at_ref and precision == card.precision:
        return Figure(round(tok_s), "measured", "tokens/s", f"the guide's measurement on {card.name}",
                      f"замер из гайда на {card.name}")
    basis = "the guide's measurement" if card.ref_measured else "the lab's rough guess"
    basis_ru = "замера из гайда" if card.ref_measured else "грубой прикидки лабы"
    other = not rate_known(card, precision)  # not corrected for: measure a short run instead
    return Figure(round(tok_s), "estimate", "tokens/s",
                  f"scaled by FLOPs per token (6·N + 12·layers·n·d) from {basis} on {card.name} at the reference size"
                  + (f", in {card.precision}: {precision} will be slower" if other else ""),
                  f"пересчитано по FLOPs на токен (6·N + 12·слои·n·d) от {basis_ru} на {card.name} "
                  f"для эталонного размера" + (f", в {card.precision}: {precision} будет медленнее" if other else ""))


def _interpolated_rate(runs: list[Measured], flops: float) -> tuple[float, str]:
    """FLOP rate at `flops`: interpolated in log-log between the nearest measured sizes
    below and above, or the nearest one's rate outside their range. Small models reach a
    lower rate than big ones, so this beats a single reference."""
    by_size: dict[float, list[Measured]] = {}
    for r in runs:
        by_size.setdefault(r.flops_per_token(), []).append(r)
    points = sorted((f, _median(r.tok_s * f for r in rs), rs) for f, rs in by_size.items())
    below = [p for p in points if p[0] <= flops]
    above = [p for p in points if p[0] >= flops]
    if below and above and below[-1][0] != above[0][0]:
        (f0, r0, rs0), (f1, r1, rs1) = below[-1], above[0]
        w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
        rate, used = math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0))), rs0 + rs1
    else:
        f, rate, used = min(points, key=lambda p: abs(math.log(p[0] / flops)))
    return rate, ", ".join(sorted({r.run for r in used}))


